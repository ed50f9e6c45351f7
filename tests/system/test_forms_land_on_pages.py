"""Every form of the site's pages lands on a page: none posts to an API route, whose answer
is the REST framework's raw page (the claim form once did: its URL name was also the API's).

Two checks: a URL name means one kind of route (a page's name never also names an API
route, so ``{% url %}`` cannot pick the API's), and every ``<form>`` of every template names,
or posts to, a page. tests/browser/test_pages_read.py checks the forms as rendered too.
"""

from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings
from django.urls import get_resolver

API_PREFIXES = ("api/", "mlflow/")
FORM = re.compile(r"<form\b[^>]*>", re.IGNORECASE)
ACTION = re.compile(r"""action="([^"]*)\"""")
URL_TAG = re.compile(r"""{%\s*url\s+['"]([^'"]+)['"]""")


def _patterns(name: str) -> list[str]:
    """The routes a URL name (``ns:name`` included) reverses to."""
    resolver = get_resolver()
    prefix = ""
    *namespaces, view = name.split(":")
    for namespace in namespaces:
        extra, resolver = resolver.namespace_dict[namespace]
        prefix += extra
    return [prefix + pattern for _, pattern, _, _ in resolver.reverse_dict.getlist(view)]


def _is_api(pattern: str) -> bool:
    return pattern.lstrip("^").startswith(API_PREFIXES)


def test_no_url_name_is_both_a_page_and_an_api_route() -> None:
    names = [name for name in get_resolver().reverse_dict if isinstance(name, str)]
    routes = {name: _patterns(name) for name in names}
    mixed = {name: found for name, found in routes.items() if len(set(map(_is_api, found))) > 1}
    assert mixed == {}


def test_every_form_of_every_template_posts_to_a_page() -> None:
    templates = sorted((Path(settings.BASE_DIR) / "templates").rglob("*.html"))
    assert len(templates) > 20
    found = 0
    problems = []
    for template in templates:
        for tag in FORM.findall(template.read_text()):
            found += 1
            action = ACTION.search(tag)
            text = action.group(1) if action else ""  # no action: the page itself
            for name in URL_TAG.findall(text):
                routes = _patterns(name)
                if not routes or any(_is_api(p) for p in routes):
                    problems.append(f"{template.name}: {name} -> {routes}")
            if re.search(r"/(api|mlflow)/", text):
                problems.append(f"{template.name}: {text}")
    assert found > 20  # the check saw the forms
    assert problems == []
