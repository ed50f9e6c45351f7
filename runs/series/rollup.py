"""Keeping the rollup: a (run, key)'s buckets rebuilt from its points from the stale step on,
a run's stale keys, the periodic sweep, and the debounced ask for a refresh after an ingest."""

from __future__ import annotations

import logging

import numpy as np
from django.conf import settings
from django.core.cache import cache
from django.db import transaction

from marin_site.nudges import task_send
from runs.metrics import steady
from runs.models import MetricPoint, MetricSeries, MetricSummary
from runs.series.buckets import COARSE, Buckets, width_for

logger = logging.getLogger(__name__)


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
        transaction.on_commit(
            lambda: task_send("runs.series_refresh", countdown=delay, run_id=run_id), robust=True
        )


def series_refresh_now(*, run_id: int) -> None:
    """Ask for a refresh of the run's series at once (a run that ended)."""
    task_send("runs.series_refresh", countdown=0, run_id=run_id)
