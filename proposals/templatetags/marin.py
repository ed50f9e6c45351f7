"""Template filters: sanitized markdown, FLOPs and hours in human units, JSON values."""

from __future__ import annotations

import json
from typing import Any

from django import template
from django.utils.safestring import SafeString

from proposals.markdown import plain_text, render_markdown

register = template.Library()


@register.filter(name="markdown")
def markdown_filter(text: str) -> SafeString:
    return render_markdown(text)


@register.filter
def markdown_text(text: str) -> str:
    """Markdown as plain text, for snippets: rendered (and sanitized), then the tags
    dropped and the entities decoded; the template escapes the result like any text."""
    return plain_text(text)


@register.filter
def flops(value: float | None) -> str:
    """3.6e+16 -> '3.60e16 FLOPs'."""
    if value is None:
        return "–"
    mantissa, exponent = f"{value:.2e}".split("e")
    return f"{mantissa}e{int(exponent)} FLOPs"


@register.filter
def hours(value: float | None) -> str:
    if value is None:
        return "–"
    if value >= 100:
        return f"{value:,.0f} h"
    if value >= 1:
        return f"{value:.1f} h"
    return f"{value:.3g} h"


@register.filter
def as_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


@register.filter
def percent_of(value: float | None, total: float | None) -> str:
    if not value or not total:
        return "–"
    return f"{100 * value / total:.0f}%"


@register.filter
def entries(mapping: dict[str, Any] | None) -> list[tuple[str, Any]]:
    """Key-value pairs of a dict, safe for keys such as 'items' that shadow methods."""
    return sorted((mapping or {}).items())


@register.simple_tag(takes_context=True)
def page_link(context: dict[str, Any], number: int) -> str:
    """``?...&page=N``: this page's query string (filters, search, tab) with another page."""
    query = context["request"].GET.copy()
    query["page"] = number
    return "?" + query.urlencode()
