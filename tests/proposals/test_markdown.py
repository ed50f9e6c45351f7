"""User-written markdown is rendered, then sanitized: no vector survives as live HTML."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from proposals.markdown import render_markdown

XSS_VECTORS = [
    "<script>alert(1)</script>",
    "[click](javascript:alert(1))",
    "[click](JaVaScRiPt:alert(1))",
    "[click](  javascript:alert(1))",
    '<a href="javascript:alert(1)">x</a>',
    '<img src="x" onerror="alert(1)">',
    '<div onmouseover="alert(1)">hover</div>',
    '<svg onload="alert(1)"><circle r="1"/></svg>',
    "<svg><script>alert(1)</script></svg>",
    '<iframe src="https://evil.example/"></iframe>',
    '<iframe srcdoc="<script>alert(1)</script>"></iframe>',
    '<object data="evil.swf"></object>',
    '<a href="data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==">x</a>',
    '<style>body{background:url("javascript:alert(1)")}</style>',
    '<p style="background:url(javascript:alert(1))">x</p>',
    '<form action="https://evil.example"><input name="q"></form>',
    "<math><mtext><table><mglyph><style><img src=x onerror=alert(1)>",
    '![x](x" onerror="alert(1))',
]


class LiveHtml(HTMLParser):
    """Collects what a browser would act on: dangerous tags, handlers, script URLs."""

    DANGEROUS_TAGS = {
        "script",
        "iframe",
        "svg",
        "object",
        "embed",
        "style",
        "form",
        "math",
        "input",
    }

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.DANGEROUS_TAGS:
            self.found.append(f"<{tag}>")
        for name, value in attrs:
            if name.startswith("on") or name in {"style", "srcdoc", "formaction"}:
                self.found.append(f"{tag}[{name}]")
            url = (value or "").strip().lower().replace("\t", "").replace("\n", "")
            has_scheme = ":" in url.split("/")[0]
            safe = url.startswith(("http://", "https://", "mailto:"))
            if name in {"href", "src", "action"} and has_scheme and not safe:
                self.found.append(f"{tag}[{name}={value}]")


@pytest.mark.parametrize("vector", XSS_VECTORS)
def test_vector_is_rendered_harmless(vector: str) -> None:
    html = str(render_markdown(f"Intro\n\n{vector}\n\nOutro"))
    parser = LiveHtml()
    parser.feed(html)
    assert parser.found == [], html
    assert "Intro" in html


def test_markdown_still_renders() -> None:
    html = str(
        render_markdown("**bold** and [a link](https://marin.community/)\n\n| a |\n|---|\n| 1 |")
    )
    assert "<strong>bold</strong>" in html
    assert 'href="https://marin.community/"' in html
    assert 'rel="nofollow noopener noreferrer"' in html
    assert "<table>" in html


def test_code_blocks_keep_their_text_escaped() -> None:
    html = str(render_markdown("```\n<script>alert(1)</script>\n```"))
    assert "&lt;script&gt;" in html
    assert "<script>" not in html


@pytest.mark.parametrize("vector", XSS_VECTORS[:12])
def test_checker_sees_the_raw_vectors(vector: str) -> None:
    """The checker above would notice a vector that markdown alone lets through."""
    import markdown

    parser = LiveHtml()
    parser.feed(markdown.markdown(vector))
    assert parser.found
