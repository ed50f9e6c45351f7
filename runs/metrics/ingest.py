"""Writing a checked batch: points upserted with running summaries, in one statement on
PostgreSQL and a portable form next to it for any other database; the heartbeat and the
rate limit of a runner's reports.

After parsing (``runs.metrics.parse``) the batch is ordered by (key, step) and folded per
key in Python. On PostgreSQL one statement, its arrays sent in binary, writes the points and
their summaries; a point resent with the same value is not written again, so a resent batch
changes nothing. Points are keyed by (run, key, step), which is also the table's primary key.
Each written key is marked stale from its lowest written step, and ``runs.series`` refreshes
the downsampled series that charts read, a few seconds later.

Summaries: ``last`` and ``step`` (the highest step) and ``count`` (distinct points) are
exact at once. ``min`` and ``max`` are exact too unless a step is resent with a different
value (a run resumed from a checkpoint): the old value may linger in them until the series
refresh recomputes both from the points.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.cache import cache
from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone
from psycopg.types.numeric import Int8

from marin_site.db import server_binding_cursor
from marin_site.doors import Door
from marin_site.errors import DomainError
from runs import tokens
from runs.alerts.services import (
    WATCHES_ANSWER,
    WATCHES_WRITTEN,
    AlertsAhead,
    alerts_evaluate,
    alerts_fold_ahead,
)
from runs.metrics import declarations as metric_declarations
from runs.metrics import flags as metric_flags
from runs.metrics import pg_arrays
from runs.metrics.declarations import UnitMisfit
from runs.metrics.parse import PointBatch
from runs.models import MetricPoint, MetricSummary, Run, RunState
from runs.series.rollup import series_refresh_soon

if TYPE_CHECKING:
    from runs.tokens import Admission

logger = logging.getLogger(__name__)

SIGN_OF_LIFE_EVERY = timedelta(seconds=2)  # how often a write refreshes a run's heartbeat


class NotRunning(DomainError):
    status_code = 409


class NotAdmitted(Exception):
    """A batch taken on an admission (``runs.tokens.Admission``) was not stored: the run's
    row no longer says what the admission kept, or a point of the batch is stored already
    (the upsert form is taken only after a full check). Nothing was written; the door
    checks the run's row and goes again as without the admission."""


class RateLimited(DomainError):
    status_code = 429

    def __init__(self, message: str, retry_after: int, counted_in: str = "") -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.counted_in = counted_in  # the window this request was counted in


def metrics_rate_key(*, run_id: int, window: int) -> str:
    """The cache key counting a run's metric batches in one minute (``window``: minutes
    since the epoch)."""
    return f"runs:metrics-rate:{run_id}:{window}"


def metrics_rate_check(*, run_id: int) -> str:
    """At most RUNS_METRICS_RATE_PER_MINUTE requests a minute per run (a fixed window).
    Answers the key of the window the request was counted in, for ``metrics_rate_return``."""
    limit = settings.RUNS_METRICS_RATE_PER_MINUTE
    now = timezone.now().timestamp()
    window = int(now // 60)
    key = metrics_rate_key(run_id=run_id, window=window)
    try:  # one call for every batch but a window's first (one round trip on Redis)
        count = cache.incr(key)
    except ValueError:  # the window's first batch
        if cache.add(key, 1, timeout=70):
            count = 1
        else:  # another took the first place meanwhile
            try:
                count = cache.incr(key)
            except ValueError:  # and it expired since: this one is the first again
                cache.set(key, 1, timeout=70)
                count = 1
    if count > limit:
        retry_after = max(1, 60 - int(now % 60))
        raise RateLimited(
            f"This run may send {limit} metric batches a minute; retry in {retry_after} s.",
            retry_after,
            counted_in=key,
        )
    return key


def metrics_rate_return(*, counted_in: str) -> None:
    """Take back a request counted in the window ``counted_in`` that the run's row then
    refused (a batch taken on a kept admission is counted before the row is read): a
    refused batch uses up none of the run's minute, as without an admission."""
    if not counted_in:
        return
    try:
        cache.decr(counted_in)
    except ValueError:  # the window expired meanwhile: nothing left to take back
        return


def metrics_ingest(*, run: Run, batch: PointBatch, require_running: bool = True) -> int:
    """``metrics_ingest_flagged``, answering the number of distinct points in the batch."""
    return metrics_ingest_flagged(run=run, batch=batch, require_running=require_running)[0]


def metrics_ingest_flagged(
    *,
    run: Run,
    batch: PointBatch,
    require_running: bool = True,
    door: str = Door.SYSTEM,
    admission: Admission | None = None,
) -> tuple[int, list[UnitMisfit]]:
    """Upsert a checked batch for ``run`` (loaded with its state by the token check) and fold
    it into the per-key summaries; schedule the series refresh when anything changed.
    A resent batch changes nothing. Returns the number of distinct points in the batch, and
    its keys whose values do not fit their declaration (stored, and flagged).

    Every door writes through here: the native API, MLflow's, the Levanter tracker and the
    ``tracker_metrics.jsonl`` import (which alone may write a run that has ended, with
    ``require_running=False``). Values are stored as logged; a fraction or percent key with
    values outside the range of the unit it is logged in is stored and flagged
    (``runs.metrics.flags``; ``runs.metrics.display`` converts when it shows them).

    With ``admission`` (the native door, its token checked by the process, not the row),
    every write stands only while the run's row says what the admission kept; else
    ``NotAdmitted`` is raised with nothing written.
    """
    if admission is not None and connection.vendor != "postgresql":
        raise NotAdmitted
    if require_running and run.state != RunState.RUNNING:
        raise NotRunning(f"Run {run.pk} is {run.state}; only a running run takes metrics.")
    if not len(batch):
        return 0, []
    ordered, folds = points_order_and_fold(batch)
    misfits: list[UnitMisfit] = []
    declarations = metric_declarations.declarations_for_run(run_id=run.pk)
    # Each key's range is in its fold: only a key outside its unit's range is looked for.
    if not all(
        metric_declarations.value_fits(declarations.get(f.key), f.min, f.max) for f in folds
    ):
        misfits = metric_declarations.declarations_misfits(
            run_id=run.pk, keys=batch.keys, steps=batch.steps, values=batch.values
        )
    if run.state == RunState.RUNNING:
        loaded = "heartbeat_at" not in run.get_deferred_fields()
        last = run.heartbeat_at if loaded else None
        run_sign_of_life(run_id=run.pk, last=last, admission=admission)
    columns = key_columns(ordered, folds)
    ahead = None
    if connection.vendor == "postgresql":
        if run.state == RunState.RUNNING:  # alerts watch live runs, not imported history
            try:
                ahead = alerts_fold_ahead(run=run, batch_keys=set(columns), columns=columns)
            except Exception:  # an alert's fault never refuses the points
                logger.exception("folding the alerts of run %s ahead failed", run.pk)
        changed = ingest_postgresql(
            run_id=run.pk, batch=ordered, folds=folds, ahead=ahead, admission=admission
        )
    else:
        changed = ingest_portable(run_id=run.pk, batch=batch)
    if changed:
        series_refresh_soon(run_id=run.pk)
        settled = ahead is not None and ahead.rows is not None and ahead.settled(ahead.rows)
        if run.state == RunState.RUNNING and not settled:
            try:
                alerts_evaluate(run=run, batch=ordered, columns=columns)
            except Exception:  # the points are stored; an alert's fault never refuses them
                logger.exception("evaluating the alerts of run %s failed", run.pk)
    if misfits:
        metric_flags.flags_record(run=run, misfits=misfits, door=door)
    return len(batch), misfits


POINTS_TABLE = MetricPoint._meta.db_table
SUMMARY_TABLE = MetricSummary._meta.db_table

# One statement, one round trip. The batch travels as binary arrays (``runs.metrics.pg_arrays``),
# already in (key, step) order, so two writers of one run take their row locks in the same
# order, and PostgreSQL neither parses nor sorts it.
#
# The fast form, for a fresh batch (the usual case): a plain INSERT of the points (no
# ON CONFLICT: speculative insertion costs a third more), with the per-key summaries folded
# in Python and upserted in the same statement. A batch that meets a stored point fails
# whole on the primary key and goes again in the upsert form, where only inserted or changed
# points reach the summaries, folded in SQL (``xmax = 0`` tells an inserted row from an
# updated one).
_BATCH = """
    SELECT %(run)s, key, step, value, COALESCE(to_timestamp(at), now())
    FROM unnest(%(keys)s::text[], %(steps)s::bigint[], %(values)s::double precision[],
        %(times)s::double precision[]) AS b(key, step, value, at)"""
_SUMMARY_UPSERT = """
ON CONFLICT (run_id, key) DO UPDATE SET
    last = CASE WHEN EXCLUDED.step >= s.step THEN EXCLUDED.last ELSE s.last END,
    step = GREATEST(s.step, EXCLUDED.step),
    min = LEAST(s.min, EXCLUDED.min),
    max = GREATEST(s.max, EXCLUDED.max),
    count = s.count + EXCLUDED.count,
    stale_from = LEAST(s.stale_from, EXCLUDED.stale_from)"""
INGEST_FRESH = f"""
WITH points AS (
    INSERT INTO {POINTS_TABLE} (run_id, key, step, value, time){_BATCH}
)
INSERT INTO {SUMMARY_TABLE} AS s (run_id, key, last, min, max, step, count, stale_from)
SELECT %(run)s, * FROM unnest(%(fold_keys)s::text[], %(fold_last)s::double precision[],
    %(fold_min)s::double precision[], %(fold_max)s::double precision[],
    %(fold_step)s::bigint[], %(fold_count)s::bigint[], %(fold_first)s::bigint[])
{_SUMMARY_UPSERT}"""  # noqa: S608  (table names are ours; every value is a parameter)
# The fresh form, writing too the run's alert watches folded ahead from this process's copy
# (``runs.alerts.services.alerts_fold_ahead``): the points, the summaries and the watches in
# one statement and one transaction, and the watches' answer (``WATCHES_ANSWER``).
INGEST_FRESH_WATCHED = (
    f"""
WITH points AS (
    INSERT INTO {POINTS_TABLE} (run_id, key, step, value, time){_BATCH}
),
summaries AS (
    INSERT INTO {SUMMARY_TABLE} AS s (run_id, key, last, min, max, step, count, stale_from)
    SELECT %(run)s, * FROM unnest(%(fold_keys)s::text[], %(fold_last)s::double precision[],
        %(fold_min)s::double precision[], %(fold_max)s::double precision[],
        %(fold_step)s::bigint[], %(fold_count)s::bigint[], %(fold_first)s::bigint[])
    {_SUMMARY_UPSERT}
),
"""  # noqa: S608
    + WATCHES_WRITTEN.format(quiet="", guard="")
    + WATCHES_ANSWER
)
# The fresh forms for a batch taken on the process's admission of the run's token
# (``runs.tokens.Admission``, no row read): every write of the statement stands only while
# the run's row says what the admission kept, read in the statement's own snapshot. Without
# the watches the count of summaries written says whether it stood (0: nothing written); with
# them a row (-1, NULL) says it did not.
_ADMITTED = f"""admitted AS (
    SELECT FROM {Run._meta.db_table} WHERE id = %(run)s
        AND (state, token_hash, attempt, started_at, time_limit_seconds) IS NOT DISTINCT FROM
            (%(admit_state)s, %(admit_token)s, %(admit_attempt)s, %(admit_started)s,
            %(admit_limit)s)
)"""  # noqa: S608  (one row compared, so the row is found by its key alone)
_IF_ADMITTED = " WHERE EXISTS (SELECT FROM admitted)"
_SUMMARIES_ADMITTED = f"""
INSERT INTO {SUMMARY_TABLE} AS s (run_id, key, last, min, max, step, count, stale_from)
SELECT %(run)s, * FROM unnest(%(fold_keys)s::text[], %(fold_last)s::double precision[],
    %(fold_min)s::double precision[], %(fold_max)s::double precision[],
    %(fold_step)s::bigint[], %(fold_count)s::bigint[], %(fold_first)s::bigint[]){_IF_ADMITTED}
{_SUMMARY_UPSERT}"""  # noqa: S608
INGEST_FRESH_ADMITTED = f"""
WITH {_ADMITTED},
points AS (
    INSERT INTO {POINTS_TABLE} (run_id, key, step, value, time){_BATCH}{_IF_ADMITTED}
){_SUMMARIES_ADMITTED}"""
INGEST_FRESH_WATCHED_ADMITTED = (
    f"""
WITH {_ADMITTED},
points AS (
    INSERT INTO {POINTS_TABLE} (run_id, key, step, value, time){_BATCH}{_IF_ADMITTED}
),
summaries AS ({_SUMMARIES_ADMITTED}
),
"""  # noqa: S608
    + WATCHES_WRITTEN.format(quiet="", guard=" AND EXISTS (SELECT FROM admitted)")
    + WATCHES_ANSWER
    + "\nUNION ALL\nSELECT -1, NULL WHERE NOT EXISTS (SELECT FROM admitted)"
)
NOT_ADMITTED_ROW = (-1, None)
INGEST_UPSERT = f"""
WITH written AS (
    INSERT INTO {POINTS_TABLE} AS p (run_id, key, step, value, time){_BATCH}
    ON CONFLICT (run_id, key, step) DO UPDATE
        SET value = EXCLUDED.value, time = EXCLUDED.time
        WHERE p.value <> EXCLUDED.value
    RETURNING p.key, p.step, p.value, p.xmax = 0 AS inserted
)
INSERT INTO {SUMMARY_TABLE} AS s (run_id, key, last, min, max, step, count, stale_from)
SELECT %(run)s, key, (array_agg(value ORDER BY step DESC))[1], min(value), max(value),
    max(step), count(*) FILTER (WHERE inserted), min(step)
FROM written
GROUP BY key
ORDER BY key
{_SUMMARY_UPSERT}"""  # noqa: S608


@dataclass(frozen=True, slots=True)
class KeyFold:
    """One key's share of a batch: what its summary takes from it."""

    key: str
    last: float  # the value at ``step``
    min: float
    max: float
    step: int  # the highest step
    count: int
    first: int  # the lowest step


def points_order_and_fold(batch: PointBatch) -> tuple[PointBatch, list[KeyFold]]:
    """The batch in (key, step) order, and one KeyFold per key. Points of one key usually
    come in step order already; only a key whose steps do not is sorted."""
    keys = batch.keys
    cycle = len(set(keys))
    if 1 < cycle < len(keys) and keys == (keys[:cycle] * (len(keys) // cycle + 1))[: len(keys)]:
        # A trainer logs the same keys at every step, in the same order: the batch is that
        # cycle repeated, and each key's points are every ``cycle``-th, cut by slices.
        groups = {key: slice(at, None, cycle) for at, key in enumerate(keys[:cycle])}
        return _ordered_by_groups(batch, groups)
    by_key: dict[str, list[int]] = {}
    for index, key in enumerate(keys):
        group = by_key.get(key)
        if group is None:
            by_key[key] = [index]
        else:
            group.append(index)
    return _ordered_by_groups(batch, by_key)


def _ordered_by_groups(
    batch: PointBatch, groups: dict[str, Any]
) -> tuple[PointBatch, list[KeyFold]]:
    """The batch put in (key, step) order from the places of each key's points in it (a
    slice, or a list of indices in batch order)."""
    steps, values, times = batch.steps, batch.values, batch.times
    out_keys: list[str] = []
    out_steps: list[int] = []
    out_values: list[float] = []
    out_times: list[float | None] = []
    folds: list[KeyFold] = []
    for key in sorted(groups):
        where = groups[key]
        if type(where) is slice:
            group_steps, group_values, group_times = steps[where], values[where], times[where]
        else:
            pick = itemgetter(*where) if len(where) > 1 else lambda seq, i=where[0]: (seq[i],)
            group_steps, group_values = list(pick(steps)), list(pick(values))
            group_times = list(pick(times))
        if group_steps != sorted(group_steps):  # not in step order (a linear pass if it is)
            by_step = sorted(range(len(group_steps)), key=group_steps.__getitem__)
            group_steps = [group_steps[i] for i in by_step]
            group_values = [group_values[i] for i in by_step]
            group_times = [group_times[i] for i in by_step]
        count = len(group_steps)
        folds.append(
            KeyFold(
                key=key,
                last=group_values[-1],
                min=min(group_values),
                max=max(group_values),
                step=group_steps[-1],
                count=count,
                first=group_steps[0],
            )
        )
        out_keys += [key] * count
        out_steps += group_steps
        out_values += group_values
        out_times += group_times
    return PointBatch(out_keys, out_steps, out_values, out_times), folds


def key_columns(
    ordered: PointBatch, folds: list[KeyFold]
) -> dict[str, tuple[list[int], list[float]]]:
    """Each key's steps and values, in step order, from a batch in (key, step) order and its
    folds (the alerts read them so)."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    at = 0
    for fold in folds:
        out[fold.key] = (ordered.steps[at : at + fold.count], ordered.values[at : at + fold.count])
        at += fold.count
    return out


def ingest_postgresql(
    *,
    run_id: int,
    batch: PointBatch,
    folds: list[KeyFold] | None = None,
    ahead: AlertsAhead | None = None,
    admission: Admission | None = None,
) -> int:
    """Returns how many keys had points inserted or changed. ``batch`` with its ``folds``
    is already in (key, step) order (``points_order_and_fold``); without them it is put so.

    The fresh form is one statement: outside a transaction it runs as its own (autocommit),
    one round trip where BEGIN, the statement and COMMIT took three; inside one, in a
    savepoint, so that a batch meeting stored points leaves the caller's transaction usable.
    With ``ahead`` (the run's alert watches folded ahead, outside a transaction only) the
    fresh statement writes them too, and ``ahead.rows`` holds its answer."""
    ordered = batch
    if folds is None:
        ordered, folds = points_order_and_fold(batch)
    times = ordered.times
    params: dict[str, Any] = {
        "run": Int8(run_id),
        "keys": pg_arrays.text_array_repeated([(f.key, f.count) for f in folds]),
        "steps": pg_arrays.int8_array(ordered.steps),
        "values": pg_arrays.float8_array(ordered.values, nullable=False),
        "times": pg_arrays.float8_array([] if times.count(None) == len(times) else times),
        "fold_keys": pg_arrays.text_array([f.key for f in folds]),
        "fold_last": pg_arrays.float8_array([f.last for f in folds]),
        "fold_min": pg_arrays.float8_array([f.min for f in folds]),
        "fold_max": pg_arrays.float8_array([f.max for f in folds]),
        "fold_step": pg_arrays.int8_array([f.step for f in folds]),
        "fold_count": pg_arrays.int8_array([f.count for f in folds]),
        "fold_first": pg_arrays.int8_array([f.first for f in folds]),
    }
    fresh, fresh_watched = INGEST_FRESH, INGEST_FRESH_WATCHED
    if admission is not None:
        fresh, fresh_watched = INGEST_FRESH_ADMITTED, INGEST_FRESH_WATCHED_ADMITTED
        params.update(
            admit_state=RunState.RUNNING,
            admit_token=admission.token_hash,
            admit_attempt=admission.attempt,
            admit_started=admission.started_at,
            admit_limit=admission.time_limit_seconds,
        )
    with server_binding_cursor() as cursor:
        pg_arrays.register(cursor.cursor)
        try:
            if connection.get_autocommit() and not connection.in_atomic_block:
                if ahead is None:
                    cursor.execute(fresh, params)
                    stood = cursor.rowcount != 0
                else:
                    cursor.execute(fresh_watched, {**params, **ahead.params()})
                    rows = cursor.fetchall()
                    stood = NOT_ADMITTED_ROW not in rows
                    ahead.rows = rows
            else:
                with transaction.atomic():
                    cursor.execute(fresh, params)
                    stood = cursor.rowcount != 0
            if admission is not None and not stood and folds:
                raise NotAdmitted
            return len(folds)
        except IntegrityError:  # some point is stored already: a resent or overlapping batch
            if admission is not None:
                raise NotAdmitted from None
            cursor.execute(INGEST_UPSERT, params)
            return int(cursor.rowcount)


@transaction.atomic
def ingest_portable(*, run_id: int, batch: PointBatch) -> int:
    """Any other database (SQLite, the embedded default): read the stored values of the
    batch's step range, write only what is new or changed, fold those into the summaries."""
    lo, hi = min(batch.steps), max(batch.steps)
    stored = {
        (key, step): value
        for key, step, value in MetricPoint.objects.filter(
            run_id=run_id, key__in=set(batch.keys), step__gte=lo, step__lte=hi
        ).values_list("key", "step", "value")
    }
    now = timezone.now()
    rows: list[MetricPoint] = []
    new: list[bool] = []
    for key, step, value, at in zip(
        batch.keys, batch.steps, batch.values, batch.times, strict=True
    ):
        old = stored.get((key, step))
        if old is not None and old == value:
            continue
        when = now if at is None else datetime.fromtimestamp(at, tz=UTC)
        rows.append(MetricPoint(run_id=run_id, key=key, step=step, value=value, time=when))
        new.append(old is None)
    if not rows:
        return 0
    MetricPoint.objects.bulk_create(
        rows,
        update_conflicts=True,
        unique_fields=["run", "key", "step"],
        update_fields=["value", "time"],
        batch_size=500,
    )
    by_key: dict[str, list[tuple[MetricPoint, bool]]] = {}
    for row, is_new in zip(rows, new, strict=True):
        by_key.setdefault(row.key, []).append((row, is_new))
    existing = {
        s.key: s
        for s in MetricSummary.objects.select_for_update().filter(run_id=run_id, key__in=by_key)
    }
    summaries = []
    for key, group in by_key.items():
        newest = max((row for row, _ in group), key=lambda row: row.step)
        low = min(row.value for row, _ in group)
        high = max(row.value for row, _ in group)
        first = min(row.step for row, _ in group)
        added = sum(is_new for _, is_new in group)
        summary = existing.get(key)
        if summary is None:
            summary = MetricSummary(
                run_id=run_id,
                key=key,
                last=newest.value,
                min=low,
                max=high,
                step=newest.step,
                count=added,
                stale_from=first,
            )
        else:
            if newest.step >= summary.step:
                summary.last, summary.step = newest.value, newest.step
            summary.min, summary.max = min(summary.min, low), max(summary.max, high)
            summary.count += added
            summary.stale_from = (
                first if summary.stale_from is None else min(summary.stale_from, first)
            )
        summaries.append(summary)
    MetricSummary.objects.bulk_create(
        summaries,
        update_conflicts=True,
        unique_fields=["run", "key"],
        update_fields=["last", "min", "max", "step", "count", "stale_from"],
    )
    return len(by_key)


def run_sign_of_life(
    *, run_id: int, last: datetime | None = None, admission: Admission | None = None
) -> None:
    """A running run's write is a sign of life, as good as a heartbeat: a job that reports
    metrics (through any door) is not silent, whether or not it sends heartbeats too, and
    the reconciler and the silence alert count it. At most one row written per
    ``SIGN_OF_LIFE_EVERY``; no query at all when ``last``, the heartbeat as the caller read
    the run, is that recent."""
    now = timezone.now()
    if last is not None and now - last < SIGN_OF_LIFE_EVERY:
        return
    running = Run.objects.filter(pk=run_id, state=RunState.RUNNING)
    if admission is not None:  # only the attempt whose token it is
        running = running.filter(token_hash=admission.token_hash, attempt=admission.attempt)
    running.filter(
        Q(heartbeat_at__isnull=True) | Q(heartbeat_at__lt=now - SIGN_OF_LIFE_EVERY)
    ).update(heartbeat_at=now)
    if admission is not None:
        tokens.admission_heard(admission=admission, at=now)


def run_heartbeat(*, run_id: int) -> Run:
    """A runner's sign of life; answers whether a cancel was requested."""
    updated = Run.objects.filter(pk=run_id, state=RunState.RUNNING).update(
        heartbeat_at=timezone.now()
    )
    run = Run.objects.get(pk=run_id)
    if not updated:
        raise NotRunning(f"Run {run_id} is {run.state}; only a running run sends heartbeats.")
    return run
