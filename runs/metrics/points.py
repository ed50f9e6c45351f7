"""Reading a run's points back: its keys, and every point as CSV (streamed)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db.models import Max, Min

from runs.models import MetricPoint, MetricSummary


def series_keys(*, run_id: int) -> list[str]:
    return list(
        MetricSummary.objects.filter(run_id=run_id).order_by("key").values_list("key", flat=True)
    )


def points_csv_rows(*, run_id: int, key: str | None) -> Iterator[str]:
    """Every point of a run (or of one key) as CSV lines, streamed."""
    yield "key,step,value,time\n"
    rows = MetricPoint.objects.filter(run_id=run_id)
    if key:
        rows = rows.filter(key=key)
    for k, step, value, at in (
        rows.order_by("key", "step").values_list("key", "step", "value", "time").iterator(10_000)
    ):
        yield f"{k},{step},{value!r},{at.isoformat()}\n"


def step_range(*, run_id: int, key: str) -> dict[str, Any]:
    return MetricPoint.objects.filter(run_id=run_id, key=key).aggregate(
        first=Min("step"), last=Max("step")
    )
