"""What the issue mirrors of the site and back: labels both ways (exactly once, no echo),
reviews as comments, the result comment when runs failed or crashed, and the managed block
carrying the plan and the spec."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from proposals import services
from proposals.github.fake import FakeGitHub
from proposals.github.outbox.render import render_block, render_result
from proposals.models import GitHubOutbox, Label, Proposal, State
from runs.models import Run, RunState
from runs.signals import plan_finished
from tests.factories import ProposalFactory, UserFactory
from tests.proposals.github_support import (
    BOT,
    drain,
    fake_github,
    github_on,
    issues_delivery,
    post_delivery,
    process_deliveries,
)
from tests.runs.runs_helpers import launched_plan

pytestmark = pytest.mark.django_db
__all__ = ["fake_github", "github_on"]

SPEC = "axes:\n  capacity_factor: [1.5, 2.0, 3.0]\n"


@pytest.fixture
def linked(github_on: FakeGitHub, contributor: Any, recipe: Any) -> Proposal:
    proposal = ProposalFactory.create(author=contributor, recipe=recipe)
    services.proposal_transition(proposal_id=proposal.pk, action="submit", actor=contributor)
    drain()
    proposal.refresh_from_db()
    assert proposal.github_issue_number is not None
    return proposal


def _label_writes(github: FakeGitHub, number: int) -> list[tuple[str, str]]:
    return [
        w
        for w in github.writes()
        if w[1].endswith(f"/issues/{number}/labels") or "/labels/" in w[1]
    ]


def _label_event(client: Any, proposal: Proposal, action: str, name: str, sender: str) -> list[str]:
    number = proposal.github_issue_number or 0
    issue = {
        "number": number,
        "title": proposal.title,
        "body": "",
        "labels": [{"name": "experiment"}],
        "user": {"login": "carla", "id": 1},
        "updated_at": "2026-01-01T00:00:00Z",
    }
    delivery = issues_delivery("labeled" if action == "labeled" else "unlabeled", issue, sender)
    delivery["label"] = {"name": name}
    post_delivery(client, "issues", delivery)
    return process_deliveries()


def test_a_label_on_the_issue_sets_the_site_s_label_once(
    linked: Proposal, github_on: FakeGitHub, client: Any
) -> None:
    Label.objects.create(name="moe")
    number = linked.github_issue_number or 0
    github_on.label_by_hand(number=number, name="moe")
    before = len(github_on.writes())
    assert _label_event(client, linked, "labeled", "moe", "maxine") == ["applied"]
    assert list(linked.labels.values_list("name", flat=True)) == ["moe"]
    # A label the site does not know is left to GitHub.
    github_on.label_by_hand(number=number, name="good first issue")
    assert _label_event(client, linked, "labeled", "good first issue", "maxine") == ["ignored"]
    assert not Label.objects.filter(name="good first issue").exists()
    drain()
    # The site's sync finds the label already there: nothing is written back.
    assert _label_writes(github_on, number) == [
        w for w in github_on.writes()[:before] if w in _label_writes(github_on, number)
    ]
    github_on.label_by_hand(number=number, name="moe", on=False)
    assert _label_event(client, linked, "unlabeled", "moe", "maxine") == ["applied"]
    assert not linked.labels.exists()
    drain()
    assert "moe" not in github_on.label_names(number)
    assert "good first issue" in github_on.label_names(number)


def test_a_label_changed_on_the_site_reaches_the_issue_exactly_once(
    linked: Proposal, github_on: FakeGitHub, client: Any, contributor: Any
) -> None:
    number = linked.github_issue_number or 0
    github_on.label_by_hand(number=number, name="help wanted")  # a person's, not the site's
    before = len(_label_writes(github_on, number))
    services.proposal_update(proposal_id=linked.pk, actor=contributor, data={}, labels=["moe"])
    drain()
    assert "moe" in github_on.label_names(number)
    added = _label_writes(github_on, number)[before:]
    assert added == [("POST", f"/repos/{github_on.repository}/issues/{number}/labels")]
    # GitHub announces the site's own write: ignored, so nothing echoes back.
    assert _label_event(client, linked, "labeled", "moe", BOT) == ["ignored"]
    drain()
    assert len(_label_writes(github_on, number)) == before + 1
    # Taken off on the site: taken off the issue, once; the person's label stays.
    services.proposal_update(proposal_id=linked.pk, actor=contributor, data={}, labels=[])
    drain()
    names = github_on.label_names(number)
    assert "moe" not in names and "help wanted" in names
    removed = _label_writes(github_on, number)[before + 1 :]
    assert [method for method, _ in removed] == ["DELETE"]


def test_a_review_is_mirrored_as_a_comment(linked: Proposal, github_on: FakeGitHub) -> None:
    reviewer = UserFactory.create(username="rosie", roles=["reviewer"])
    services.review_submit(
        proposal_id=linked.pk,
        reviewer=reviewer,
        score=4,
        recommendation="approve",
        text="The baseline is sound.",
    )
    drain()
    bodies = [c["body"] for c in github_on.issue_comments(linked.github_issue_number or 0)]
    review = [b for b in bodies if b.startswith("**Review by rosie**")]
    assert len(review) == 1
    assert "score 4/5 · recommends approve" in review[0]
    assert "The baseline is sound." in review[0]


def _finish(run: Run, state: str, hours: float = 0.5) -> None:
    start = timezone.now() - timedelta(hours=2)
    Run.objects.filter(pk=run.pk).update(
        state=state, started_at=start, finished_at=start + timedelta(hours=hours)
    )


def test_the_result_comment_says_how_every_run_ended(
    github_on: FakeGitHub, recipe: Any, contributor: Any
) -> None:
    plan = launched_plan(recipe, SPEC, baseline={"steps": 12, "width": 32})
    runs = list(Run.objects.filter(plan=plan).select_related("entry").order_by("entry__index"))
    assert len(runs) == 4 and runs[0].entry.is_baseline
    for run, state in zip(
        runs, [RunState.FINISHED, RunState.FINISHED, RunState.FAILED, RunState.CRASHED], strict=True
    ):
        _finish(run, state)
    default = recipe.default_config["capacity_factor"]
    body = render_result(
        proposal=ProposalFactory.create(author=contributor, recipe=recipe),
        plan_id=plan.pk,
        summary={"markdown": "| run | eval/loss |"},
    )
    assert body.startswith("**Results: 2 finished, 1 failed, 1 crashed of 4.**")
    assert f"`capacity_factor: {default:g} → 2`" in body
    assert f"`capacity_factor: {default:g} → 3`: run {runs[3].pk} (crashed)" in body
    assert "Accelerator-hours used: 2 " in body
    assert "| run | eval/loss |" in body
    # A rerun of the crashed run replaces it in the count; both attempts used hours.
    rerun = Run.objects.create(
        plan=plan,
        entry=runs[3].entry,
        sequence=1,
        recipe_name=runs[3].recipe_name,
        recipe_version=runs[3].recipe_version,
        config=runs[3].config,
        config_hash=runs[3].config_hash,
    )
    _finish(rerun, RunState.FINISHED, hours=1.0)
    again = render_result(
        proposal=ProposalFactory.create(author=contributor, recipe=recipe),
        plan_id=plan.pk,
        summary={},
    )
    assert again.startswith("**Results: 3 finished, 1 failed of 4.**")
    assert "Accelerator-hours used: 3 " in again

    # Announced by runs: the comment goes to the proposal's issue through the outbox.
    proposal = ProposalFactory.create(
        author=contributor, recipe=recipe, plan=plan, state=State.APPROVED, github_issue_number=77
    )
    plan_finished.send(sender=None, plan_id=plan.pk, summary={})
    row = GitHubOutbox.objects.get(idempotency_key__startswith=f"comment:result:{plan.pk}:")
    assert row.proposal_id == proposal.pk
    assert row.payload["body"] == render_result(proposal=proposal, plan_id=plan.pk, summary={})
    assert row.payload["body"].startswith("**Results: 3 finished, 1 failed of 4.**")


def test_the_managed_block_carries_the_plan_and_the_spec(
    linked: Proposal, github_on: FakeGitHub, contributor: Any
) -> None:
    block = render_block(linked)
    assert "### Plan" in block
    assert f"runs of `{linked.recipe.name}`" in block
    assert "```yaml\n" + linked.ablation_spec.strip() + "\n```" in block
    body = github_on.issue(linked.github_issue_number or 0)["body"]
    assert linked.ablation_spec.strip() in body
    services.proposal_update(proposal_id=linked.pk, actor=contributor, data={"ablation_spec": SPEC})
    drain()
    body = github_on.issue(linked.github_issue_number or 0)["body"]
    assert "capacity_factor: [1.5, 2.0, 3.0]" in body
    assert "Plan: 4 runs" in body
