"""Approve -> runs -> the tiny trainer on `local` -> metrics in -> summary out.

Everything is real: the database (committed transactions), Redis as the Celery broker
(TEST_REDIS_URL, as bin/test sets it; database 13 otherwise) with an in-process worker, the
site served by a live server, and the trainer in subprocesses reporting over HTTP.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis
from celery.contrib.testing.worker import start_worker

from marin_site.celery import app
from proposals.models import Proposal
from proposals.services import proposal_transition
from runs import tasks
from runs.models import MetricPoint, PlanLaunch, Run, RunState
from runs.signals import plan_finished
from tests.factories import ProposalFactory
from tests.runs.runs_helpers import REDIS_URL, broker, redis_broker, wait_for

__all__ = ["redis_broker"]  # a fixture


@pytest.mark.django_db(transaction=True)
def test_approved_proposal_runs_and_reports_back(
    live_server: Any,
    redis_broker: None,
    settings: Any,
    tmp_path: Path,
    recipe: Any,
    contributor: Any,
    maintainer: Any,
) -> None:
    settings.RUNS_API_URL = f"{live_server.url}/api/v1/"
    settings.RUNS_WORK_DIR = tmp_path / "runs"
    proposal = ProposalFactory.create(
        author=contributor,
        recipe=recipe,
        baseline={"steps": 15, "width": 32},
        ablation_spec="axes:\n  capacity_factor: [4.0]\n",
    )
    finished: list[dict[str, Any]] = []

    def on_finished(**kwargs: Any) -> None:
        finished.append(kwargs)

    plan_finished.connect(on_finished)
    try:
        proposal_transition(proposal_id=proposal.pk, action="submit", actor=contributor)
        proposal_transition(proposal_id=proposal.pk, action="approve", actor=maintainer)
        plan_id = Proposal.objects.get(pk=proposal.pk).plan_id
        assert plan_id is not None

        def all_terminal() -> bool:
            tasks.reconcile_task.delay()  # what beat sends, through Redis
            return PlanLaunch.objects.filter(plan_id=plan_id, finished_at__isnull=False).exists()

        try:
            wait_for(all_terminal, timeout=60, every=1.0)
        except AssertionError:
            states = list(Run.objects.values_list("pk", "plan_id", "state", "state_reason"))
            raise AssertionError(f"plan {plan_id} did not finish: {states}") from None
    finally:
        plan_finished.disconnect(on_finished)

    runs = list(Run.objects.filter(plan_id=plan_id))
    assert {run.state for run in runs} == {RunState.FINISHED}, [
        (r.state, r.state_reason) for r in runs
    ]
    for run in runs:
        keys = set(MetricPoint.objects.filter(run=run).values_list("key", flat=True))
        assert keys == {
            "train/loss",
            "eval/loss",
            "eval/code/loss",
            "eval/docs/loss",
            "throughput/tokens_per_second",
            "throughput/mfu",
            "moe/drop_fraction",
            "moe/load_balance_loss",
        }
        assert MetricPoint.objects.filter(run=run, key="train/loss").count() == 15
        assert run.final_metrics["eval/loss"] > 0  # the trainer's tracker_metrics.jsonl
        assert run.events.filter(door="runner", verb="finished").exists()
    launch = PlanLaunch.objects.get(plan_id=plan_id)
    assert launch.criteria == {"metric": "eval/loss", "direction": "lower", "threshold": 0.01}
    summary = launch.summary
    assert summary is not None
    assert summary["suggested_verdict"] in {"worked", "promising", "did_not_work", "mixed"}
    assert len(summary["comparisons"]) == 1
    assert [f["plan_id"] for f in finished] == [plan_id]


@pytest.mark.django_db(transaction=True)
def test_broker_down_at_approval_loses_no_work(
    live_server: Any,
    settings: Any,
    tmp_path: Path,
    recipe: Any,
    contributor: Any,
    maintainer: Any,
) -> None:
    """Redis is down when the approval's nudges go out: the approval still commits, and once
    the broker is back the reconciler (beat) expands, dispatches and finishes the plan."""
    settings.RUNS_API_URL = f"{live_server.url}/api/v1/"
    settings.RUNS_WORK_DIR = tmp_path / "runs"
    proposal = ProposalFactory.create(
        author=contributor,
        recipe=recipe,
        baseline={"steps": 8, "width": 32},
        ablation_spec="axes:\n  top_k: [2]\n",
    )
    with broker("redis://127.0.0.1:1/13"):  # nothing listens there: every publish fails
        proposal_transition(proposal_id=proposal.pk, action="submit", actor=contributor)
        proposal_transition(proposal_id=proposal.pk, action="approve", actor=maintainer)
    plan_id = Proposal.objects.get(pk=proposal.pk).plan_id
    assert plan_id is not None
    assert PlanLaunch.objects.filter(plan_id=plan_id, expanded_at__isnull=True).exists()
    assert not Run.objects.filter(plan_id=plan_id).exists()
    redis.Redis.from_url(REDIS_URL).flushdb()
    with (
        broker(REDIS_URL),
        start_worker(app, pool="threads", concurrency=2, perform_ping_check=False),
    ):

        def finished() -> bool:
            tasks.reconcile_task.delay()
            return PlanLaunch.objects.filter(plan_id=plan_id, finished_at__isnull=False).exists()

        wait_for(finished, timeout=60, every=1.0)
    redis.Redis.from_url(REDIS_URL).flushdb()
    states = set(Run.objects.filter(plan_id=plan_id).values_list("state", flat=True))
    assert states == {RunState.FINISHED}
