"""The whole loop on GitHub: submit -> issue -> /approve -> real runs -> result comment,
then /rerun -> the run again -> a new result comment.

Everything is real except GitHub itself: committed transactions, Redis as the broker with a
worker in this process, the site on a live server, the tiny trainer in subprocesses, and
PyGithub talking HTTP to the fake GitHub server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from proposals.github.fake import FakeGitHub
from proposals.models import Proposal, State
from proposals.services import proposal_transition
from runs import tasks
from runs.models import Run, RunState
from tests.factories import ProposalFactory
from tests.proposals.github_support import comment_delivery, fake_github, github_on, post_delivery
from tests.runs.runs_helpers import redis_broker, wait_for

__all__ = ["fake_github", "github_on", "redis_broker"]  # fixtures


def _results(github: FakeGitHub, number: int) -> list[str]:
    return [c["body"] for c in github.issue_comments(number) if c["body"].startswith("**Results:")]


def _say(client: Client, number: int, comment_id: int, body: str) -> None:
    delivery = comment_delivery(
        "created", number=number, comment_id=comment_id, body=body, login="maxine"
    )
    assert post_delivery(client, "issue_comment", delivery).status_code == 202


@pytest.mark.django_db(transaction=True)
def test_results_reach_the_issue_and_a_rerun_posts_new_ones(
    live_server: Any,
    redis_broker: None,
    github_on: FakeGitHub,
    settings: Any,
    tmp_path: Path,
    recipe: Any,
    contributor: Any,
) -> None:
    settings.RUNS_API_URL = f"{live_server.url}/api/v1/"
    settings.RUNS_WORK_DIR = tmp_path / "runs"
    settings.SITE_URL = live_server.url
    client = Client()
    proposal = ProposalFactory.create(
        author=contributor,
        recipe=recipe,
        baseline={"steps": 10, "width": 32},
        ablation_spec="axes:\n  top_k: [2]\n",
    )
    proposal_transition(proposal_id=proposal.pk, action="submit", actor=contributor)
    number = wait_for(lambda: Proposal.objects.get(pk=proposal.pk).github_issue_number, timeout=30)

    _say(client, number, 501, "/approve")  # a maintainer, on the issue
    wait_for(lambda: Proposal.objects.get(pk=proposal.pk).state == State.APPROVED, timeout=30)
    plan_id = Proposal.objects.get(pk=proposal.pk).plan_id
    assert plan_id is not None

    def results_posted(count: int) -> Any:
        def check() -> bool:
            tasks.reconcile_task.delay()  # what beat sends
            return len(_results(github_on, number)) >= count

        return check

    wait_for(results_posted(1), timeout=90, every=1.0)
    runs = list(Run.objects.filter(plan_id=plan_id).order_by("pk"))
    assert {run.state for run in runs} == {RunState.FINISHED}
    first = _results(github_on, number)[0]
    for run in runs:
        assert f"| {run.pk} |" in first  # a row per run, with its final metrics
    assert "eval/loss" in first
    assert "Suggested verdict" in first
    assert f"{live_server.url}/proposals/{proposal.pk}/" in first
    assert f"![Loss curves of the plan]({live_server.url}/plans/{plan_id}/loss.png)" in first
    png = client.get(f"/plans/{plan_id}/loss.png")
    assert png.status_code == 200
    assert png["Content-Type"] == "image/png"
    assert png.content.startswith(b"\x89PNG")
    status = [c for c in github_on.issue_comments(number) if "marin-site:status" in c["body"]]
    assert len(status) == 1  # one status comment, edited in place
    assert "status:approved" in github_on.label_names(number)

    again = runs[-1]
    _say(client, number, 502, f"/rerun {again.pk}")
    wait_for(results_posted(2), timeout=90, every=1.0)
    newest = Run.objects.filter(plan_id=plan_id).order_by("-pk").first()
    assert newest is not None
    assert newest.pk != again.pk
    assert newest.state == RunState.FINISHED
    results = _results(github_on, number)
    assert len(results) == 2
    assert f"| {newest.pk} |" in results[1]
    answers = [c["body"] for c in github_on.issue_comments(number) if "queued again" in c["body"]]
    assert answers
    assert f"run {again.pk} queued again as run {newest.pk}" in answers[0]
