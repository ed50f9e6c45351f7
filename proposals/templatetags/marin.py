"""Template filters: sanitized markdown, FLOPs and hours in human units, JSON values."""

from __future__ import annotations

import functools
import json
from typing import Any

from django import template
from django.urls import get_script_prefix, get_urlconf, reverse
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


class FragmentNode(template.Node):
    def __init__(self, name: template.base.FilterExpression, nodelist: template.NodeList) -> None:
        self.name = name
        self.nodelist = nodelist

    def render(self, context: template.Context) -> str:
        fragments = context.get("fragments")
        if fragments is None:
            return self.nodelist.render(context)
        name = str(self.name.resolve(context))
        return fragments.get_or_render(name, lambda: self.nodelist.render(context))


@register.tag
def fragment(parser: template.base.Parser, token: template.base.Token) -> FragmentNode:
    """``{% fragment "reviews" %}...{% endfragment %}``: a part of a page that is the same for
    every reader, from the view's ``fragments`` (``marin_site.fragments.Fragments``) when
    current, else rendered and kept. Without ``fragments`` in the context, just rendered.
    Nothing inside may depend on the reader (their name, controls, CSRF token)."""
    bits = token.split_contents()
    if len(bits) != 2:
        raise template.TemplateSyntaxError("{% fragment NAME %} takes one argument")
    nodelist = parser.parse(("endfragment",))
    parser.delete_first_token()
    return FragmentNode(parser.compile_filter(bits[1]), nodelist)


@register.simple_tag
def path(name: str) -> str:
    """``{% url NAME %}`` for a view that takes no arguments, reversed once per process (the
    page header names a dozen of them on every page)."""
    return _path(name, get_urlconf(), get_script_prefix())


@functools.lru_cache(maxsize=256)
def _path(name: str, urlconf: str | None, prefix: str) -> str:
    return reverse(name, urlconf=urlconf)
