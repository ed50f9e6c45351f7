"""A maintainer approves their own proposal only after someone else has reviewed it.

The rule lives in ``proposals.actions`` alone, so the page, the API and ``/approve`` refuse
with the same reason, and none of them offers the action meanwhile.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from proposals.actions import action_refusal, allowed_actions
from proposals.github.commands import Command, command_run
from proposals.models import Proposal, State
from tests.factories import ProposalFactory, ReviewFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def own(recipe: Any) -> Proposal:
    author = UserFactory.create(username="mona", roles=["maintainer"])
    return ProposalFactory.create(author=author, recipe=recipe, state=State.SUBMITTED)


def _names(proposal: Proposal) -> list[str]:
    return [action.name for action in allowed_actions(proposal, proposal.author)]


def test_every_door_refuses_self_approval_without_another_review(own: Proposal) -> None:
    refusal = action_refusal(proposal=own, actor=own.author, name="approve")
    assert refusal is not None
    assert "your own proposal" in refusal.message and "(0 so far)" in refusal.message
    assert "approve" not in _names(own)

    page = Client()
    page.force_login(own.author)
    response = page.post(f"/proposals/{own.pk}/transition/approve/", {"reason": ""})
    assert response.status_code == 400
    assert "your own proposal" in response.content.decode()

    api = APIClient()
    api.force_authenticate(own.author)
    answered = api.post(f"/api/v1/proposals/{own.pk}/approve/", {})
    assert answered.status_code == 400
    assert answered.json()["detail"] == refusal.message

    answer = command_run(
        proposal_id=own.pk, user=own.author, login="mona", command=Command("approve", "")
    )
    assert answer == f"Sorry @mona, `/approve` was refused: {refusal.message}"
    own.refresh_from_db()
    assert own.state == State.SUBMITTED


def test_own_review_does_not_count_and_another_s_does(own: Proposal) -> None:
    ReviewFactory.create(proposal=own, reviewer=own.author)
    assert action_refusal(proposal=own, actor=own.author, name="approve") is not None
    ReviewFactory.create(proposal=own)
    assert action_refusal(proposal=own, actor=own.author, name="approve") is None
    assert "approve" in _names(own)
    answer = command_run(
        proposal_id=own.pk, user=own.author, login="mona", command=Command("approve", "")
    )
    assert answer.startswith("@mona `/approve`: done")
    own.refresh_from_db()
    assert own.state == State.APPROVED


def test_another_maintainer_approves_without_reviews(own: Proposal) -> None:
    other = UserFactory.create(username="otto", roles=["maintainer"])
    assert action_refusal(proposal=own, actor=other, name="approve") is None


def test_the_setting_may_ask_for_more(own: Proposal, settings: Any) -> None:
    settings.PROPOSALS_APPROVAL_MIN_OTHER_REVIEWS = 2
    ReviewFactory.create(proposal=own)
    refusal = action_refusal(proposal=own, actor=own.author, name="approve")
    assert refusal is not None and "2 other people" in refusal.message
    ReviewFactory.create(proposal=own)
    assert action_refusal(proposal=own, actor=own.author, name="approve") is None
    settings.PROPOSALS_APPROVAL_MIN_OTHER_REVIEWS = 0
    fresh = ProposalFactory.create(author=own.author, state=State.SUBMITTED)
    assert action_refusal(proposal=fresh, actor=own.author, name="approve") is None


def test_the_api_list_asks_each_own_proposal_for_its_own_reviews(own: Proposal) -> None:
    """Two of the maintainer's own submitted proposals on one API page, one reviewed by
    someone else: only that one offers "approve" (the list asks the rule once per situation,
    and an own proposal's situation includes its reviews)."""
    reviewed = ProposalFactory.create(author=own.author, recipe=own.recipe, state=State.SUBMITTED)
    ReviewFactory.create(proposal=reviewed, reviewer=UserFactory.create(username="rita2"))
    api = APIClient()
    api.force_authenticate(own.author)
    rows = {row["id"]: row for row in api.get("/api/v1/proposals/").json()["results"]}
    assert "approve" in rows[reviewed.pk]["allowed_actions"]
    assert "approve" not in rows[own.pk]["allowed_actions"]
