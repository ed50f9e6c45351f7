"""One table of what an actor may do to a proposal, and every door agreeing with it.

For every state (and a submitted proposal on hold) and every role, the proposal page shows a
button or form exactly for the allowed actions, the API does exactly those (and refuses the
others with the refusal's status), and the slash commands answer "done" or "refused" with
the refusal's own words.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser
from django.test import Client
from rest_framework.test import APIClient

from marin_site.errors import ActionForbidden, TransitionNotAllowed
from proposals.actions import (
    ACTIONS,
    BUTTON_ACTIONS,
    TRANSITIONS,
    AlreadyDone,
    action_refusal,
    allowed_action_names,
    allowed_actions,
)
from proposals.github.commands import Command, command_run
from proposals.models import Proposal, State
from tests.factories import ProposalFactory, UserFactory

pytestmark = pytest.mark.django_db

STATES = [(state, False) for state in State.values] + [(State.SUBMITTED, True)]
ROLES = ("anonymous", "author", "contributor", "reviewer", "maintainer")
API_ACTIONS = (*TRANSITIONS, "hold", "unhold")
COMMANDS = {
    "approve": "approve",
    "reject": "reject",
    "request-changes": "request_changes",
    "cancel": "cancel",
    "hold": "hold",
    "unhold": "unhold",
}
REASON = "Because the baseline is missing."


@pytest.fixture
def people(recipe: Any) -> dict[str, Any]:
    return {
        "anonymous": AnonymousUser(),
        "author": UserFactory.create(username="ada", roles=["contributor"]),
        "contributor": UserFactory.create(username="carl", roles=["contributor"]),
        "reviewer": UserFactory.create(username="rev", roles=["reviewer"]),
        "maintainer": UserFactory.create(username="mai", roles=["maintainer"]),
    }


def _proposal(people: dict[str, Any], state: str, on_hold: bool) -> Proposal:
    return ProposalFactory.create(author=people["author"], state=state, on_hold=on_hold)


def _expected_status(refusal: Exception | None, role: str) -> set[int]:
    if refusal is None or isinstance(refusal, AlreadyDone):
        return {200}
    if isinstance(refusal, ActionForbidden):
        return {401, 403} if role == "anonymous" else {403}
    if isinstance(refusal, TransitionNotAllowed):
        return {409}
    return {400}


def _page_actions(html: str, pk: int) -> set[str]:
    """The actions the page offers: buttons of the actions panel, the edit link, forms."""
    shown = {name for name in BUTTON_ACTIONS if f"action-{name}" in html}
    forms = {
        "edit": f'href="/proposals/{pk}/edit/"',
        "review": f'action="/proposals/{pk}/review/"',
        "comment": f'action="/proposals/{pk}/comment/"',
        "record_outcome": f'action="/proposals/{pk}/outcome/"',
    }
    return shown | {name for name, marker in forms.items() if marker in html}


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(("state", "on_hold"), STATES)
def test_the_page_offers_exactly_the_allowed_actions(
    client: Client, people: dict[str, Any], state: str, on_hold: bool, role: str
) -> None:
    proposal = _proposal(people, state, on_hold)
    user = people[role]
    if role != "anonymous":
        client.force_login(user)
    html = client.get(proposal.get_absolute_url()).content.decode()
    allowed = {action.name for action in allowed_actions(proposal, user)}
    assert _page_actions(html, proposal.pk) == allowed - {"rerun"}


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(("state", "on_hold"), STATES)
def test_the_api_does_exactly_the_allowed_actions(
    api: APIClient, people: dict[str, Any], state: str, on_hold: bool, role: str
) -> None:
    user = people[role]
    if role != "anonymous":
        api.force_authenticate(user)
    listed = api.get(f"/api/v1/proposals/{_proposal(people, state, on_hold).pk}/").json()
    assert listed["allowed_actions"] == [
        action.name for action in allowed_actions(Proposal.objects.get(pk=listed["id"]), user)
    ]
    for name in API_ACTIONS:
        proposal = _proposal(people, state, on_hold)
        refusal = action_refusal(proposal=proposal, actor=user, name=name)
        response = api.post(
            f"/api/v1/proposals/{proposal.pk}/{name.replace('_', '-')}/", {"reason": REASON}
        )
        assert response.status_code in _expected_status(refusal, role), (name, response.json())
        proposal.refresh_from_db()
        if refusal is None:
            transition = TRANSITIONS.get(name)
            if transition is not None:
                assert proposal.state == transition.target, name
            else:
                assert proposal.on_hold == (name == "hold"), name
        else:
            assert (proposal.state, proposal.on_hold) == (state, on_hold), name
        if refusal is not None and not isinstance(refusal, AlreadyDone) and role != "anonymous":
            assert response.json()["detail"] == refusal.message


@pytest.mark.parametrize("role", [r for r in ROLES if r != "anonymous"])
@pytest.mark.parametrize(("state", "on_hold"), STATES)
def test_slash_commands_answer_as_the_table_says(
    people: dict[str, Any], state: str, on_hold: bool, role: str
) -> None:
    user = people[role]
    for command, name in COMMANDS.items():
        proposal = _proposal(people, state, on_hold)
        refusal = action_refusal(proposal=proposal, actor=user, name=name)
        answer = command_run(
            proposal_id=proposal.pk, user=user, login=role, command=Command(command, REASON)
        )
        if refusal is None or isinstance(refusal, AlreadyDone):
            assert answer.startswith(f"@{role} `/{command}`: done"), (command, answer)
        else:
            assert answer == (f"Sorry @{role}, `/{command}` was refused: {refusal.message}"), (
                command
            )


@pytest.mark.parametrize(("state", "on_hold"), STATES)
def test_allowed_actions_are_exactly_those_nothing_refuses(
    people: dict[str, Any], state: str, on_hold: bool
) -> None:
    """``allowed_actions`` skips the permission of an action the state rules out: the same
    answer as asking every action's refusal, for every role, a superuser, with a plan."""
    readers = [*people.values(), UserFactory.create(username="root", is_superuser=True)]
    proposal = _proposal(people, state, on_hold)
    for plan_id in (None, 1):
        proposal.plan_id = plan_id  # unsaved: the table only reads it
        for user in readers:
            assert [action.name for action in allowed_actions(proposal, user)] == [
                name
                for name in ACTIONS
                if action_refusal(proposal=proposal, actor=user, name=name) is None
            ], (user, plan_id)


@pytest.mark.parametrize(("state", "on_hold"), STATES)
def test_the_names_kept_per_reader_standing_are_what_the_table_says(
    people: dict[str, Any], state: str, on_hold: bool, django_capture_on_commit_callbacks: Any
) -> None:
    """``allowed_action_names`` keeps the answer for a proposal the reader did not write by
    the reader's standing: whoever asks first, it says what ``allowed_actions`` says, for
    every role, a second maintainer, a superuser, the author, and a reader whose roles
    changed."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    readers = [
        *people.values(),
        UserFactory.create(username="mai2", roles=["maintainer"]),
        UserFactory.create(username="root", is_superuser=True),
    ]
    proposal = _proposal(people, state, on_hold)

    def agree(user: Any) -> None:
        for plan_id in (None, 1):
            proposal.plan_id = plan_id  # unsaved: the table only reads it
            names = allowed_action_names(
                user,
                pk=proposal.pk,
                state=state,
                on_hold=on_hold,
                plan_id=plan_id,
                author_id=proposal.author_id,
            )
            assert names == [a.name for a in allowed_actions(proposal, user)], (user, plan_id)

    for user in readers:
        agree(user)
    with django_capture_on_commit_callbacks(execute=True):
        people["contributor"].groups.add(Group.objects.get_or_create(name="maintainer")[0])
    agree(get_user_model().objects.get(pk=people["contributor"].pk))


def test_the_table_knows_each_door_s_actions() -> None:
    assert set(TRANSITIONS) | {"hold", "unhold", "rerun"} <= set(ACTIONS)


def test_approve_is_not_offered_while_on_hold(people: dict[str, Any]) -> None:
    proposal = _proposal(people, State.SUBMITTED, True)
    names = [action.name for action in allowed_actions(proposal, people["maintainer"])]
    assert "approve" not in names
    assert "unhold" in names
    assert "hold" not in names
    refusal = action_refusal(proposal=proposal, actor=people["maintainer"], name="approve")
    assert refusal is not None and "on hold" in refusal.message


def test_rerun_needs_the_maintainer_and_a_launched_plan(people: dict[str, Any]) -> None:
    proposal = _proposal(people, State.APPROVED, False)
    maintainer = people["maintainer"]
    assert "rerun" not in [a.name for a in allowed_actions(proposal, maintainer)]
    assert isinstance(
        action_refusal(proposal=proposal, actor=people["author"], name="rerun"), ActionForbidden
    )
