"""The fragment cache's rule: a fragment is used only under the versions it was stored with."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.cache import cache

from marin_site.fragments import Fragments, pk_url, version_key, versions_bump

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fragments_on(settings: Any) -> None:
    settings.FRAGMENT_CACHE_SECONDS = 600
    cache.clear()


def stored(name: str, deps: list[tuple[str, int]], html: str) -> Fragments:
    fragments = Fragments({name: deps})
    assert fragments.get(name) is None
    fragments.put(name, html)
    fragments.save()
    return Fragments({name: deps})


def test_a_fragment_lives_until_one_of_its_versions_is_bumped(
    django_capture_on_commit_callbacks: Any,
) -> None:
    assert stored("card:1", [("proposal", 1)], "<li>one</li>").get("card:1") == "<li>one</li>"
    stored("card:2", [("proposal", 2)], "<li>two</li>")
    with django_capture_on_commit_callbacks(execute=True):
        versions_bump("proposal", [1])
    assert Fragments({"card:1": [("proposal", 1)]}).get("card:1") is None
    assert Fragments({"card:2": [("proposal", 2)]}).get("card:2") == "<li>two</li>"


def test_a_bump_waits_for_the_commit(django_capture_on_commit_callbacks: Any) -> None:
    stored("card:1", [("proposal", 1)], "<li>one</li>")
    with django_capture_on_commit_callbacks(execute=False):
        versions_bump("proposal", [1])
        assert Fragments({"card:1": [("proposal", 1)]}).get("card:1") == "<li>one</li>"


def test_a_lost_version_never_matches_an_old_fragment() -> None:
    stored("card:1", [("proposal", 1)], "<li>one</li>")
    cache.delete(version_key("proposal", 1))  # evicted or expired
    assert Fragments({"card:1": [("proposal", 1)]}).get("card:1") is None


def test_refine_keys_a_fragment_by_row_values_too() -> None:
    first = Fragments({"details": [("proposal", 1)]})
    first.refine("details", "2026-12-04T10:00:00", None)
    first.put("details", "<dl>no issue</dl>")
    first.save()
    same = Fragments({"details": [("proposal", 1)]})
    same.refine("details", "2026-12-04T10:00:00", None)
    assert same.get("details") == "<dl>no issue</dl>"
    changed = Fragments({"details": [("proposal", 1)]})
    changed.refine("details", "2026-12-04T10:00:00", 4242)
    assert changed.get("details") is None


def test_off_keeps_nothing_but_answers_what_was_put(settings: Any) -> None:
    settings.FRAGMENT_CACHE_SECONDS = 0
    fragments = Fragments({"card:1": [("proposal", 1)]})
    fragments.put("card:1", "<li>one</li>")
    assert fragments.get("card:1") == "<li>one</li>"
    fragments.save()
    assert Fragments({"card:1": [("proposal", 1)]}).get("card:1") is None
    assert cache.get(version_key("proposal", 1)) is None


def test_pk_url_builds_what_reverse_would(rf: Any) -> None:
    from django.urls import reverse

    request = rf.get("/api/v1/proposals/")
    build = pk_url("proposal-detail", request)
    for pk in (1, 42, 2_147_483_600):
        assert build(pk) == request.build_absolute_uri(
            reverse("proposal-detail", kwargs={"pk": pk})
        )
    assert pk_url("proposals:detail")(7) == "/proposals/7/"


def test_a_shared_fragment_is_found_from_any_scope() -> None:
    """``shared`` names are kept outside the page's scope (a reader's roles, read by every
    page in the page's own round trip); the scoped ones stay the page's."""
    page = Fragments({"head": [("proposal", 1)]}, scope="page:1", shared={"user:7:x": []})
    page.put("head", "<h1>one</h1>")
    page.put("user:7:x", ["reviewer"])
    page.save()
    other = Fragments({"head": [("proposal", 1)]}, scope="page:2", shared={"user:7:x": []})
    assert other.get("user:7:x") == ["reviewer"]
    assert other.get("head") is None
    assert Fragments({"head": [("proposal", 1)]}, scope="page:1").get("head") == "<h1>one</h1>"
