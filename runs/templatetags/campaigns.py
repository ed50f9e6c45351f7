"""Filters of the campaign pages (token counts, durations) and the home page's list of
active campaigns."""

from __future__ import annotations

from typing import Any

from django import template

from runs.campaigns import selectors
from runs.results import presentation

register = template.Library()


@register.filter
def tokens_text(value: Any) -> str:
    """1.2T, 350B, 42M: token counts as people say them."""
    if not presentation.is_number(value):
        return "–"
    for size, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:.0f}"


@register.filter
def flops_text(value: Any) -> str:
    return presentation.flops_text(value) if presentation.is_number(value) else "–"


@register.filter
def percent(value: Any) -> str:
    return f"{100 * value:.1f}%" if presentation.is_number(value) else "–"


@register.filter
def rate_text(value: Any) -> str:
    return f"{value:,.0f}" if presentation.is_number(value) else "–"


@register.filter
def duration_text(seconds: Any) -> str:
    """3 d 4 h, 5 h 12 min, 40 min; a dash when unknown."""
    if not presentation.is_number(seconds):
        return "–"
    minutes = int(seconds // 60)
    days, rest = divmod(minutes, 24 * 60)
    hours, minutes = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min"


@register.inclusion_tag("runs/campaigns/_cards.html")
def active_campaigns() -> dict[str, Any]:
    return {"campaigns": list(selectors.campaign_list(active_only=True)[:6])}
