"""Render user-written markdown, then sanitize the HTML (nh3) before it reaches a page.

Images load only from the hosts in ``settings.MARKDOWN_IMAGE_HOSTS`` (the Content-Security-
Policy names the same hosts): a reader's browser never fetches from a host a proposal's author
picked. Any other markdown image becomes a link to it, and a raw ``<img>`` loses its ``src``.
"""

from __future__ import annotations

import html
import xml.etree.ElementTree as ET
from functools import lru_cache
from urllib.parse import urlsplit

import markdown as md
import nh3
from django.conf import settings
from django.utils.safestring import SafeString, mark_safe
from markdown.extensions import Extension
from markdown.treeprocessors import Treeprocessor

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


def image_allowed(src: str, hosts: frozenset[str]) -> bool:
    """A site-relative path, or https from one of the allowed hosts."""
    parts = urlsplit(src.strip())
    if not parts.scheme and not parts.netloc:
        return src.strip().startswith("/") and not src.strip().startswith("//")
    return parts.scheme == "https" and (parts.hostname or "") in hosts


class _ImagesAsLinks(Treeprocessor):
    def __init__(self, md_instance: md.Markdown, hosts: frozenset[str]) -> None:
        super().__init__(md_instance)
        self.hosts = hosts

    def run(self, root: ET.Element) -> None:
        for image in root.iter("img"):
            src = image.get("src", "")
            if image_allowed(src, self.hosts):
                continue
            text = image.get("alt") or f"image: {src}"
            image.attrib.clear()
            image.tag = "a"
            image.set("href", src)
            image.text = text


class ImagesAsLinks(Extension):
    def __init__(self, hosts: frozenset[str]) -> None:
        super().__init__()
        self.hosts = hosts

    def extendMarkdown(self, md_instance: md.Markdown) -> None:  # noqa: N802 (Markdown's name)
        md_instance.treeprocessors.register(_ImagesAsLinks(md_instance, self.hosts), "images", 0)


MEMO_MAX_CHARS = 32_000


def render_markdown(text: str) -> SafeString:
    """Markdown to HTML that is safe to put in a page, whatever the input.

    The output depends on the text alone, so texts of ordinary size are remembered
    (a bounded LRU per process): a list of 25 proposals does not build 25 Markdown parsers
    on every request.
    """
    text = text or ""
    hosts = frozenset(settings.MARKDOWN_IMAGE_HOSTS)
    if len(text) <= MEMO_MAX_CHARS:
        return mark_safe(_render_memo(text, hosts))  # noqa: S308 (sanitized by nh3 in _render)
    return mark_safe(_render(text, hosts))  # noqa: S308 (sanitized by nh3 in _render)


@lru_cache(maxsize=2048)
def _render_memo(text: str, hosts: frozenset[str]) -> str:
    return _render(text, hosts)


def _render(text: str, hosts: frozenset[str]) -> str:
    html = md.markdown(text, extensions=[*EXTENSIONS, ImagesAsLinks(hosts)], output_format="html")

    def drop_foreign_images(element: str, attribute: str, value: str) -> str | None:
        if element == "img" and attribute == "src" and not image_allowed(value, hosts):
            return None
        return value

    return nh3.clean(
        html,
        tags=ALLOWED_TAGS,
        attributes=ALLOWED_ATTRIBUTES,
        url_schemes=URL_SCHEMES,
        link_rel="nofollow noopener noreferrer",
        strip_comments=True,
        attribute_filter=drop_foreign_images,
    )


def plain_text(text: str) -> str:
    """What a reader of the rendered markdown sees, as one line of text: ``**Keep** it`` is
    ``Keep it``, a link is its words, a code span its code. For snippets and summaries."""
    rendered = nh3.clean(str(render_markdown(text or "")), tags=set(), attributes={})
    return " ".join(html.unescape(rendered).split())
