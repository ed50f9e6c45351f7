"""Template filters: sanitized markdown, FLOPs and hours in human units, JSON values."""

from __future__ import annotations

import functools
import json
from typing import Any

from django import template
from django.template.defaulttags import CsrfTokenNode
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
    def __init__(
        self, name: template.base.FilterExpression, nodelist: template.NodeList, csrf: bool
    ) -> None:
        self.name = name
        self.nodelist = nodelist
        self.csrf = csrf

    def render(self, context: template.Context) -> str:
        fragments = context.get("fragments")
        name = self.name.resolve(context) if fragments is not None else None
        if fragments is None or not name:
            return self.nodelist.render(context)
        if not self.csrf:
            return fragments.get_or_render(str(name), lambda: self.nodelist.render(context))

        def render_marked() -> str:
            with context.push(csrf_token=CSRF_MARK):
                return self.nodelist.render(context)

        html = fragments.get_or_render(str(name), render_marked)
        return html.replace(_csrf_input_marked(), CsrfTokenNode().render(context))


# The token a kept fragment's forms carry in place of the reader's: the {% csrf_token %} of
# this one request replaces the whole hidden input at every use, so no reader is ever given
# another's token (or one of an earlier request).
CSRF_MARK = "csrf-token-of-the-request"


@functools.cache
def _csrf_input_marked() -> str:
    return str(CsrfTokenNode().render(template.Context({"csrf_token": CSRF_MARK})))


@register.tag
def fragment(parser: template.base.Parser, token: template.base.Token) -> FragmentNode:
    """``{% fragment "reviews" %}...{% endfragment %}``: a part of a page from the view's
    ``fragments`` (``marin_site.fragments.Fragments``) when current, else rendered and kept.
    Without ``fragments`` in the context, or with an empty name, just rendered.

    What the fragment shows is what its name and versions say: a fragment for every reader
    shows nothing of the reader, and one of a reader's own (the page header, their controls)
    is named after them by the view. ``{% fragment NAME csrf %}`` may hold forms: their CSRF
    token is kept as a mark, and this request's token is put in its place."""
    bits = token.split_contents()
    if len(bits) not in {2, 3} or (len(bits) == 3 and bits[2] != "csrf"):
        raise template.TemplateSyntaxError("{% fragment NAME [csrf] %} takes a name")
    nodelist = parser.parse(("endfragment",))
    parser.delete_first_token()
    return FragmentNode(parser.compile_filter(bits[1]), nodelist, csrf=len(bits) == 3)


@register.simple_tag
def path(name: str) -> str:
    """``{% url NAME %}`` for a view that takes no arguments, reversed once per process (the
    page header names a dozen of them on every page)."""
    return _path(name, get_urlconf(), get_script_prefix())


@functools.lru_cache(maxsize=256)
def _path(name: str, urlconf: str | None, prefix: str) -> str:
    return reverse(name, urlconf=urlconf)
