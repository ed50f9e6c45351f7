"""Template helpers for pages outside runs that show a plan's runs (the proposal page)."""

from __future__ import annotations

from typing import Any

from django import template

from runs import selectors
from runs.models import PlanLaunch

register = template.Library()


@register.simple_tag
def plan_runs(plan_id: int | None) -> list[Any]:
    """The plan's runs with their per-key summaries, or [] before launch."""
    if plan_id is None:
        return []
    return list(selectors.plan_runs(plan_id=plan_id).prefetch_related("summaries"))


@register.simple_tag
def plan_launch(plan_id: int | None) -> PlanLaunch | None:
    if plan_id is None:
        return None
    return PlanLaunch.objects.filter(plan_id=plan_id).first()


@register.filter
def summary_value(run: Any, key: str) -> float | None:
    for summary in run.summaries.all():
        if summary.key == key:
            return float(summary.last)
    value = (run.final_metrics or {}).get(key)
    return value if isinstance(value, int | float) else None
