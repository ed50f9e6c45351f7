"""External runs: a queued run claimed by the proposal's author (or a maintainer) and
executed by hand; it reports through the same doors, is marked on its page, and a config
that is not the plan's is flagged."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from proposals.models import Proposal
from proposals.services import proposal_transition
from runs import tokens
from runs.models import Run, RunState
from runs.services import dispatch, reconcile
from tests.factories import ProposalFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def approved(contributor: Any, maintainer: Any, recipe: Any) -> Proposal:
    proposal = ProposalFactory.create(
        author=contributor, recipe=recipe, baseline={"steps": 10}, ablation_spec=""
    )
    proposal_transition(proposal_id=proposal.pk, action="submit", actor=contributor)
    proposal_transition(
        proposal_id=proposal.pk, action="approve", actor=maintainer, git_ref="cafebabe" * 5
    )
    proposal.refresh_from_db()
    assert proposal.plan_id is not None
    dispatch.plan_expand(plan_id=proposal.plan_id)
    return proposal


def the_run(proposal: Proposal) -> Run:
    assert proposal.plan_id is not None
    return Run.objects.get(plan_id=proposal.plan_id)


def claim(user: Any, run: Run, where: Any = "our lab, 8xA100") -> Any:
    client = APIClient()
    client.force_authenticate(user)
    return client.post(f"/api/v1/runs/{run.pk}/claim/", {"where": where}, format="json")


def test_the_author_claims_a_queued_run_and_gets_command_config_and_token(
    approved: Proposal, contributor: Any
) -> None:
    run = the_run(approved)

    response = claim(contributor, run)

    assert response.status_code == 201, response.json()
    body = response.json()
    run.refresh_from_db()
    assert (run.state, run.executor, run.claimed_by, run.claim_where, run.origin) == (
        RunState.RUNNING,
        "external",
        contributor,
        "our lab, 8xA100",
        "claimed",  # not launched by the site: its figures are shown as reported
    )
    assert tokens.run_token_matches(run=run, token=body["token"])
    assert body["token"] not in run.token_hash
    assert body["config"] == run.config and body["config_hash"] == run.config_hash
    assert body["env"]["RUN_GIT_SHA"] == "cafebabe" * 5
    assert "python3 -m trainers.tiny_moe --config config.json" in body["command"]
    event = run.events.get(verb="running")
    assert (event.actor, event.door) == (contributor, "api")
    assert "claimed by carla" in event.message
    heartbeat = APIClient()
    heartbeat.credentials(HTTP_AUTHORIZATION=f"Bearer {body['token']}")
    assert heartbeat.post(f"/api/v1/runs/{run.pk}/heartbeat/", {}, format="json").status_code == 200


def test_a_maintainer_may_claim_too(approved: Proposal, maintainer: Any) -> None:
    assert claim(maintainer, the_run(approved)).status_code == 201


@pytest.mark.parametrize("who", ["stranger", "reviewer", "anonymous"])
def test_anyone_else_is_refused_and_nothing_changes(
    approved: Proposal, reviewer: Any, who: str
) -> None:
    from tests.factories import UserFactory

    run = the_run(approved)
    if who == "anonymous":
        response = APIClient().post(f"/api/v1/runs/{run.pk}/claim/", {"where": "x"}, format="json")
    else:
        user = reviewer if who == "reviewer" else UserFactory.create(roles=["contributor"])
        response = claim(user, run)

    assert response.status_code in {401, 403}
    run.refresh_from_db()
    assert (run.state, run.executor, run.claimed_by, run.origin) == (
        RunState.QUEUED,
        "local",
        None,
        "launched",
    )


@pytest.mark.parametrize(
    ("where", "status"), [("", 400), ("x" * 201, 400), ("a\nb", 400), (5, 400)]
)
def test_a_claim_must_say_where_it_runs(
    approved: Proposal, contributor: Any, where: Any, status: int
) -> None:
    response = claim(contributor, the_run(approved), where)

    assert response.status_code == status
    assert list(response.json()) == ["where"]
    assert the_run(approved).state == RunState.QUEUED


def test_a_run_that_is_not_queued_cannot_be_claimed(approved: Proposal, contributor: Any) -> None:
    run = the_run(approved)
    assert claim(contributor, run).status_code == 201

    again = claim(contributor, run)

    assert again.status_code == 409
    assert again.json()["allowed_states"] == ["queued"]


def test_a_config_other_than_the_plan_s_is_flagged_not_taken(
    approved: Proposal, contributor: Any
) -> None:
    run = the_run(approved)
    token = claim(contributor, run).json()["token"]
    runner = APIClient()
    runner.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    url = f"/api/v1/runs/{run.pk}/config/"

    same = runner.post(url, {"config": run.config}, format="json")
    other = runner.post(url, {"config": {**run.config, "learning_rate": 0.1}}, format="json")
    bad = runner.post(url, {"config": [1, 2]}, format="json")

    assert same.json() == {"config_hash": run.config_hash, "matches_plan": True}
    assert other.status_code == 200 and other.json()["matches_plan"] is False
    assert bad.status_code == 400 and list(bad.json()) == ["config"]
    run.refresh_from_db()
    assert run.config_mismatch
    assert run.events.filter(verb="config_mismatch").count() == 1
    page = Client().get(f"/runs/{run.pk}/").content.decode()
    assert "Config differs from the plan" in page
    assert "Executed outside the site" in page and "our lab, 8xA100" in page


def test_giving_a_claim_back_requeues_the_same_run_and_retires_its_token(
    approved: Proposal, contributor: Any
) -> None:
    run = the_run(approved)
    token = claim(contributor, run).json()["token"]
    client = APIClient()
    client.force_authenticate(contributor)

    response = client.post(f"/api/v1/runs/{run.pk}/give-back/")

    assert response.status_code == 200, response.json()
    run.refresh_from_db()
    assert (run.state, run.attempt, run.executor, run.claimed_by) == (
        RunState.QUEUED,
        2,
        "local",
        None,
    )
    runner = APIClient()
    runner.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert runner.post(f"/api/v1/runs/{run.pk}/heartbeat/", {}, format="json").status_code == 409


def test_a_claimed_run_silent_past_its_timeout_is_crashed(
    approved: Proposal, contributor: Any, settings: Any
) -> None:
    settings.RUNS_CLAIM_HEARTBEAT_TIMEOUT_SECONDS = 600
    run = the_run(approved)
    assert claim(contributor, run).status_code == 201
    assert reconcile.run_reconcile(run_id=run.pk).state == RunState.RUNNING  # type: ignore[union-attr]

    Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=601))
    reconcile.run_reconcile(run_id=run.pk)

    run.refresh_from_db()
    assert (run.state, run.failure_kind) == (RunState.CRASHED, "infra")


def test_the_page_claims_and_shows_the_token_once(approved: Proposal, contributor: Any) -> None:
    run = the_run(approved)
    client = Client()
    client.force_login(contributor)
    assert "Run it yourself" in client.get(f"/runs/{run.pk}/").content.decode()

    response = client.post(f"/runs/{run.pk}/claim/", {"where": "home GPU"})

    assert response.status_code == 201
    text = response.content.decode()
    token = text.split('<code id="run-token">')[1].split("<")[0]
    run.refresh_from_db()
    assert tokens.run_token_matches(run=run, token=token)
    assert token not in client.get(f"/runs/{run.pk}/").content.decode()
    assert "Run it yourself" not in Client().get(f"/runs/{run.pk}/").content.decode()
