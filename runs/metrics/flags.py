"""Flags on keys whose logged values do not fit their declaration.

A fraction logged as 250, a percent as 2287: the points are stored as logged (the declaration
may be the mistake, and the trainer's numbers are never lost) and the key is flagged, once per
run and key (``MetricFlag``), with a row on the run's timeline. The run page lists open flags;
the plan's verdict leaves a flagged key's value out (``runs.results.summary.final_metrics``).

A flag is resolved when the key's stored values fit its declaration again: a maintainer
corrected the recipe (``recipe_update`` calls ``flags_recheck``), and every page re-reads the
stored values under the new unit (``runs.metrics.display``). Values that stop fitting later
open it again, with a new timeline row.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import transaction
from django.db.models import F, Max, Min
from django.utils import timezone

from marin_site.doors import Door
from marin_site.events import Verb
from runs.metrics import declarations as metric_declarations
from runs.metrics.declarations import UnitMisfit
from runs.models import MetricFlag, MetricPoint, Recipe, Run, RunEvent


def flags_record(*, run: Run, misfits: list[UnitMisfit], door: str = Door.SYSTEM) -> None:
    """Flag each misfit key of ``run`` that has no open flag (one row, one timeline entry)."""
    if not misfits:
        return
    with transaction.atomic():
        known = {
            flag.key: flag
            for flag in MetricFlag.objects.select_for_update().filter(
                run_id=run.pk, key__in=[m.key for m in misfits]
            )
        }
        for misfit in misfits:
            flag = known.get(misfit.key)
            if flag is not None and flag.resolved_at is None:
                continue
            if flag is None:
                flag = MetricFlag(run_id=run.pk, key=misfit.key)
            flag.reason, flag.step = misfit.reason[:500], misfit.step
            flag.value, flag.unit, flag.resolved_at = misfit.value, misfit.unit, None
            flag.save()
            RunEvent.build(
                run=run,
                verb=Verb.METRIC_FLAGGED,
                door=door,
                message=f"{misfit.reason[:400]}: stored as logged and flagged; the verdict "
                "leaves it out until the declaration or the values agree",
            ).save(force_insert=True)


def flags_open(*, run_ids: Iterable[int]) -> dict[int, set[str]]:
    """The keys with an open flag, by run."""
    open_keys: dict[int, set[str]] = {}
    for run_id, key in MetricFlag.objects.filter(
        run_id__in=list(run_ids), resolved_at__isnull=True
    ).values_list("run_id", "key"):
        open_keys.setdefault(run_id, set()).add(key)
    return open_keys


def run_flags(*, run_id: int) -> list[MetricFlag]:
    """A run's flags, open ones first, for its page."""
    return list(
        MetricFlag.objects.filter(run_id=run_id).order_by(
            F("resolved_at").desc(nulls_first=True), "key"
        )
    )


def flags_recheck(*, recipe: Recipe, door: str = Door.SYSTEM) -> int:
    """Re-read the stored values of every open flag of ``recipe``'s runs under its current
    declarations; resolve those that fit now. Returns how many were resolved."""
    metric_declarations.declarations_forget()
    declared = metric_declarations.declarations_parse(recipe.metrics or [])
    flags = list(
        MetricFlag.objects.filter(
            resolved_at__isnull=True,
            run__recipe_name=recipe.name,
            run__recipe_version=recipe.version,
        ).select_related("run")
    )
    resolved = 0
    for flag in flags:
        bounds = MetricPoint.objects.filter(run_id=flag.run_id, key=flag.key).aggregate(
            low=Min("value"), high=Max("value")
        )
        low, high = bounds["low"], bounds["high"]
        if low is not None and not metric_declarations.value_fits(
            declared.get(flag.key), low, high
        ):
            continue
        flag.resolved_at = timezone.now()
        flag.save(update_fields=["resolved_at"])
        RunEvent.build(
            run=flag.run,
            verb=Verb.METRIC_FLAG_RESOLVED,
            door=door,
            message=f"{flag.key}: its stored values fit the recipe's declaration now",
        ).save(force_insert=True)
        resolved += 1
    return resolved
