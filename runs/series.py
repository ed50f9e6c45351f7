"""Downsampled metric series: the rollup that charts read instead of points.

A proposal page draws 64 runs x 4 keys of 100,000 steps each: 25.6M points, which no
request can scan. Each (run, key) therefore keeps a ``MetricSeries``: the points cut into
buckets of ``width`` steps (a power of two) counted from ``origin`` (the lowest step), at most
``MAX_BUCKETS`` of them, each with its point count, sum, min and max, its highest step, and
the steps where the min and the max were reached. Buckets merge exactly (counts and sums
add; min, max and last are taken), so:

- a read for N points merges neighbouring buckets until at most N remain: one query for all
  the series of a page and a few numpy calls over all of them together, whatever the length
  of the runs. A second copy with ``COARSE`` buckets in one serves the usual short reads
  (a page asks for 500 points) with a quarter of the bytes;
- a run that grows doubles ``width`` and merges pairs, instead of rereading its points.

The rollup is kept by a refresh, not by each ingest: an ingest marks the keys it wrote
stale from their lowest written step (``MetricSummary.stale_from``) and asks for a refresh
of the run at most once every ``RUNS_SERIES_REFRESH_SECONDS`` (debounced in the cache). The
refresh rebuilds only the buckets from the stale step on, from the points, so it is exact
whatever the order in which points arrived and whatever was resent. A run that ends is
refreshed at once; a periodic sweep (Celery beat) refreshes whatever a lost message left
stale. Until then a chart lags by a few seconds, and ``active`` stays true.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import psycopg
from django.conf import settings
from django.core.cache import cache
from django.db import connection, transaction
from django.urls import reverse

from runs import presentation, steady
from runs.models import (
    TERMINAL_RUN_STATES,
    MetricPoint,
    MetricSeries,
    MetricSummary,
    Plan,
    Run,
)
from runs.signals import run_state_changed

logger = logging.getLogger(__name__)

MAX_BUCKETS = 2048  # stored per series; above MAX_POINTS so a read can always be served
COARSE = 4  # a second, coarser copy merges this many buckets into one
MAX_POINTS = 2000
DEFAULT_POINTS = 500
MAX_RUNS = 100

# Stored as little-endian records, one per bucket: ``buckets`` (and ``coarse``) hold what
# charts read, ``extremes`` the steps of each bucket's min and max (for the single-series
# API). Records, not columns, so that many series read together are one numpy array.
CHART_RECORD = np.dtype(
    [("last", "<i8"), ("count", "<i8"), ("total", "<f8"), ("low", "<f8"), ("high", "<f8")]
)
EXTREME_RECORD = np.dtype([("low_step", "<i8"), ("high_step", "<i8")])


@dataclass
class Buckets:
    """Buckets in step order. ``last`` is the highest step in each; ``low_step`` and
    ``high_step`` (absent on a chart read) where its min and max were reached."""

    last: np.ndarray
    count: np.ndarray
    total: np.ndarray
    low: np.ndarray
    high: np.ndarray
    low_step: np.ndarray | None = None
    high_step: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.last)

    @classmethod
    def of_points(cls, steps: np.ndarray, values: np.ndarray) -> Buckets:
        """Each point as a bucket of its own."""
        return cls(
            last=steps,
            count=np.ones(len(steps), dtype=np.int64),
            total=values,
            low=values,
            high=values,
            low_step=steps,
            high_step=steps,
        )

    def index(self, *, origin: int, width: int) -> np.ndarray:
        return (self.last - origin) // width

    def take(self, mask: np.ndarray) -> Buckets:
        return Buckets(
            *(None if a is None else a[mask] for a in self._arrays())  # type: ignore[arg-type]
        )

    def then(self, other: Buckets) -> Buckets:
        """These buckets followed by ``other`` (which starts after them)."""
        return Buckets(
            *(
                None if a is None or b is None else np.concatenate([a, b])
                for a, b in zip(self._arrays(), other._arrays(), strict=True)
            )  # type: ignore[arg-type]
        )

    def merge(self, labels: np.ndarray) -> Buckets:
        """Merge neighbouring buckets that share a label (labels never decrease)."""
        size = len(labels)
        if size == 0:
            return self
        starts = _group_starts(labels)
        if len(starts) == size:
            return self
        ends = np.r_[starts[1:], size]
        low = np.minimum.reduceat(self.low, starts)
        high = np.maximum.reduceat(self.high, starts)
        merged = Buckets(
            last=self.last[ends - 1],
            count=np.add.reduceat(self.count, starts),
            total=np.add.reduceat(self.total, starts),
            low=low,
            high=high,
        )
        if self.low_step is not None and self.high_step is not None:
            lengths = ends - starts
            merged.low_step = self.low_step[_first_hit(self.low, low, lengths)]
            merged.high_step = self.high_step[_first_hit(self.high, high, lengths)]
        return merged

    def chart_only(self) -> Buckets:
        return Buckets(self.last, self.count, self.total, self.low, self.high)

    def pack(self) -> tuple[bytes, bytes]:
        chart = np.empty(len(self), dtype=CHART_RECORD)
        for name in CHART_RECORD.names or ():
            chart[name] = getattr(self, name)
        extremes = np.empty(len(self) if self.low_step is not None else 0, dtype=EXTREME_RECORD)
        if self.low_step is not None and self.high_step is not None:
            extremes["low_step"], extremes["high_step"] = self.low_step, self.high_step
        return chart.tobytes(), extremes.tobytes()

    @classmethod
    def unpack(
        cls, chart: bytes | memoryview, extremes: bytes | memoryview | None = None
    ) -> Buckets:
        return cls.of_records(
            np.frombuffer(chart, dtype=CHART_RECORD),
            None if extremes is None else np.frombuffer(extremes, dtype=EXTREME_RECORD),
        )

    @classmethod
    def of_records(cls, chart: np.ndarray, extremes: np.ndarray | None = None) -> Buckets:
        buckets = cls(*(chart[name] for name in CHART_RECORD.names or ()))
        if extremes is not None and len(extremes) == len(chart):
            buckets.low_step, buckets.high_step = extremes["low_step"], extremes["high_step"]
        return buckets

    def _arrays(self) -> tuple[np.ndarray | None, ...]:
        return (
            self.last,
            self.count,
            self.total,
            self.low,
            self.high,
            self.low_step,
            self.high_step,
        )


def _group_starts(labels: np.ndarray) -> np.ndarray:
    """Where each run of equal labels starts."""
    if not len(labels):
        return np.zeros(0, dtype=np.int64)
    changes = np.flatnonzero(labels[1:] != labels[:-1]) + 1
    return np.concatenate([np.zeros(1, dtype=changes.dtype), changes])


def _first_hit(values: np.ndarray, group_values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """For each group of ``lengths`` consecutive items, the position of its first item equal
    to the group's value (its min or max, so there always is one)."""
    hits = np.flatnonzero(values == np.repeat(group_values, lengths))
    groups = np.repeat(np.arange(len(lengths)), lengths)[hits]
    return hits[np.r_[True, groups[1:] != groups[:-1]]]


def width_for(span: int) -> int:
    """The smallest power of two that cuts ``span + 1`` steps into at most MAX_BUCKETS."""
    width = 1
    while span >= MAX_BUCKETS * width:
        width *= 2
    return width


# --- keeping the rollup ---------------------------------------------------------------


def _points_from(*, run_id: int, key: str, start: int) -> Buckets:
    rows = list(
        MetricPoint.objects.filter(run_id=run_id, key=key, step__gte=start)
        .order_by("step")
        .values_list("step", "value")
        .iterator(chunk_size=20_000)
    )
    steps = np.fromiter((step for step, _ in rows), dtype=np.int64, count=len(rows))
    values = np.fromiter((value for _, value in rows), dtype=np.float64, count=len(rows))
    return Buckets.of_points(steps, values)


def series_refresh_key(*, run_id: int, key: str) -> bool:
    """Bring one key's rollup up to date; False when it already was.

    Locks the key's summary row: ingests of the key wait (briefly), and their points land
    after this refresh's read with the key stale again, so nothing is missed."""
    with transaction.atomic():
        summary = MetricSummary.objects.select_for_update().filter(run_id=run_id, key=key).first()
        if summary is None or summary.stale_from is None:
            return False
        stale = int(summary.stale_from)
        stored = MetricSeries.objects.filter(run_id=run_id, key=key).first()
        if stored is None or stale < stored.origin:
            origin = stale  # the lowest step: every step below the old origin is new
            width = width_for(int(summary.step) - origin)
            kept: Buckets | None = None
            start = origin
        else:
            origin = int(stored.origin)
            width = max(int(stored.width), width_for(int(summary.step) - origin))
            old = Buckets.unpack(stored.buckets, stored.extremes)
            if width != stored.width:
                old = old.merge(old.index(origin=origin, width=width))
            first_stale = (stale - origin) // width
            kept = old.take(old.index(origin=origin, width=width) < first_stale)
            start = origin + first_stale * width
        fresh = _points_from(run_id=run_id, key=key, start=start)
        fresh = fresh.merge(fresh.index(origin=origin, width=width))
        buckets = fresh if kept is None else kept.then(fresh)
        index = buckets.index(origin=origin, width=width)
        chart, extremes = buckets.pack()
        fields = {
            "origin": origin,
            "width": width,
            "span": int(index[-1]) + 1 if len(index) else 0,
            "buckets": chart,
            "coarse": buckets.chart_only().merge(index // COARSE).pack()[0],
            "extremes": extremes,
        }
        if stored is None:
            MetricSeries.objects.create(run_id=run_id, key=key, **fields)
        else:
            for name, value in fields.items():
                setattr(stored, name, value)
            stored.save(update_fields=[*fields, "refreshed_at"])
        if len(buckets):
            summary.count = int(buckets.count.sum())
            summary.min = float(buckets.low.min())
            summary.max = float(buckets.high.max())
        if steady.is_steady_state_key(key):
            summary.steady = steady.steady_median(
                run_id=run_id, key=key, first_step=origin, last_step=int(summary.step)
            )
        summary.stale_from = None
        summary.save(update_fields=["count", "min", "max", "steady", "stale_from"])
    return True


def series_refresh(*, run_id: int) -> int:
    """Refresh every stale key of a run; returns how many were refreshed."""
    keys = MetricSummary.objects.filter(run_id=run_id, stale_from__isnull=False).values_list(
        "key", flat=True
    )
    return sum(series_refresh_key(run_id=run_id, key=key) for key in list(keys))


def series_refresh_stale(*, limit: int = 2000) -> int:
    """The periodic sweep: refresh whatever is stale (a lost nudge, a run that went quiet)."""
    pairs = MetricSummary.objects.filter(stale_from__isnull=False).values_list("run_id", "key")
    refreshed = 0
    for run_id, key in list(pairs.order_by("run_id", "key")[:limit]):
        try:
            refreshed += series_refresh_key(run_id=run_id, key=key)
        except Exception:
            logger.exception("refreshing the series of run %s key %s failed", run_id, key)
    return refreshed


def series_refresh_soon(*, run_id: int) -> None:
    """Ask for a refresh of the run's series in RUNS_SERIES_REFRESH_SECONDS, unless one is
    already asked for: a run that streams metrics is refreshed once per period."""
    delay = int(settings.RUNS_SERIES_REFRESH_SECONDS)
    if cache.add(f"runs:series-refresh:{run_id}", 1, timeout=max(1, delay)):
        transaction.on_commit(lambda: _send_refresh(run_id, countdown=delay), robust=True)


def _send_refresh(run_id: int, *, countdown: int) -> None:
    from runs.tasks import series_refresh_task

    try:
        series_refresh_task.apply_async(kwargs={"run_id": run_id}, countdown=countdown, retry=False)
    except Exception:  # the broker is down: the periodic sweep will do it
        logger.warning("could not enqueue the series refresh of run %s; the sweep will", run_id)


def _refresh_ended_run(sender: Any, *, run_id: int, to_state: str, **kwargs: Any) -> None:
    if to_state in TERMINAL_RUN_STATES:
        _send_refresh(run_id, countdown=0)


run_state_changed.connect(_refresh_ended_run, dispatch_uid="runs.series.refresh_ended_run")


# --- reading: one series, and chart data for many runs -----------------------------------


def run_series_downsampled(*, run_id: int, key: str, points: int = 1000) -> dict[str, Any]:
    """A key's series in at most ``points`` points: every point when they fit, else the min
    and the max of each of ``points // 2`` step ranges, in step order, so spikes survive.

    Reads the rollup, refreshing it first if the key is stale (a few buckets' worth of
    points), so the answer is always up to date."""
    summary = MetricSummary.objects.filter(run_id=run_id, key=key).only("count", "stale_from")
    found = summary.first()
    total = int(found.count) if found else 0
    if found is None or total <= points:
        rows = (
            MetricPoint.objects.filter(run_id=run_id, key=key)
            .order_by("step")
            .values_list("step", "value")
        )
        pairs = [[step, value] for step, value in rows]
        return {"key": key, "total": len(pairs), "downsampled": False, "points": pairs}
    if found.stale_from is not None:
        series_refresh_key(run_id=run_id, key=key)
        found.refresh_from_db(fields=["count"])
        total = int(found.count)
    stored = MetricSeries.objects.filter(run_id=run_id, key=key).first()
    if stored is None:  # pragma: no cover - the refresh above made it
        return {"key": key, "total": total, "downsampled": True, "points": []}
    buckets = Buckets.unpack(stored.buckets, stored.extremes)
    buckets = buckets.merge(_labels(buckets, stored.origin, stored.width, max(1, points // 2)))
    assert buckets.low_step is not None and buckets.high_step is not None
    out: list[list[Any]] = []
    for low_step, low, high_step, high in zip(
        buckets.low_step.tolist(),
        buckets.low.tolist(),
        buckets.high_step.tolist(),
        buckets.high.tolist(),
        strict=True,
    ):
        if low_step == high_step:
            out.append([low_step, low])
        else:
            pair = [[low_step, low], [high_step, high]]
            out.extend(pair if low_step < high_step else pair[::-1])
    return {"key": key, "total": total, "downsampled": True, "points": out}


def _labels(buckets: Buckets, origin: int, width: int, points: int) -> np.ndarray:
    """Labels merging neighbouring buckets into at most ``points`` equal step ranges."""
    index = buckets.index(origin=origin, width=width)
    if not len(index):
        return index
    span = int(index[-1] - index[0]) + 1
    factor = math.ceil(span / points)
    return (index - index[0]) // factor


SERIES_TABLE = MetricSeries._meta.db_table
# The coarse copy where it holds enough buckets (at least 3/4 of the points asked for) and
# reads four times less; its buckets are COARSE times as wide.
SERIES_SELECT = f"""
SELECT run_id, key, origin, width,
    CASE WHEN (span + {COARSE - 1}) / {COARSE} >= %s THEN {COARSE} ELSE 1 END,
    CASE WHEN (span + {COARSE - 1}) / {COARSE} >= %s THEN coarse ELSE buckets END
FROM {SERIES_TABLE}
"""  # noqa: S608  (names are ours; values are parameters)


def _series_rows(
    *, source_ids: set[int], keys: Sequence[str] | None, points: int
) -> list[tuple[Any, ...]]:
    """(run, key, origin, width, width factor, packed records) of each series; one query.

    On PostgreSQL the rows come in the binary protocol: a page of 64 runs reads megabytes
    of packed records, which the text protocol would send as hex and decode again (about
    five times slower), so the query goes through a psycopg cursor of its own, wrapped as
    Django wraps its cursors (query logging and counting included)."""
    enough = (3 * points + 3) // 4
    if connection.vendor != "postgresql":
        ids = sorted(source_ids)
        where = f"WHERE run_id IN ({', '.join(['%s'] * len(ids))})"
        params: list[Any] = [enough, enough, *ids]
        if keys is not None:
            where += f" AND key IN ({', '.join(['%s'] * len(keys))})"
            params += list(keys)
        with connection.cursor() as cursor:
            cursor.execute(SERIES_SELECT + where, params)
            return list(cursor.fetchall())
    where = "WHERE run_id = ANY(%s)" + ("" if keys is None else " AND key = ANY(%s)")
    params = [enough, enough, sorted(source_ids), *([] if keys is None else [list(keys)])]
    connection.ensure_connection()
    raw: Any = psycopg.Cursor(connection.connection)
    raw.format = psycopg.pq.Format.BINARY
    with (
        connection.make_debug_cursor(raw)
        if connection.queries_logged
        else connection.make_cursor(raw)
    ) as cursor:
        cursor.execute(SERIES_SELECT + where, params)
        return list(cursor.fetchall())


def _chart_series(
    *, source_ids: Iterable[int], keys: Sequence[str] | None, points: int
) -> dict[tuple[int, str], dict[str, np.ndarray]]:
    """Each (source run, key)'s chart arrays, merged down to at most ``points``.

    Every series is handled in the same few numpy calls: their records are read as one
    array, and each series' labels are offset past the previous series' labels, so that no
    group crosses from one series into the next."""
    source_ids = set(source_ids)
    if not source_ids or (keys is not None and not keys):
        return {}
    rows = _series_rows(source_ids=source_ids, keys=keys, points=points)
    if not rows:
        return {}
    packed = [row[5] for row in rows]
    lengths = np.array([len(blob) // CHART_RECORD.itemsize for blob in packed], dtype=np.int64)
    records = np.frombuffer(b"".join(packed), dtype=CHART_RECORD)
    count = len(rows)
    series_of = np.repeat(np.arange(count), lengths)
    origin = np.array([row[2] for row in rows], dtype=np.int64)
    width = np.array([row[3] * row[4] for row in rows], dtype=np.int64)
    index = (records["last"] - origin[series_of]) // width[series_of]
    ends = np.cumsum(lengths)
    starts = ends - lengths
    filled = lengths > 0
    first = np.zeros(count, dtype=np.int64)
    first[filled] = index[starts[filled]]
    span = np.zeros(count, dtype=np.int64)
    span[filled] = index[ends[filled] - 1] - first[filled] + 1
    factor = np.maximum(1, -(-span // points))  # ceil: at most ``points`` groups
    groups = -(-span // factor)
    offset = np.cumsum(groups) - groups
    labels = (index - first[series_of]) // factor[series_of] + offset[series_of]
    merged = Buckets.of_records(records).merge(labels)
    group_series = series_of[_group_starts(labels)]
    bounds = np.searchsorted(group_series, np.arange(count + 1)).tolist()
    step = np.ascontiguousarray(merged.last)
    value = merged.total / merged.count
    low, high = np.ascontiguousarray(merged.low), np.ascontiguousarray(merged.high)
    return {
        (row[0], row[1]): {
            "step": step[a:b],
            "value": value[a:b],
            "min": low[a:b],
            "max": high[a:b],
        }
        for row, a, b in zip(rows, bounds[:-1], bounds[1:], strict=True)
    }


@dataclass(frozen=True, slots=True)
class _Line:
    """What the charts need of a run, read as plain values (no model instances): a page of
    64 runs loads in a third of the time."""

    id: int
    state: str
    sequence: int
    source: int  # the run whose points it shows: itself, or the run a cached run reuses
    config: dict[str, Any]
    plan_id: int
    diff: dict[str, Any]
    scale: str
    seed: int | None
    baseline: bool

    @property
    def label(self) -> str:
        """The run's label (``runs.presentation.run_label``), as the run table shows it."""
        return presentation.run_label(
            changes=self.diff, scale=self.scale, seed=self.seed, sequence=self.sequence
        )

    def axes(self, names: Sequence[str]) -> dict[str, Any]:
        return presentation.axis_values(names, config=self.config, scale=self.scale, seed=self.seed)


LINE_VALUES = (
    "id",
    "state",
    "sequence",
    "cached_from_id",
    "config",
    "plan_id",
    "entry__diff",
    "entry__scale",
    "entry__seed",
    "entry__is_baseline",
)


def _line(row: Sequence[Any]) -> _Line:
    pk, state, sequence, cached_from, config, plan_id, diff, scale, seed, baseline = row[:10]
    return _Line(
        pk,
        state,
        sequence,
        cached_from or pk,
        config or {},
        plan_id,
        diff or {},
        scale,
        seed,
        baseline,
    )


def _payload(
    *,
    lines: Sequence[_Line],
    axes_of: dict[int, list[str]],
    keys: Sequence[str] | None,
    points: int,
) -> dict[str, Any]:
    sources = {line.source for line in lines}
    arrays = _chart_series(source_ids=sources, keys=keys, points=points)
    names = sorted({key for _, key in arrays}) if keys is None else list(keys)
    stale = bool(sources) and (
        MetricSummary.objects.filter(run_id__in=sources, stale_from__isnull=False).exists()
    )
    return {
        # Polling stops once nothing can change: every run ended and its series caught up.
        "active": stale or any(line.state not in TERMINAL_RUN_STATES for line in lines),
        "keys": names,
        "runs": [
            {
                "id": line.id,
                "state": line.state,
                "label": line.label,
                "baseline": line.baseline,
                "axes": line.axes(axes_of[line.plan_id]),
                "url": reverse("run-page", kwargs={"pk": line.id}),
            }
            for line in lines
        ],
        "series": {
            key: [
                {"run": line.id, **arrays[(line.source, key)]}
                for line in lines
                if (line.source, key) in arrays
            ]
            for key in names
        },
    }


def _dumps(payload: dict[str, Any]) -> bytes:
    return orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)


def plan_series(*, plan_id: int, keys: Sequence[str] | None, points: int) -> bytes | None:
    """The chart data of a plan's runs as JSON bytes, or None when there is no such plan.
    Four queries whatever the number of runs and keys."""
    plan = Plan.objects.filter(pk=plan_id).values_list("pk", "spec").first()
    if plan is None:
        return None
    lines = [
        _line(row)
        for row in Run.objects.filter(plan_id=plan_id)
        .order_by("entry__index", "sequence")
        .values_list(*LINE_VALUES)
    ]
    payload = _payload(
        lines=lines, axes_of={plan[0]: presentation.axis_names(plan[1])}, keys=keys, points=points
    )
    return _dumps({"plan": plan[0], **payload})


def runs_series(*, run_ids: Sequence[int], keys: Sequence[str] | None, points: int) -> bytes:
    """The chart data of runs picked from any plans (the compare page), in the order asked;
    unknown ids are left out. Three queries whatever the number of runs and keys."""
    rows = Run.objects.filter(pk__in=run_ids).values_list(*LINE_VALUES, "plan__spec")
    found = {row[0]: row for row in rows}
    picked = [found[pk] for pk in dict.fromkeys(run_ids) if pk in found]
    axes_of = {row[5]: presentation.axis_names(row[10]) for row in picked}
    lines = [_line(row) for row in picked]
    return _dumps(_payload(lines=lines, axes_of=axes_of, keys=keys, points=points))
