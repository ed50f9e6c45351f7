"""Render user-written markdown, then sanitize the HTML (nh3) before it reaches a page."""

from __future__ import annotations

from functools import lru_cache

import markdown as md
import nh3
from django.utils.safestring import SafeString, mark_safe

ALLOWED_TAGS = {
    "a",
    "abbr",
    "b",
    "blockquote",
    "br",
    "code",
    "dd",
    "del",
    "details",
    "div",
    "dl",
    "dt",
    "em",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "hr",
    "i",
    "img",
    "ins",
    "kbd",
    "li",
    "ol",
    "p",
    "pre",
    "s",
    "span",
    "strong",
    "sub",
    "summary",
    "sup",
    "table",
    "tbody",
    "td",
    "th",
    "thead",
    "tr",
    "ul",
}
ALLOWED_ATTRIBUTES = {
    "a": {"href", "title"},
    "img": {"src", "alt", "title"},
    "abbr": {"title"},
    "td": {"align"},
    "th": {"align"},
    "code": {"class"},
}
URL_SCHEMES = {"http", "https", "mailto"}
EXTENSIONS = ["fenced_code", "tables", "sane_lists", "nl2br"]


MEMO_MAX_CHARS = 32_000


def render_markdown(text: str) -> SafeString:
    """Markdown to HTML that is safe to put in a page, whatever the input.

    The output depends on the text alone, so texts of ordinary size are remembered
    (a bounded LRU per process): a list of 25 proposals does not build 25 Markdown parsers
    on every request.
    """
    text = text or ""
    if len(text) <= MEMO_MAX_CHARS:
        return mark_safe(_render_memo(text))  # noqa: S308 (sanitized by nh3 in _render)
    return mark_safe(_render(text))  # noqa: S308 (sanitized by nh3 in _render)


@lru_cache(maxsize=2048)
def _render_memo(text: str) -> str:
    return _render(text)


def _render(text: str) -> str:
    html = md.markdown(text, extensions=EXTENSIONS, output_format="html")
    return nh3.clean(
        html,
        tags=ALLOWED_TAGS,
        attributes=ALLOWED_ATTRIBUTES,
        url_schemes=URL_SCHEMES,
        link_rel="nofollow noopener noreferrer",
        strip_comments=True,
    )
