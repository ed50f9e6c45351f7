"""Reading the rollup: one series in at most N points, and the chart data of a plan's runs
or of runs picked from any plans, in a few queries whatever their number."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import psycopg
from django.db import connection
from django.urls import reverse

from runs.metrics import display
from runs.metrics.declarations import MetricDeclaration, declarations_parse
from runs.models import TERMINAL_RUN_STATES, MetricPoint, MetricSeries, MetricSummary, Plan, Run
from runs.results import presentation
from runs.series.buckets import CHART_RECORD, COARSE, Buckets, group_starts
from runs.series.rollup import series_refresh_key

MAX_POINTS = 2000
DEFAULT_POINTS = 500
MAX_RUNS = 100


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


FRESH_ON_READ_MAX = 64  # stale series a read brings up to date itself; more wait for the task


def series_refresh_on_read(*, source_ids: set[int], keys: Sequence[str] | None) -> int:
    """Bring the stale series a chart is about to read up to date first (one query when none
    is): a point is in the chart data of the next read after its POST commits, not after the
    debounced refresh task (``series_refresh_soon``, RUNS_SERIES_REFRESH_SECONDS later). Each
    refresh reads only the points from the key's stale step on (a few buckets' worth); a
    concurrent read waits on the key's summary row and finds it fresh. At most
    FRESH_ON_READ_MAX series a read; returns whether any of the runs' series may still be
    stale (more than that many were, or some of a key not asked for)."""
    stale = MetricSummary.objects.filter(run_id__in=source_ids, stale_from__isnull=False)
    pairs = list(
        stale.order_by("run_id", "key").values_list("run_id", "key")[: FRESH_ON_READ_MAX + 1]
    )
    left = len(pairs) > FRESH_ON_READ_MAX
    wanted = None if keys is None else set(keys)
    for run_id, key in pairs[:FRESH_ON_READ_MAX]:
        if wanted is None or key in wanted:
            series_refresh_key(run_id=run_id, key=key)
        else:
            left = True
    return left


def chart_series(
    *,
    source_ids: Iterable[int],
    keys: Sequence[str] | None,
    points: int,
    refresh: bool = True,
) -> dict[tuple[int, str], dict[str, np.ndarray]]:
    """Each (source run, key)'s chart arrays, merged down to at most ``points``.

    Every series is handled in the same few numpy calls: their records are read as one
    array, and each series' labels are offset past the previous series' labels, so that no
    group crosses from one series into the next."""
    source_ids = set(source_ids)
    if not source_ids or (keys is not None and not keys):
        return {}
    if refresh:  # series_refresh_on_read, unless the caller did
        series_refresh_on_read(source_ids=source_ids, keys=keys)
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
    group_series = series_of[group_starts(labels)]
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
    recipe: tuple[str, str]  # (name, version): whose declarations say how its keys are shown

    @property
    def label(self) -> str:
        """The run's label (``runs.results.presentation.run_label``), as the run table shows it."""
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
    "recipe_name",
    "recipe_version",
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
        (row[10], row[11]),
    )


def _payload(
    *,
    lines: Sequence[_Line],
    axes_of: dict[int, list[str]],
    keys: Sequence[str] | None,
    points: int,
    declarations: dict[tuple[str, str], dict[str, MetricDeclaration]],
) -> dict[str, Any]:
    sources = {line.source for line in lines}
    stale = bool(sources) and series_refresh_on_read(source_ids=sources, keys=keys)
    arrays = chart_series(source_ids=sources, keys=keys, points=points, refresh=False)
    names = sorted({key for _, key in arrays}) if keys is None else list(keys)
    recipes = [line.recipe for line in lines]
    shown = display.shared_displays(names, declarations, recipes)
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
        # How each key is shown (runs.metrics.display); its values below are in that unit.
        "metrics": {key: shown[key].display.chart_meta() for key in names},
        "series": {
            key: [
                {
                    "run": line.id,
                    **_in_unit(arrays[(line.source, key)], shown[key].factor(line.recipe)),
                }
                for line in lines
                if (line.source, key) in arrays
            ]
            for key in names
        },
    }


def _in_unit(arrays: dict[str, np.ndarray], factor: float) -> dict[str, np.ndarray]:
    """A line's arrays in the unit its chart shows (a fraction logged for a percent x 100)."""
    if factor == 1.0:
        return arrays
    return {name: values if name == "step" else values * factor for name, values in arrays.items()}


def _dumps(payload: dict[str, Any]) -> bytes:
    return orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)


def plan_series(*, plan_id: int, keys: Sequence[str] | None, points: int) -> bytes | None:
    """The chart data of a plan's runs as JSON bytes, or None when there is no such plan.
    Four queries whatever the number of runs and keys."""
    plan = (
        Plan.objects.filter(pk=plan_id)
        .values_list("pk", "spec", "recipe__name", "recipe__version", "recipe__metrics")
        .first()
    )
    if plan is None:
        return None
    lines = [
        _line(row)
        for row in Run.objects.filter(plan_id=plan_id)
        .order_by("entry__index", "sequence")
        .values_list(*LINE_VALUES)
    ]
    payload = _payload(
        lines=lines,
        axes_of={plan[0]: presentation.axis_names(plan[1])},
        keys=keys,
        points=points,
        declarations={(plan[2], plan[3]): declarations_parse(plan[4] or [])},
    )
    return _dumps({"plan": plan[0], **payload})


def runs_series(*, run_ids: Sequence[int], keys: Sequence[str] | None, points: int) -> bytes:
    """The chart data of runs picked from any plans (the compare page), in the order asked;
    unknown ids are left out. Four queries whatever the number of runs and keys."""
    rows = Run.objects.filter(pk__in=run_ids).values_list(*LINE_VALUES, "plan__spec")
    found = {row[0]: row for row in rows}
    picked = [found[pk] for pk in dict.fromkeys(run_ids) if pk in found]
    axes_of = {row[5]: presentation.axis_names(row[len(LINE_VALUES)]) for row in picked}
    lines = [_line(row) for row in picked]
    declarations = display.recipe_declarations(line.recipe for line in lines)
    return _dumps(
        _payload(lines=lines, axes_of=axes_of, keys=keys, points=points, declarations=declarations)
    )
