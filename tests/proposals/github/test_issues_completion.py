"""An issue-only proposal completed from GitHub, and issues that arrive before their recipe.

The ablation spec comes from a later edit of the issue or a ``/spec`` comment with a fenced
YAML block, with the site's permissions (``allowed_actions``' "edit") and only while the
spec may change; each is answered by a comment through the outbox. An issue whose recipe
does not exist yet is kept and imported once it does (recipe saved, reconciler's pass).
"""

from __future__ import annotations

from typing import Any

import pytest

from proposals import services
from proposals.github.commands import commands_in
from proposals.models import GitHubOutbox, PendingIssue, Proposal, State
from runs.models import Recipe
from runs.signals import reconcile_pass
from tests.factories import RecipeFactory, UserFactory
from tests.proposals.github_support import (
    comment_delivery,
    fake_github,
    github_on,
    issue_payload,
    issues_delivery,
    post_delivery,
    process_deliveries,
)

pytestmark = pytest.mark.django_db
__all__ = ["fake_github", "github_on"]

SPEC = "axes:\n  capacity_factor: [1.0, 1.25]\nscales: [small]\nseeds: [0]"
# A Marin-style issue: no success criteria, so it stays a draft.
DRAFT_BODY = "## Description\n\nWe vary the capacity factor.\n\n## Hypothesis\n\nIt helps.\n"
FULL_BODY = DRAFT_BODY + "\n### Success criteria\n\neval/loss lower by 0.01\n"


def _open(client: Any, number: int, body: str, **extra: Any) -> Proposal | None:
    issue = issue_payload(number=number, title="Capacity", body=body, **extra)
    post_delivery(client, "issues", issues_delivery("opened", issue))
    process_deliveries()
    return Proposal.objects.filter(github_issue_number=number).first()


def _comment(client: Any, number: int, body: str, login: str, comment_id: int) -> str:
    post_delivery(
        client,
        "issue_comment",
        comment_delivery("created", number=number, comment_id=comment_id, body=body, login=login),
    )
    process_deliveries()
    return "\n".join(
        row.payload["body"]
        for row in GitHubOutbox.objects.filter(
            idempotency_key__startswith=f"comment:answer:{comment_id}:"
        )
    )


def _edit(client: Any, number: int, body: str, login: str = "octocat") -> list[str]:
    issue = issue_payload(
        number=number, title="Capacity", body=body, updated_at="2026-01-02T00:00:00Z"
    )
    post_delivery(client, "issues", issues_delivery("edited", issue, sender=login))
    return process_deliveries()


def test_spec_command_takes_the_fenced_block_after_it() -> None:
    body = f"Here it is:\n/spec\n\n```yaml\n{SPEC}\n```\n/status\n"
    commands = commands_in(body)
    assert [(c.name, c.argument) for c in commands] == [("spec", SPEC), ("status", "")]
    assert commands_in("/spec axes: {}\n")[0].argument == ""


def test_a_spec_comment_completes_the_issue_s_proposal(
    github_on: Any, client: Any, recipe: Any
) -> None:
    proposal = _open(client, 50, FULL_BODY)
    assert proposal is not None and proposal.state == State.SUBMITTED
    assert proposal.ablation_spec == ""
    answer = _comment(client, 50, f"/spec\n```yaml\n{SPEC}\n```", "octocat", 5001)
    proposal.refresh_from_db()
    assert proposal.ablation_spec == SPEC + "\n"
    assert answer.startswith("@octocat `/spec`: done: the ablation spec is set: 2 runs")
    # Someone who may not edit it is refused, as on the site; the spec stays.
    UserFactory.create(username="stranger", roles=["contributor"])
    refused = _comment(client, 50, "/spec\n```yaml\nseeds: [0, 1]\n```", "stranger", 5002)
    assert refused.startswith("Sorry @stranger, `/spec` was refused: You do not have permission")
    # A spec the plan cannot use is refused with the plan's reason.
    bad = _comment(client, 50, "/spec\n```yaml\naxes:\n  nope: [1, 2]\n```", "octocat", 5003)
    assert bad.startswith("Sorry @octocat, `/spec` was refused:") and "nope" in bad
    proposal.refresh_from_db()
    assert proposal.ablation_spec == SPEC + "\n"


def test_the_spec_is_frozen_after_approval(github_on: Any, client: Any, recipe: Any) -> None:
    proposal = _open(client, 51, FULL_BODY)
    assert proposal is not None
    maxine = _comment(client, 51, "/status", "maxine", 5100)  # maps maxine's account
    assert maxine
    other = UserFactory.create(username="rev2", roles=["reviewer"])
    services.review_submit(
        proposal_id=proposal.pk, reviewer=other, score=4, recommendation="approve", text="ok"
    )
    assert "done" in _comment(client, 51, "/approve", "maxine", 5101)
    answer = _comment(client, 51, f"/spec\n```yaml\n{SPEC}\n```", "octocat", 5102)
    assert "refused" in answer and "frozen" in answer
    proposal.refresh_from_db()
    assert proposal.ablation_spec == ""


def test_an_edit_adding_the_spec_and_criteria_completes_a_draft(
    github_on: Any, client: Any, recipe: Any
) -> None:
    proposal = _open(client, 52, DRAFT_BODY)
    assert proposal is not None and proposal.state == State.DRAFT
    body = FULL_BODY + f"\n### Ablation spec\n\n```yaml\n{SPEC}\n```\n"
    assert _edit(client, 52, body) == ["applied"]
    proposal.refresh_from_db()
    assert proposal.ablation_spec == SPEC
    assert proposal.success_metric == "eval/loss"
    assert proposal.state == State.SUBMITTED
    answer = GitHubOutbox.objects.get(idempotency_key__startswith=f"comment:edit:{proposal.pk}:")
    assert answer.payload["body"].startswith("@octocat the ablation spec is set: 2 runs")
    assert "submitted" in answer.payload["body"]


def test_an_edit_by_someone_who_may_not_edit_is_answered(
    github_on: Any, client: Any, recipe: Any
) -> None:
    proposal = _open(client, 53, FULL_BODY)
    assert proposal is not None
    body = FULL_BODY + f"\n### Ablation spec\n\n```yaml\n{SPEC}\n```\n"
    assert _edit(client, 53, body, login="stranger") == ["ignored"]
    proposal.refresh_from_db()
    assert proposal.ablation_spec == ""
    answer = GitHubOutbox.objects.get(idempotency_key__startswith=f"comment:edit:{proposal.pk}:")
    assert answer.payload["body"].startswith("Sorry @stranger, the ablation spec in your edit")


def test_an_issue_before_any_recipe_is_kept_and_imported_when_one_is_created(
    github_on: Any, client: Any, django_capture_on_commit_callbacks: Any
) -> None:
    assert not Recipe.objects.exists()
    assert _open(client, 60, FULL_BODY) is None
    kept = PendingIssue.objects.get(number=60)
    assert "no active recipe" in kept.reason
    # A later edit of the waiting issue is what gets imported.
    assert _edit(client, 60, FULL_BODY.replace("It helps.", "It helps a lot.")) == ["applied"]
    with django_capture_on_commit_callbacks(execute=True):
        RecipeFactory.create()
    proposal = Proposal.objects.get(github_issue_number=60)
    assert proposal.hypothesis == "It helps a lot."
    assert proposal.state == State.SUBMITTED
    assert not PendingIssue.objects.exists()


def test_an_issue_naming_an_unknown_recipe_waits_for_it(
    github_on: Any, client: Any, recipe: Any
) -> None:
    body = FULL_BODY + "\n### Recipe\n\nbig-moe\n"
    assert _open(client, 61, body) is None
    assert "big-moe" in PendingIssue.objects.get(number=61).reason
    reconcile_pass.send(sender=None)
    assert PendingIssue.objects.filter(number=61).exists()
    RecipeFactory.create(name="big-moe")
    reconcile_pass.send(sender=None)
    proposal = Proposal.objects.get(github_issue_number=61)
    assert proposal.recipe.name == "big-moe"
    assert not PendingIssue.objects.exists()
