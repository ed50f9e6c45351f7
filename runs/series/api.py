"""Chart series: public reads of the downsampled rollup (``runs.series.charts``), for a
plan's runs or for runs from any plans (the compare page)."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import (
    NotFound,
    ValidationError,
)
from rest_framework.request import Request
from rest_framework.views import APIView

from runs.api_shapes import (
    ChartDataSerializer,
)
from runs.metrics import parse as metrics_parse
from runs.series import charts


def _series_keys(request: Request) -> list[str] | None:
    text = request.query_params.get("keys", "").strip()
    if not text:
        return None
    keys = list(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    bad = [k for k in keys if not metrics_parse.METRIC_KEY.match(k)]
    if bad:
        raise ValidationError({"keys": [f"not a metric key: {bad[0][:200]!r}"]})
    return keys


def _series_points(request: Request) -> int:
    text = request.query_params.get("points", str(charts.DEFAULT_POINTS))
    try:
        points = int(text)
    except ValueError:
        raise ValidationError({"points": ["must be an integer"]}) from None
    if not 2 <= points <= charts.MAX_POINTS:
        raise ValidationError({"points": [f"must be between 2 and {charts.MAX_POINTS}"]})
    return points


def _series_run_ids(request: Request) -> list[int]:
    parts = [p.strip() for p in request.query_params.get("ids", "").split(",") if p.strip()]
    if not parts:
        raise ValidationError({"ids": ["give run ids, e.g. ?ids=1,2,3"]})
    if not all(p.isdecimal() and 0 < int(p) < 2**63 for p in parts):
        raise ValidationError({"ids": ["run ids are positive integers, separated by commas"]})
    ids = list(dict.fromkeys(int(p) for p in parts))
    if len(ids) > charts.MAX_RUNS:
        raise ValidationError({"ids": [f"at most {charts.MAX_RUNS} runs; got {len(ids)}"]})
    return ids


SERIES_PARAMETERS = [
    OpenApiParameter("keys", str, description="comma-separated metric keys; all when absent"),
    OpenApiParameter(
        "points", int, description=f"at most this many points per series (2-{charts.MAX_POINTS})"
    ),
]


class SeriesView(APIView):
    """Public reads, no session: nothing here depends on who asks."""

    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []


class PlanSeriesView(SeriesView):
    """Chart data of every run of a plan: ``{plan, active, keys, runs, series}``."""

    @extend_schema(parameters=SERIES_PARAMETERS, responses=ChartDataSerializer)
    def get(self, request: Request, plan_id: int) -> HttpResponse:
        body = charts.plan_series(
            plan_id=plan_id, keys=_series_keys(request), points=_series_points(request)
        )
        if body is None:
            raise NotFound("No such plan.")
        return HttpResponse(body, content_type="application/json")


class RunsSeriesView(SeriesView):
    """Chart data of up to 100 runs from any plans (``?ids=1,2,3``), for the compare page."""

    @extend_schema(
        operation_id="v1_runs_series_compare",
        parameters=[OpenApiParameter("ids", str, required=True), *SERIES_PARAMETERS],
        responses=ChartDataSerializer,
    )
    def get(self, request: Request) -> HttpResponse:
        body = charts.runs_series(
            run_ids=_series_run_ids(request),
            keys=_series_keys(request),
            points=_series_points(request),
        )
        return HttpResponse(body, content_type="application/json")
