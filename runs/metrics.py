"""Metrics in and out: validated batch upserts with running summaries, downsampled series,
full-resolution export, and import of a Levanter-style ``tracker_metrics.jsonl``.

Values must be finite numbers. NaN and infinities are refused (400) rather than stored:
JSON has no spelling for them, SQLite cannot keep NaN, and a summary's min or max would be
poisoned by one. A run that diverges says so with its final status (``failed``, with the
step where the loss stopped being finite in the message).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Count, Max, Min
from django.utils import timezone

from marin_site.errors import DomainError
from runs.models import MetricPoint, MetricSummary, Run, RunState

METRIC_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./@:+-]{0,199}$")
MAX_STEP = 2**62
EARLIEST, LATEST = 946_684_800.0, 4_102_444_800.0  # 2000-01-01 .. 2100-01-01, unix seconds


class NotRunning(DomainError):
    status_code = 409


class BatchTooLarge(DomainError):
    status_code = 413


class RateLimited(DomainError):
    status_code = 429

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class ParsedPoint:
    key: str
    step: int
    value: float
    time: datetime


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def points_parse(*, data: Any) -> list[ParsedPoint]:
    """Check a batch body ``{"points": [{key, step, value, time?}, ...]}``."""
    points = data.get("points") if isinstance(data, dict) else None
    if not isinstance(points, list):
        raise ValidationError({"points": ["send a JSON object with a 'points' list"]})
    cap = settings.RUNS_METRICS_MAX_POINTS
    if len(points) > cap:
        raise BatchTooLarge(f"A batch holds at most {cap} points; this one has {len(points)}.")
    now = timezone.now()
    parsed: list[ParsedPoint] = []
    errors: list[str] = []
    for index, point in enumerate(points):
        if not isinstance(point, dict):
            errors.append(f"points[{index}]: must be an object with key, step, value")
            continue
        fields: list[Any] = [point.get(n) for n in ("key", "step", "value", "time")]
        key, step, value, at = fields
        problem = ""
        if not isinstance(key, str) or not METRIC_KEY.match(key):
            problem = "key must be 1-200 characters of letters, digits and _./@:+-"
        elif not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < MAX_STEP:
            problem = "step must be a non-negative integer"
        elif not _is_number(value) or not math.isfinite(value):
            problem = "value must be a finite number (NaN and infinities are refused)"
        elif at is not None and (not _is_number(at) or not EARLIEST <= at <= LATEST):
            problem = "time must be unix seconds between 2000 and 2100"
        if problem:
            errors.append(f"points[{index}]: {problem}")
            continue
        when = datetime.fromtimestamp(float(at), tz=UTC) if at is not None else now
        parsed.append(ParsedPoint(str(key), int(step), float(value), when))
        if len(errors) >= 20:
            break
    if errors:
        raise ValidationError({"points": errors})
    return parsed


def metrics_rate_check(*, run_id: int) -> None:
    """At most RUNS_METRICS_RATE_PER_MINUTE requests a minute per run (a fixed window)."""
    limit = settings.RUNS_METRICS_RATE_PER_MINUTE
    now = timezone.now().timestamp()
    window = int(now // 60)
    key = f"runs:metrics-rate:{run_id}:{window}"
    cache.add(key, 0, timeout=70)
    try:
        count = cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.set(key, 1, timeout=70)
        count = 1
    if count > limit:
        retry_after = max(1, 60 - int(now % 60))
        raise RateLimited(
            f"This run may send {limit} metric batches a minute; retry in {retry_after} s.",
            retry_after,
        )


@transaction.atomic
def metrics_ingest(*, run_id: int, points: list[ParsedPoint]) -> int:
    """Upsert points by (run, key, step) in one multi-row statement and fold them into the
    per-key summaries. A resent batch changes nothing. Returns the number of points."""
    run = Run.objects.filter(pk=run_id).only("pk", "state").first()
    if run is None:
        raise DomainError("No such run.")
    if run.state != RunState.RUNNING:
        raise NotRunning(f"Run {run_id} is {run.state}; only a running run takes metrics.")
    latest: dict[tuple[str, int], ParsedPoint] = {}
    for point in points:
        latest[(point.key, point.step)] = point
    if not latest:
        return 0
    if connection.vendor == "postgresql":
        _upsert_postgresql(run_id=run_id, points=list(latest.values()))
    else:
        MetricPoint.objects.bulk_create(
            [
                MetricPoint(run_id=run_id, key=p.key, step=p.step, value=p.value, time=p.time)
                for p in latest.values()
            ],
            update_conflicts=True,
            unique_fields=["run", "key", "step"],
            update_fields=["value", "time"],
            batch_size=500,
        )
    _summaries_fold(run_id=run_id, points=list(latest.values()))
    return len(latest)


UPSERT_POSTGRESQL = f"""
    INSERT INTO {MetricPoint._meta.db_table} (run_id, key, step, value, time)
    SELECT %s, key, step, value, time
    FROM unnest(%s::text[], %s::bigint[], %s::double precision[], %s::timestamptz[])
        AS batch(key, step, value, time)
    ON CONFLICT (run_id, key, step) DO UPDATE SET value = EXCLUDED.value, time = EXCLUDED.time
"""  # noqa: S608  (the table name is ours; every value is a parameter)


def _upsert_postgresql(*, run_id: int, points: list[ParsedPoint]) -> None:
    """One multi-row statement: the batch travels as four arrays, not 5000 parameters."""
    with connection.cursor() as cursor:
        cursor.execute(
            UPSERT_POSTGRESQL,
            [
                run_id,
                [p.key for p in points],
                [p.step for p in points],
                [p.value for p in points],
                [p.time for p in points],
            ],
        )


def _summaries_fold(*, run_id: int, points: list[ParsedPoint]) -> None:
    by_key: dict[str, list[ParsedPoint]] = {}
    for point in points:
        by_key.setdefault(point.key, []).append(point)
    existing = {
        s.key: s
        for s in MetricSummary.objects.select_for_update().filter(run_id=run_id, key__in=by_key)
    }
    rows = []
    for key, group in by_key.items():
        newest = max(group, key=lambda p: p.step)
        low = min(p.value for p in group)
        high = max(p.value for p in group)
        old = existing.get(key)
        if old is None:
            rows.append(
                MetricSummary(
                    run_id=run_id,
                    key=key,
                    last=newest.value,
                    min=low,
                    max=high,
                    step=newest.step,
                    count=len(group),
                )
            )
            continue
        if newest.step >= old.step:
            old.last, old.step = newest.value, newest.step
        old.min, old.max = min(old.min, low), max(old.max, high)
        old.count += len(group)
        rows.append(old)
    MetricSummary.objects.bulk_create(
        rows,
        update_conflicts=True,
        unique_fields=["run", "key"],
        update_fields=["last", "min", "max", "step", "count"],
    )


def run_heartbeat(*, run_id: int) -> Run:
    """A runner's sign of life; answers whether a cancel was requested."""
    updated = Run.objects.filter(pk=run_id, state=RunState.RUNNING).update(
        heartbeat_at=timezone.now()
    )
    run = Run.objects.get(pk=run_id)
    if not updated:
        raise NotRunning(f"Run {run_id} is {run.state}; only a running run sends heartbeats.")
    return run


def series_downsampled(*, run_id: int, key: str, points: int = 1000) -> dict[str, Any]:
    """A key's series in at most ``points`` points: all of it when it fits, else the min and
    the max of each of ``points // 2`` equal step ranges, in step order, so spikes survive."""
    rows = MetricPoint.objects.filter(run_id=run_id, key=key).order_by("step")
    total = rows.aggregate(n=Count("pk"))["n"] or 0
    data = np.fromiter(
        (v for row in rows.values_list("step", "value").iterator(chunk_size=10_000) for v in row),
        dtype=np.float64,
        count=2 * total,
    ).reshape(-1, 2)
    steps, values = data[:, 0], data[:, 1]
    if total <= points:
        pairs = list(zip(steps.astype(np.int64).tolist(), values.tolist(), strict=True))
        return {"key": key, "total": total, "downsampled": False, "points": pairs}
    buckets = max(1, points // 2)
    edges = np.linspace(steps[0], steps[-1] + 1, buckets + 1)
    starts = np.searchsorted(steps, edges[:-1], side="left")
    ends = np.searchsorted(steps, edges[1:], side="left")
    out: list[tuple[int, float]] = []
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        if end <= start:
            continue
        chunk = values[start:end]
        lo, hi = start + int(chunk.argmin()), start + int(chunk.argmax())
        for index in sorted({lo, hi}):
            out.append((int(steps[index]), float(values[index])))
    return {"key": key, "total": total, "downsampled": True, "points": out}


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


@transaction.atomic
def run_import_tracker_metrics(*, run_id: int, jsonl: str) -> Run:
    """Take the last ``tracker_metrics.jsonl`` line's ``summary`` as the run's final metrics
    (numbers only, finite) and its ``config`` as the config the tracker saw."""
    lines = [line for line in jsonl.splitlines() if line.strip()]
    if not lines:
        raise ValidationError({"jsonl": ["is empty"]})
    try:
        record = json.loads(lines[-1])
    except ValueError as exc:
        raise ValidationError({"jsonl": [f"the last line is not JSON: {exc}"]}) from exc
    if not isinstance(record, dict) or not isinstance(record.get("summary"), dict):
        raise ValidationError({"jsonl": ["the last line needs a 'summary' object"]})
    summary = {
        str(k): float(v) for k, v in record["summary"].items() if _is_number(v) and math.isfinite(v)
    }
    run = Run.objects.select_for_update().get(pk=run_id)
    run.final_metrics = summary
    config = record.get("config")
    run.tracker_config = config if isinstance(config, dict) else None
    run.save(update_fields=["final_metrics", "tracker_config", "updated_at"])
    return run
