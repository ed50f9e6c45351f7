"""Steady-state summaries of throughput metrics: tokens/s and MFU as the median after a
warm-up, not the last step.

A run's first steps are slow (compilation, allocation, caches filling) and any single step
can stall, so the last value says little about a run's speed. For every key under
``STEADY_STATE_PREFIX`` the series refresh stores in ``MetricSummary.steady`` the median of
the points after the warm-up, and the result tables read that instead of ``last``.

The warm-up is the recipe's (the steps up to and including it are warm-up): the key's own
``warmup_steps`` in the recipe's metric declarations (``runs.metrics.declarations``), else
``steady_state_warmup_steps`` in its compute model, for every steady-state key. A recipe
that declares neither loses the first ``DEFAULT_WARMUP_FRACTION`` of the key's step range. A run with no point past its warm-up (a
run shorter than it) gets the median of all its points.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from django.db import connection

from runs.metrics.declarations import declarations_parse
from runs.models import MetricPoint, Run
from runs.specs.compute import WARMUP_KEY, warmup_problems

STEADY_STATE_PREFIX = "throughput/"
DEFAULT_WARMUP_FRACTION = 0.1


def is_steady_state_key(key: str) -> bool:
    return key.startswith(STEADY_STATE_PREFIX)


def warmup_last_step(
    *,
    compute_model: Mapping[str, Any] | None,
    first_step: int,
    last_step: int,
    declared_steps: int | None = None,
) -> int:
    """The last step of the warm-up: steps after it are the steady state. The key's
    declared ``warmup_steps`` first, then the compute model's, then a tenth of the steps."""
    for declared in (declared_steps, (compute_model or {}).get(WARMUP_KEY)):
        if declared is not None and not warmup_problems(declared):
            return int(declared)
    return first_step + math.floor(DEFAULT_WARMUP_FRACTION * (last_step - first_step))


MEDIAN_SQL = f"""
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY value)
FROM {MetricPoint._meta.db_table}
WHERE run_id = %s AND key = %s AND step > %s
"""  # noqa: S608  (the table name is ours; values are parameters)


def _median_after(*, run_id: int, key: str, after_step: int) -> float | None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(MEDIAN_SQL, [run_id, key, after_step])
            row = cursor.fetchone()
        return None if row is None or row[0] is None else float(row[0])
    values = list(
        MetricPoint.objects.filter(run_id=run_id, key=key, step__gt=after_step).values_list(
            "value", flat=True
        )
    )
    return float(np.median(values)) if values else None


def steady_median(*, run_id: int, key: str, first_step: int, last_step: int) -> float | None:
    """The median of a run's ``key`` after its recipe's warm-up (every point's median when
    none is past it); None without points."""
    compute_model, metrics = (
        Run.objects.filter(pk=run_id)
        .values_list("plan__recipe__compute_model", "plan__recipe__metrics")
        .first()
    ) or (None, None)
    declaration = declarations_parse(metrics).get(key)
    after = warmup_last_step(
        compute_model=compute_model if isinstance(compute_model, dict) else None,
        first_step=first_step,
        last_step=last_step,
        declared_steps=declaration.warmup_steps if declaration is not None else None,
    )
    median = _median_after(run_id=run_id, key=key, after_step=after)
    if median is None and after >= first_step:
        median = _median_after(run_id=run_id, key=key, after_step=first_step - 1)
    return median


def summary_value(*, key: str, last: float, steady: float | None) -> float:
    """What a table shows for a key: the steady-state median of a throughput key when it is
    known, else the last value."""
    return steady if steady is not None and is_steady_state_key(key) else last
