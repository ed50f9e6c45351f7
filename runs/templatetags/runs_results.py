"""The results section other pages include (the proposal page): the run table, the charts,
the scaling ladder; and the filters their templates format numbers and links with."""

from __future__ import annotations

from typing import Any

from django import template
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from marin_site import links
from runs.metrics.declarations import MetricDeclaration
from runs.metrics.steady import is_steady_state_key
from runs.models import Plan
from runs.results import presentation, run_table
from runs.results.ladder import (
    EXPONENT_STANDARD_ERRORS,
    IRREDUCIBLE_LAW,
    MIN_R_SQUARED,
    MIN_SCALES_FOR_IRREDUCIBLE,
    MIN_SCALES_FOR_MULTIPLIER,
)

register = template.Library()


@register.filter
def link_href(value: Any) -> str:
    """Today's address of a link kept as a canonical id (``wandb:...``, ``gh:...#N``), or an
    address as it is; empty for anything else (``speedrun:...`` names a source, no page)."""
    text = str(value or "")
    href = links.link_url(text)
    if href:
        return href
    return text if text.startswith(("https://", "http://")) else ""


LADDER_RULES = {
    "irreducible_from": MIN_SCALES_FOR_IRREDUCIBLE,
    "min_scales": MIN_SCALES_FOR_MULTIPLIER,
    "min_r_squared": MIN_R_SQUARED,
    "exponent_se": f"{EXPONENT_STANDARD_ERRORS:g}",
}


def series_url(plan_id: int) -> str:
    """The downsampled series of a plan's runs (the runs API, ``/api/v1/plans/<id>/series/``)."""
    return f"{reverse('api-root')}plans/{plan_id}/series/"


@register.inclusion_tag("runs/_results.html", takes_context=True)
def plan_results(
    context: template.Context, plan: Plan | None, live_url: str = ""
) -> dict[str, Any]:
    """``{% plan_results proposal.plan live_url %}``: the live report of a launched plan.
    ``live_url`` answers the page's poll (the run table, and whatever else of the page
    follows the runs: ``proposals.live``); the plan's run table alone without it."""
    if plan is None:
        return {"table": None}
    request = context.get("request")
    query = request.GET if request is not None else None
    table = run_table.plan_run_table(
        plan=plan,
        sort=str(query.get("sort", "")) if query else "",
        group=str(query.get("group", "")) if query else "",
        columns=run_table.columns_parse(query.getlist("columns")) if query else [],
    )
    ladder = run_table.table_ladder(table)
    launch = table.launch
    criteria = (getattr(launch, "criteria", None) or {}) if launch is not None else {}
    summary = (getattr(launch, "summary", None) or {}) if launch is not None else {}
    return {
        "table": table,
        "launch": launch,
        "verdict_rule": criteria.get("rule") if isinstance(criteria, dict) else None,
        "verdicts": summary.get("verdicts") if isinstance(summary, dict) else None,
        "ladder": ladder,
        "ladder_data": {**ladder.chart_data(), "title": table.display(ladder.metric).title}
        if ladder
        else None,
        "ladder_rules": LADDER_RULES,
        "irreducible_law": IRREDUCIBLE_LAW,
        "table_url": live_url or reverse("plan-run-table", kwargs={"plan_id": plan.pk}),
        "series_url": f"{series_url(plan.pk)}?{run_table.series_query(table.chart_keys)}",
        "png_url": reverse("plan-loss-png", kwargs={"plan_id": plan.pk}),
        "results_config": {"plan": plan.pk, "pollMs": run_table.POLL_MILLISECONDS, "runAxes": {}},
    }


@register.filter
def verdict(code: Any) -> str:
    """A suggested verdict in words (``runs.results.presentation.verdict_text``)."""
    return presentation.verdict_text(code)


def _metric(spec: Any) -> tuple[str, MetricDeclaration | None]:
    """A filter's argument: a metric key, or a recipe's declaration of one."""
    if isinstance(spec, MetricDeclaration):
        return spec.key, spec
    return str(spec), None


@register.filter
def metric(value: Any, spec: Any) -> str:
    """A final metric as the table shows it, in its declared unit when ``spec`` is a
    declaration (``runs.results.presentation.metric_text``)."""
    return presentation.metric_text(value, *_metric(spec))


@register.filter
def metric_label(spec: Any) -> str:
    """A metric's heading: its declared display name and unit, else its key."""
    return presentation.metric_label(*_metric(spec))


@register.filter
def better(spec: Any) -> str:
    """Which way a declared metric is better, in words."""
    return presentation.direction_text(_metric(spec)[1])


@register.filter
def spread(group: Any, spec: Any) -> str:
    """A variant's metric over its seeds (a ``runs.results.seeds`` group): mean ± sample std
    (``runs.results.presentation.spread_text``)."""
    key, declaration = _metric(spec)
    stats = (group.get("stats") or {}).get(key) if isinstance(group, dict) else None
    return presentation.spread_text(stats, key, declaration)


def _two_lines(text: str) -> SafeString:
    """``3.0100 ± 0.0141`` with the part from ``±`` on a line of its own in a narrow table
    cell (the text reads the same)."""
    head, sep, tail = text.partition(" ± ")
    if not sep:
        return format_html("{}", text)
    return format_html('{}<span class="spread-sd"> ± {}</span>', head, tail)


@register.filter
def spread_cell(group: Any, spec: Any) -> SafeString:
    """``spread`` for the seed table's narrow cells: the ± part on its own line."""
    return _two_lines(spread(group, spec))


@register.filter
def delta_cell(group: Any, spec: Any) -> SafeString:
    """``delta`` for the seed table's narrow cells: the ± part on its own line."""
    return _two_lines(delta(group, spec))


@register.filter
def delta(group: Any, spec: Any) -> str:
    """A variant's difference from the baseline, ± its standard error when it is known
    (``runs.results.presentation.delta_text``)."""
    if not isinstance(group, dict):
        return "–"
    return presentation.delta_text(group.get("delta"), group.get("delta_se"), *_metric(spec))


@register.filter
def steady_key(key: Any) -> bool:
    """Whether a metric key is summarised by its steady-state median (throughput, MFU)."""
    return isinstance(key, str) and is_steady_state_key(key)


@register.filter
def sci(value: Any) -> str:
    """Large counts (FLOPs) as 3.2e+18 (``runs.results.presentation.flops_text``)."""
    return presentation.flops_text(value)


@register.filter
def times(value: Any) -> str:
    """A compute multiplier: 1.37 followed by a times sign (``presentation.multiplier_text``)."""
    return presentation.multiplier_text(value)


@register.filter
def exponent(fit: Any) -> str:
    """A ladder fit's exponent ± its standard error (``runs.results.presentation.exponent_text``)."""
    return presentation.exponent_text(
        getattr(fit, "exponent", None), getattr(fit, "exponent_se", None)
    )


@register.filter
def r_squared(value: Any) -> str:
    return presentation.r_squared_text(value)


@register.filter
def http_url(value: Any) -> str:
    """The URL when it is http(s), else nothing: a link never runs a script."""
    text = str(value or "")
    return text if text.lower().startswith(("https://", "http://")) else ""


@register.filter
def config_value(value: Any) -> str:
    return presentation.value_text(value)
