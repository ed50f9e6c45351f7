"""Slash commands on the issue: same services and permissions as the site, every one answered."""

from __future__ import annotations

from typing import Any

import pytest

from proposals import services
from proposals.github.commands import Command, commands_in
from proposals.models import GitHubOutbox, Proposal, State
from runs.models import PlanLaunch, Run, RunEvent, RunState
from runs.services import dispatch
from tests.factories import ProposalFactory
from tests.proposals.github_support import (
    comment_delivery,
    drain,
    fake_github,
    github_on,
    issue_payload,
    issues_delivery,
    post_delivery,
    process_deliveries,
)

pytestmark = pytest.mark.django_db
__all__ = ["fake_github", "github_on"]


@pytest.fixture
def linked(github_on: Any, contributor: Any, recipe: Any) -> Proposal:
    """A submitted proposal whose issue exists on the fake GitHub."""
    proposal = ProposalFactory.create(author=contributor, recipe=recipe)
    services.proposal_transition(proposal_id=proposal.pk, action="submit", actor=contributor)
    drain()
    proposal.refresh_from_db()
    assert proposal.github_issue_number is not None
    return proposal


def _say(
    client: Any, proposal: Proposal, body: str, login: str, comment_id: int, action: str = "created"
) -> str:
    post_delivery(
        client,
        "issue_comment",
        comment_delivery(
            action,
            number=proposal.github_issue_number or 0,
            comment_id=comment_id,
            body=body,
            login=login,
        ),
    )
    process_deliveries()
    proposal.refresh_from_db()
    return "\n".join(
        row.payload["body"]
        for row in GitHubOutbox.objects.filter(
            idempotency_key__startswith=f"comment:answer:{comment_id}:"
        )
    )


def test_commands_in_ignores_quotes_code_blocks_and_inline_code() -> None:
    body = (
        "Thanks!\n/approve\n> /reject quoted\n```\n/cancel\n```\n    /hold indented\n"
        "Use `/approve` to approve.\n/request-changes Please add a baseline.\n/approvee\n"
    )
    assert commands_in(body) == [
        Command("approve", ""),
        Command("request-changes", "Please add a baseline."),
    ]


def test_a_maintainer_approves_with_a_command(linked: Proposal, client: Any) -> None:
    answer = _say(client, linked, "LGTM\n/approve", "maxine", 1)
    assert linked.state == State.APPROVED
    assert answer.startswith("@maxine `/approve`: done")


def test_approve_takes_the_executor_and_the_ref_to_pin(linked: Proposal, client: Any) -> None:
    answer = _say(client, linked, "/approve executor=local ref=v1.2", "maxine", 31)
    assert answer.startswith("@maxine `/approve`: done")
    assert linked.state == State.APPROVED
    assert linked.git_ref == "v1.2"
    assert linked.plan_id is not None
    launch = PlanLaunch.objects.get(plan_id=linked.plan_id)
    assert (launch.executor, launch.git_ref) == ("local", "v1.2")


def test_approve_refuses_an_unknown_option_or_executor_by_name(
    linked: Proposal, client: Any
) -> None:
    assert "colour: is no option of /approve" in _say(
        client, linked, "/approve colour=red", "maxine", 32
    )
    answer = _say(client, linked, "/approve executor=pool:nowhere", "maxine", 33)
    assert "there is no pool named 'nowhere'" in answer
    assert linked.state == State.SUBMITTED


def test_a_non_maintainer_approve_is_refused_politely(linked: Proposal, client: Any) -> None:
    answer = _say(client, linked, "/approve", "randomperson", 2)
    assert linked.state == State.SUBMITTED
    assert answer.startswith("Sorry @randomperson, `/approve` was refused")
    assert "permission" in answer


def test_a_command_in_a_code_block_does_nothing(linked: Proposal, client: Any) -> None:
    answer = _say(client, linked, "Type this:\n```\n/approve\n```", "maxine", 3)
    assert linked.state == State.SUBMITTED
    assert answer == ""


def test_an_edited_comment_does_not_run_its_commands_again(
    linked: Proposal, client: Any, maintainer: Any
) -> None:
    _say(client, linked, "/hold", "maxine", 4)
    assert linked.on_hold
    services.proposal_hold(proposal_id=linked.pk, actor=maintainer, hold=False)
    _say(client, linked, "/hold\n(edited)", "maxine", 4, action="edited")
    assert not linked.on_hold
    assert GitHubOutbox.objects.filter(idempotency_key__startswith="comment:answer:4:").count() == 1


def test_reject_needs_a_reason_and_records_it(linked: Proposal, client: Any) -> None:
    assert "reason is required" in _say(client, linked, "/reject", "maxine", 5)
    assert linked.state == State.SUBMITTED
    assert "done" in _say(client, linked, "/reject Out of budget this quarter.", "maxine", 6)
    assert (linked.state, linked.state_reason) == (State.REJECTED, "Out of budget this quarter.")


def test_request_changes_by_a_mapped_reviewer(linked: Proposal, client: Any) -> None:
    answer = _say(client, linked, "/request-changes Add a seed.", "rosa", 7)
    assert "done" in answer
    assert linked.state == State.CHANGES_REQUESTED


def test_hold_blocks_approval_until_unhold(linked: Proposal, client: Any) -> None:
    _say(client, linked, "/hold waiting for the data", "maxine", 8)
    assert linked.on_hold
    assert linked.events.filter(verb="held").exists()
    assert "on hold" in _say(client, linked, "/approve", "maxine", 9)
    assert linked.state == State.SUBMITTED
    _say(client, linked, "/unhold", "maxine", 10)
    assert "done" in _say(client, linked, "/approve", "maxine", 11)
    assert linked.state == State.APPROVED


def test_hold_and_unhold_are_refused_for_non_maintainers(linked: Proposal, client: Any) -> None:
    assert "refused" in _say(client, linked, "/hold", "rosa", 12)
    assert not linked.on_hold


def test_status_answers_anyone(linked: Proposal, client: Any) -> None:
    assert "state: **Submitted**" in _say(client, linked, "/status", "randomperson", 13)


def test_cancel_only_from_approved(linked: Proposal, client: Any) -> None:
    assert "Cannot cancel from state 'submitted'" in _say(client, linked, "/cancel", "maxine", 14)


def test_rerun_needs_a_run_of_this_proposal(linked: Proposal, client: Any) -> None:
    assert "refused" in _say(client, linked, "/rerun 999999", "maxine", 15)
    assert "permission" in _say(client, linked, "/rerun 1", "randomperson", 16)


def test_every_command_of_a_comment_is_answered(linked: Proposal, client: Any) -> None:
    answers = _say(client, linked, "/status\n/hold\n/approve", "maxine", 17).split("\n")
    assert len(answers) == 3
    assert (
        GitHubOutbox.objects.filter(idempotency_key__startswith="comment:answer:17:").count() == 3
    )


def test_answers_reach_the_issue(linked: Proposal, client: Any, github_on: Any) -> None:
    _say(client, linked, "/status", "randomperson", 18)
    drain()
    bodies = [c["body"] for c in github_on.issue_comments(linked.github_issue_number)]
    assert any(b.startswith("@randomperson `/status`") for b in bodies)


def test_cancel_by_command_stops_the_plan(linked: Proposal, client: Any, maintainer: Any) -> None:
    services.proposal_transition(proposal_id=linked.pk, action="approve", actor=maintainer)
    linked.refresh_from_db()
    assert linked.plan_id is not None
    dispatch.plan_expand(plan_id=linked.plan_id)
    proposal = linked
    answer = _say(client, linked, "/cancel", "maxine", 20)
    assert answer.startswith("@maxine `/cancel`: done")
    assert linked.state == State.CANCELED
    launch = PlanLaunch.objects.get(plan__proposal=proposal)
    assert launch.canceled_at is not None
    runs = Run.objects.filter(plan__proposal=proposal)
    assert set(runs.values_list("state", flat=True)) == {RunState.KILLED}
    assert set(
        RunEvent.objects.filter(run__in=runs, verb="killed").values_list("door", flat=True)
    ) == {"github"}


def test_rerun_by_command_is_refused_once_the_plan_is_cancelled(
    linked: Proposal, client: Any, maintainer: Any
) -> None:
    """``/rerun`` asks the same service as the site: a run of a cancelled plan would be queued
    where nothing dispatches it, so the command is refused, in the service's words."""
    services.proposal_transition(proposal_id=linked.pk, action="approve", actor=maintainer)
    linked.refresh_from_db()
    assert linked.plan_id is not None
    dispatch.plan_expand(plan_id=linked.plan_id)
    assert _say(client, linked, "/cancel", "maxine", 30).startswith("@maxine `/cancel`: done")
    run = Run.objects.filter(plan_id=linked.plan_id).first()
    assert run is not None
    before = Run.objects.filter(plan_id=linked.plan_id).count()
    answer = _say(client, linked, f"/rerun {run.pk}", "maxine", 31)
    assert answer.startswith("Sorry @maxine, `/rerun` was refused:")
    assert "its plan was cancelled" in answer
    assert Run.objects.filter(plan_id=linked.plan_id).count() == before


def test_the_author_withdraws_with_a_command_and_nobody_else_can(
    github_on: Any, client: Any, recipe: Any
) -> None:
    issue = issue_payload(
        number=77,
        title="Try top-2 routing",
        body="### Hypothesis\n\nTop-2 is as good.\n\n### Recipe\n\n" + recipe.name,
        login="octo-author",
    )
    post_delivery(client, "issues", issues_delivery("opened", issue))
    process_deliveries()
    proposal = Proposal.objects.get(github_issue_number=77)
    assert proposal.state != State.WITHDRAWN
    refused = _say(client, proposal, "/withdraw", "randomperson", 7701)
    assert refused.startswith("Sorry @randomperson, `/withdraw` was refused")
    assert proposal.state != State.WITHDRAWN
    answer = _say(client, proposal, "/withdraw we found it in the literature", "octo-author", 7702)
    assert answer.startswith("@octo-author `/withdraw`: done")
    assert proposal.state == State.WITHDRAWN
    assert proposal.state_reason == "we found it in the literature"
