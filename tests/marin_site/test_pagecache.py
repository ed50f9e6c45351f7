"""The public page cache: anonymous readers get cached pages until something changes."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.cache import cache
from django.test import Client

from proposals.models import State
from runs.models import Run, RunState
from tests.factories import CommentFactory, ProposalFactory, ReviewFactory
from tests.runs.runs_helpers import launched_plan

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _page_cache_on(settings: Any) -> None:
    settings.PAGE_CACHE_SECONDS = 30
    cache.clear()


def test_anonymous_list_is_served_from_the_cache_until_a_write(
    client: Client, proposal: Any, django_capture_on_commit_callbacks: Any
) -> None:
    first = client.get("/")
    second = client.get("/")
    assert first["X-Page-Cache"] == "miss"
    assert second["X-Page-Cache"] == "hit"
    assert second.content == first.content
    assert second["Content-Type"] == first["Content-Type"]

    with django_capture_on_commit_callbacks(execute=True):
        ProposalFactory.create(title="A brand new ablation", recipe=proposal.recipe)
    third = client.get("/")
    assert third["X-Page-Cache"] == "miss"
    assert b"A brand new ablation" in third.content


@pytest.mark.parametrize("write", ["review", "comment", "label"])
def test_a_review_comment_or_label_makes_the_proposal_page_fresh(
    client: Client,
    proposal: Any,
    reviewer: Any,
    write: str,
    django_capture_on_commit_callbacks: Any,
) -> None:
    proposal.state = State.SUBMITTED
    proposal.save()
    url = f"/proposals/{proposal.pk}/"
    client.get(url)
    assert client.get(url)["X-Page-Cache"] == "hit"
    with django_capture_on_commit_callbacks(execute=True):
        if write == "review":
            ReviewFactory.create(proposal=proposal, reviewer=reviewer, text="Needs a third seed.")
            expected = b"Needs a third seed."
        elif write == "comment":
            CommentFactory.create(proposal=proposal, body="What about top-2 routing?")
            expected = b"What about top-2 routing?"
        else:
            from proposals.models import Label

            proposal.labels.add(Label.objects.create(name="router-study"))
            expected = b"router-study"
    fresh = client.get(url)
    assert fresh["X-Page-Cache"] == "miss"
    assert expected in fresh.content


def test_api_list_is_cached_per_accept_header(client: Client, proposal: Any) -> None:
    as_json = client.get("/api/v1/proposals/", HTTP_ACCEPT="application/json")
    assert as_json["X-Page-Cache"] == "miss"
    assert client.get("/api/v1/proposals/", HTTP_ACCEPT="application/json")["X-Page-Cache"] == "hit"
    browsable = client.get("/api/v1/proposals/", HTTP_ACCEPT="text/html")
    assert browsable["X-Page-Cache"] == "miss"
    assert browsable["Content-Type"].startswith("text/html")
    assert as_json.json()["results"][0]["id"] == proposal.pk


def test_signed_in_readers_and_token_requests_bypass_the_cache(
    client: Client, proposal: Any, contributor: Any
) -> None:
    client.get("/")
    assert client.get("/")["X-Page-Cache"] == "hit"
    assert "X-Page-Cache" not in client.get("/", HTTP_AUTHORIZATION="Token abc")
    client.force_login(contributor)
    signed_in = client.get("/")
    assert "X-Page-Cache" not in signed_in
    assert b"Sign out" in signed_in.content or b"Log out" in signed_in.content


def test_only_listed_pages_and_good_answers_are_kept(client: Client, proposal: Any) -> None:
    assert "X-Page-Cache" not in client.get("/proposals/new/")
    assert "X-Page-Cache" not in client.get("/proposals/999999/")
    assert "X-Page-Cache" not in client.get("/healthz")


def test_a_proposal_page_with_runs_in_flight_is_never_cached(
    client: Client, proposal: Any, recipe: Any
) -> None:
    plan = launched_plan(recipe)
    proposal.plan = plan
    proposal.state = State.APPROVED
    proposal.save()
    url = f"/proposals/{proposal.pk}/"
    response = client.get(url)
    assert "private" in response["Cache-Control"]
    assert "X-Page-Cache" not in client.get(url)

    Run.objects.filter(plan=plan).update(state=RunState.FINISHED)
    client.get(url)
    assert client.get(url)["X-Page-Cache"] == "hit"


def test_off_when_seconds_is_zero(client: Client, proposal: Any, settings: Any) -> None:
    settings.PAGE_CACHE_SECONDS = 0
    client.get("/")
    assert "X-Page-Cache" not in client.get("/")
