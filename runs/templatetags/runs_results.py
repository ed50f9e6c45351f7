"""The results section other pages include (the proposal page): the run table, the charts,
the scaling ladder; and the filters their templates format numbers and links with."""

from __future__ import annotations

import math
from typing import Any

from django import template
from django.urls import reverse

from runs import run_table
from runs.models import Plan

register = template.Library()


def series_url(plan_id: int) -> str:
    """The downsampled series of a plan's runs (the runs API, ``/api/v1/plans/<id>/series/``)."""
    return f"{reverse('api-root')}plans/{plan_id}/series/"


@register.inclusion_tag("runs/_results.html", takes_context=True)
def plan_results(context: template.Context, plan: Plan | None) -> dict[str, Any]:
    """``{% plan_results proposal.plan %}``: the live report of a launched plan."""
    if plan is None:
        return {"table": None}
    request = context.get("request")
    query = request.GET if request is not None else {}
    table = run_table.plan_run_table(
        plan=plan, sort=str(query.get("sort", "")), group=str(query.get("group", ""))
    )
    ladder = run_table.table_ladder(table)
    return {
        "table": table,
        "launch": table.launch,
        "ladder": ladder,
        "ladder_data": ladder.chart_data() if ladder else None,
        "table_url": reverse("plan-run-table", kwargs={"plan_id": plan.pk}),
        "series_url": f"{series_url(plan.pk)}?{run_table.series_query(table.chart_keys)}",
        "png_url": reverse("plan-loss-png", kwargs={"plan_id": plan.pk}),
        "results_config": {"plan": plan.pk, "pollMs": run_table.POLL_MILLISECONDS, "runAxes": {}},
    }


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@register.filter
def metric(value: Any, key: str) -> str:
    """A final metric as the table shows it: MFU in percent, tokens/s whole, losses to 4 places."""
    if not _number(value):
        return "–"
    if key.endswith("mfu"):
        return f"{100 * value:.1f}%"
    if key.endswith("tokens_per_second"):
        return f"{value:,.0f}"
    if "fraction" in key:
        return f"{value:.3f}"
    return f"{value:.4f}" if abs(value) < 1000 else f"{value:.4g}"


@register.filter
def metric_in_unit(value: Any, declaration: Any) -> str:
    """A value of a declared metric in its unit (``runs.metric_declarations``): fractions and
    percents as percents, throughput whole, times in seconds; undeclared keys as ``metric``."""
    unit = getattr(declaration, "unit", "")
    if not _number(value):
        return "–"
    if unit == "fraction":
        return f"{100 * value:.1f} %"
    if unit == "percent":
        return f"{value:.1f} %"
    if unit == "tokens/s":
        return f"{value:,.0f} tokens/s"
    if unit == "seconds":
        return f"{value:,.1f} s"
    if unit in {"tokens", "count", "bytes"}:
        return f"{value:,.0f}" if abs(value) < 1e12 else f"{value:.3g}"
    if unit == "flops":
        return f"{value:.3g}"
    return metric(value, str(getattr(declaration, "key", "")))


@register.filter
def sci(value: Any) -> str:
    """Large counts (FLOPs) as 3.2e+18."""
    return f"{value:.3g}" if _number(value) else "–"


@register.filter
def times(value: Any) -> str:
    """A compute multiplier: 1.37 followed by a times sign."""
    return f"{value:.2f}×" if _number(value) else "–"


@register.filter
def http_url(value: Any) -> str:
    """The URL when it is http(s), else nothing: a link never runs a script."""
    text = str(value or "")
    return text if text.lower().startswith(("https://", "http://")) else ""


@register.filter
def config_value(value: Any) -> str:
    return run_table.display(value)
