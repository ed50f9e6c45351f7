"""``?q=`` on the proposal list and the API list is the query language of the search page."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from proposals.models import Proposal, State
from tests.factories import ProposalFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def three(recipe: Any) -> dict[str, Proposal]:
    approved = ProposalFactory.create(
        recipe=recipe, state=State.APPROVED, title="Router capacity", outcome="did_not_work"
    )
    approved.labels.create(name="moe")
    submitted = ProposalFactory.create(
        recipe=recipe, state=State.SUBMITTED, title="Weight decay sweep", summary="Decay it."
    )
    draft = ProposalFactory.create(
        recipe=recipe, state=State.DRAFT, title="Data mix", summary="More code in the mix."
    )
    return {"approved": approved, "submitted": submitted, "draft": draft}


QUERIES = [
    ("state:approved", ["approved"]),
    ("state:(draft, submitted)", ["draft", "submitted"]),
    ("-state:approved", ["draft", "submitted"]),
    ("label:moe outcome:did_not_work", ["approved"]),
    ("decay", ["submitted"]),  # plain words match the text, as on /search/
    ("sweep OR mix", ["draft", "submitted"]),
    ('"weight decay"', ["submitted"]),
    ("state:approved router", ["approved"]),
    ("", ["approved", "draft", "submitted"]),
]


def _names(three: dict[str, Proposal], ids: list[int]) -> list[str]:
    names = {p.pk: name for name, p in three.items()}
    return sorted(names[i] for i in ids)


@pytest.mark.parametrize(("q", "expected"), QUERIES)
def test_the_api_list_reads_q_as_a_search_query(
    api: APIClient, three: dict[str, Proposal], q: str, expected: list[str]
) -> None:
    response = api.get("/api/v1/proposals/", {"q": q})
    assert response.status_code == 200, response.json()
    assert _names(three, [row["id"] for row in response.json()["results"]]) == expected


@pytest.mark.parametrize(("q", "expected"), QUERIES)
def test_the_list_page_reads_q_as_a_search_query(
    client: Client, three: dict[str, Proposal], q: str, expected: list[str]
) -> None:
    response = client.get("/", {"q": q})
    assert response.status_code == 200
    assert _names(three, list(response.context["page"].object_list)) == expected  # ids


def test_q_combines_with_the_other_filters_and_keeps_the_list_order(
    api: APIClient, three: dict[str, Proposal]
) -> None:
    rows = api.get("/api/v1/proposals/", {"q": "-label:moe", "state": "submitted"}).json()
    assert [row["id"] for row in rows["results"]] == [three["submitted"].pk]
    rows = api.get("/api/v1/proposals/", {"q": "-label:moe"}).json()
    assert [row["id"] for row in rows["results"]] == [three["draft"].pk, three["submitted"].pk]


def test_a_query_that_cannot_be_read_is_a_400_naming_the_column(api: APIClient) -> None:
    response = api.get("/api/v1/proposals/", {"q": "label:moe (routing"})
    assert response.status_code == 400
    assert "column" in response.json()["q"][0]


def test_the_list_page_says_which_query_it_could_not_read(
    client: Client, three: dict[str, Proposal]
) -> None:
    response = client.get("/", {"q": "stat:approved"})
    assert response.status_code == 200
    assert "unknown field" in response.content.decode()
    assert len(response.context["page"].object_list) == 3  # every proposal, as for bad filters


def test_an_overlong_query_is_refused(api: APIClient) -> None:
    assert api.get("/api/v1/proposals/", {"q": "a" * 501}).status_code == 400
