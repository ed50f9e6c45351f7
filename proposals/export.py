"""Proposals as CSV and JSON rows with stable columns, streamed: the export of any search.

The columns below are a contract (a leaderboard may be built on them): new columns are
added at the end, none is renamed or removed. Timestamps are ISO 8601 in UTC; an empty
value is an empty CSV cell and ``null`` in JSON; labels are ';'-separated in CSV and a list
in JSON. Text cells that a spreadsheet would read as a formula (starting with = + - @, a
tab or a carriage return) are written with a leading apostrophe in CSV; numbers are
written as numbers.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from itertools import islice
from typing import Any

from django.db.models import Count, Max, Min, Q, QuerySet
from django.http import HttpRequest, StreamingHttpResponse
from django.urls import reverse
from rest_framework.renderers import BaseRenderer

from proposals.models import Proposal
from proposals.search import ARCHIVE_RUN_STATES
from runs.metrics import display
from runs.metrics.declarations import MetricDeclaration
from runs.models import MetricSummary, Run, RunState

COLUMNS: list[tuple[str, str]] = [
    ("id", "the proposal's number"),
    ("url", "its permanent page, /proposals/<id>/"),
    ("api_url", "its API resource, /api/v1/proposals/<id>/"),
    ("title", "title"),
    ("summary", "one-line summary"),
    ("state", "its state, as the search's state: field names it (listed above)"),
    ("outcome", "its outcome, as the search's outcome: field names it (listed above), or empty"),
    ("confidence", "exploratory, replicated, stable, or empty"),
    ("recipe", "recipe name"),
    ("recipe_version", "recipe version"),
    ("labels", "label names"),
    ("author", "author's username"),
    ("created_at", "when it was created"),
    ("submitted_at", "when it was last submitted"),
    ("decided_at", "when it was approved or rejected"),
    ("concluded_at", "when its outcome was recorded"),
    ("budget", "budget in accelerator-hours"),
    ("planned_accelerator_hours", "accelerator-hours of the frozen plan"),
    ("success_metric", "the metric the hypothesis is judged on"),
    ("success_direction", "lower or higher (is better)"),
    ("success_threshold", "the smallest improvement that counts"),
    ("best_value", "best last value of success_metric over the proposal's runs, as logged"),
    ("runs_total", "runs of the plan (reruns included)"),
    ("runs_finished", "runs that finished"),
    ("runs_failed", "runs that failed or crashed"),
    ("github_issue", "number of the linked GitHub issue"),
    ("best_value_text", "best_value as the pages write it, in the recipe's declared unit"),
]
COLUMN_NAMES = [name for name, _ in COLUMNS]
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
CHUNK = 1000


VALUES = (
    "id",
    "title",
    "summary",
    "state",
    "outcome",
    "confidence",
    "created_at",
    "submitted_at",
    "decided_at",
    "concluded_at",
    "budget_accelerator_hours",
    "success_metric",
    "success_direction",
    "success_threshold",
    "github_issue_number",
    "plan_id",
    "author__username",
    "recipe__name",
    "recipe__version",
    "plan__total_accelerator_hours",
)


def export_queryset(queryset: QuerySet[Proposal] | None = None) -> QuerySet[Proposal, Any]:
    """Plain values, not model instances (ten times cheaper per row), in the order of
    ``queryset``. ``export_rows`` adds labels, run counts and best values a chunk at a time:
    correlated subqueries for them made PostgreSQL compile the query (JIT) for seconds."""
    queryset = Proposal.objects.order_by("-created_at", "-id") if queryset is None else queryset
    return queryset.prefetch_related(None).values(*VALUES)


class _Chunk:
    """What the rows of one chunk need from other tables: four queries."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.labels: dict[int, list[str]] = defaultdict(list)
        links = Proposal.labels.through.objects.filter(proposal_id__in=[r["id"] for r in rows])
        for proposal_id, name in links.order_by("label__name").values_list(
            "proposal_id", "label__name"
        ):
            self.labels[proposal_id].append(name)
        plan_ids = {r["plan_id"] for r in rows if r["plan_id"] is not None}
        self.runs: dict[int, dict[str, int]] = {}
        self.best: dict[tuple[int, str], tuple[float, float]] = {}
        self.declared: dict[tuple[str, str], dict[str, MetricDeclaration]] = {}
        if not plan_ids:
            return
        counts = (
            Run.objects.filter(plan_id__in=plan_ids)
            .order_by()
            .values("plan_id")
            .annotate(
                total=Count("pk"),
                finished=Count("pk", filter=Q(state=RunState.FINISHED)),
                failed=Count("pk", filter=Q(state__in=ARCHIVE_RUN_STATES)),
            )
        )
        self.runs = {c["plan_id"]: c for c in counts}
        metrics = {r["success_metric"] for r in rows if r["success_metric"]}
        summaries = (
            MetricSummary.objects.filter(run__plan_id__in=plan_ids, key__in=metrics)
            .order_by()
            .values_list("run__plan_id", "key")
            .annotate(lowest=Min("last"), highest=Max("last"))
        )
        self.best = {(plan, key): (lo, hi) for plan, key, lo, hi in summaries}
        self.declared = display.recipe_declarations(
            (r["recipe__name"], r["recipe__version"]) for r in rows if r["plan_id"] is not None
        )

    def best_value(self, row: dict[str, Any]) -> float | None:
        found = self.best.get((row["plan_id"], row["success_metric"]))
        if not found:
            return None
        return found[1] if row["success_direction"] == "higher" else found[0]

    def best_value_text(self, row: dict[str, Any], value: float | None) -> str | None:
        """``value`` as every page writes the success metric (``runs.metrics.display``)."""
        if value is None or not row["success_metric"]:
            return None
        declared = self.declared.get((row["recipe__name"], row["recipe__version"]), {})
        metric = row["success_metric"]
        return display.MetricDisplay.of(metric, declared.get(metric)).text(value)


def _not_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def _time(value: dt.datetime | None) -> str | None:
    return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z") if value else None


def _path_format(view_name: str) -> str:
    """The view's path with "{}" for the pk: one reverse() per export, not two per row."""
    sentinel = 918273645
    return reverse(view_name, kwargs={"pk": sentinel}).replace(str(sentinel), "{}")


def export_rows(values: Iterable[dict[str, Any]], *, base_url: str) -> Iterator[dict[str, Any]]:
    """One dict per row of ``export_queryset``, keys in COLUMN_NAMES order; four queries
    for each chunk of rows. ``base_url``: scheme and host."""
    page_url = base_url + _path_format("proposals:detail")
    api_url = base_url + _path_format("proposal-detail")
    rows = iter(values)
    while chunk := list(islice(rows, CHUNK)):
        related = _Chunk(chunk)
        for v in chunk:
            runs = related.runs.get(v["plan_id"], {})
            best = related.best_value(v)
            yield {
                "id": v["id"],
                "url": page_url.format(v["id"]),
                "api_url": api_url.format(v["id"]),
                "title": v["title"],
                "summary": v["summary"],
                "state": v["state"],
                "outcome": v["outcome"] or None,
                "confidence": v["confidence"] or None,
                "recipe": v["recipe__name"],
                "recipe_version": v["recipe__version"],
                "labels": related.labels.get(v["id"], []),
                "author": v["author__username"],
                "created_at": _time(v["created_at"]),
                "submitted_at": _time(v["submitted_at"]),
                "decided_at": _time(v["decided_at"]),
                "concluded_at": _time(v["concluded_at"]),
                "budget": v["budget_accelerator_hours"],
                "planned_accelerator_hours": v["plan__total_accelerator_hours"],
                "success_metric": v["success_metric"] or None,
                "success_direction": v["success_direction"],
                "success_threshold": v["success_threshold"],
                "best_value": best,
                "runs_total": runs.get("total", 0),
                "runs_finished": runs.get("finished", 0),
                "runs_failed": runs.get("failed", 0),
                "github_issue": v["github_issue_number"],
                "best_value_text": related.best_value_text(v, best),
            }


def csv_cell(value: Any) -> Any:
    """A value as a CSV cell; text a spreadsheet would run as a formula gets a quote first."""
    if value is None:
        return ""
    if isinstance(value, list):
        value = ";".join(value)
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


class _Line:
    def write(self, value: str) -> str:
        return value


def csv_stream(rows: Iterable[dict[str, Any]]) -> Iterator[str]:
    writer = csv.writer(_Line())
    yield writer.writerow(COLUMN_NAMES)
    for row in rows:
        yield writer.writerow([csv_cell(row[name]) for name in COLUMN_NAMES])


def json_stream(rows: Iterable[dict[str, Any]], *, query: str) -> Iterator[str]:
    """``{"query": ..., "columns": [...], "results": [...]}``, one row at a time."""
    yield '{"query": ' + json.dumps(query) + ', "columns": ' + json.dumps(COLUMN_NAMES)
    yield ', "results": ['
    for index, row in enumerate(rows):
        finite = {k: None if _not_finite(v) else v for k, v in row.items()}
        yield ("," if index else "") + "\n" + json.dumps(finite, allow_nan=False)
    yield "\n]}\n"


def export_response(
    request: HttpRequest, queryset: QuerySet[Proposal], *, fmt: str, query: str
) -> StreamingHttpResponse:
    """A streamed download of every row of ``queryset`` (already filtered and ordered)."""
    base_url = request.build_absolute_uri("/").rstrip("/")
    rows = export_rows(export_queryset(queryset).iterator(chunk_size=CHUNK), base_url=base_url)
    if fmt == "csv":
        response = StreamingHttpResponse(csv_stream(rows), content_type="text/csv; charset=utf-8")
    else:
        response = StreamingHttpResponse(
            json_stream(rows, query=query), content_type="application/json"
        )
    response["Content-Disposition"] = f'attachment; filename="proposals.{fmt}"'
    response["X-Content-Type-Options"] = "nosniff"
    return response


class CSVRenderer(BaseRenderer):
    """Lets DRF content negotiation accept ``?format=csv``. The search endpoint streams its
    own body; anything else rendered this way (a dict, or a list of dicts) becomes rows."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        rows = data if isinstance(data, list) else [data] if isinstance(data, dict) else []
        names = list(rows[0]) if rows else []
        writer = csv.writer(_Line())
        lines = [writer.writerow(names)] if names else []
        lines += [writer.writerow([csv_cell(row.get(n)) for n in names]) for row in rows]
        return "".join(lines).encode()
