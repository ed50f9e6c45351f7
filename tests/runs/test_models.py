"""The run state machine: transitions, events, tokens, plan expansion and its cache."""

from __future__ import annotations

from typing import Any

import pytest

from marin_site.errors import TransitionNotAllowed
from runs import tokens
from runs.models import PlanLaunch, Run, RunEvent, RunState
from runs.services import dispatch, reconcile
from runs.services import plans as plan_services
from runs.services import runs as run_writes
from runs.signals import run_state_changed
from tests.runs.runs_helpers import eager_tasks, frozen_plan, launched_plan  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("eager_tasks")]

GRID_256 = """axes:
  learning_rate: [0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007, 0.008]
  weight_decay: [0.01, 0.02, 0.03, 0.04]
  capacity_factor: [1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0]
"""


def test_expansion_creates_one_queued_run_per_entry(recipe: Any) -> None:
    plan = launched_plan(recipe)
    runs = list(Run.objects.filter(plan=plan))
    assert len(runs) == plan.run_count == 2
    assert {run.state for run in runs} == {RunState.QUEUED}
    assert [e.verb for e in RunEvent.objects.filter(run__plan=plan)] == ["queued", "queued"]
    assert all(run.config_hash == run.entry.config_hash for run in runs)


def test_expanding_twice_creates_no_duplicates(recipe: Any) -> None:
    plan = launched_plan(recipe)
    assert dispatch.plan_expand(plan_id=plan.pk) == 0
    PlanLaunch.objects.filter(plan=plan).update(expanded_at=None)  # as if the task ran twice
    dispatch.plan_expand(plan_id=plan.pk)
    assert Run.objects.filter(plan=plan).count() == 2


def test_launching_twice_launches_once(recipe: Any) -> None:
    plan = frozen_plan(recipe)
    first = plan_services.plan_launch(plan_id=plan.pk, criteria={"metric": "eval/loss"})
    second = plan_services.plan_launch(plan_id=plan.pk, criteria={})
    assert first.pk == second.pk
    assert second.criteria == {"metric": "eval/loss"}


def test_a_256_run_plan_expands_into_256_queued_runs_once(
    recipe: Any, django_assert_max_num_queries: Any
) -> None:
    """The time it takes is bench/expand.py's job; here: all of them, in a bounded number
    of queries, and a second expansion adds none."""
    plan = frozen_plan(recipe, GRID_256, baseline={})
    assert plan.run_count >= 256
    plan_services.plan_launch(plan_id=plan.pk)
    with django_assert_max_num_queries(20):
        created = dispatch.plan_expand(plan_id=plan.pk)
    assert created == plan.run_count
    assert Run.objects.filter(plan=plan, state=RunState.QUEUED).count() == plan.run_count
    assert dispatch.plan_expand(plan_id=plan.pk) == 0
    assert Run.objects.filter(plan=plan).count() == plan.run_count


def test_finished_config_is_linked_as_cached_result(recipe: Any) -> None:
    first = launched_plan(recipe)
    done = Run.objects.filter(plan=first).first()
    assert done is not None
    Run.objects.filter(pk=done.pk).update(state=RunState.FINISHED, final_metrics={"eval/loss": 2.5})
    second = launched_plan(recipe)
    cached = Run.objects.get(plan=second, config_hash=done.config_hash)
    assert cached.state == RunState.FINISHED
    assert cached.cached_from_id == done.pk
    assert cached.final_metrics == {"eval/loss": 2.5}
    assert Run.objects.filter(plan=second, state=RunState.QUEUED).count() == 1


def test_transition_records_event_and_is_idempotent(recipe: Any) -> None:
    run = Run.objects.filter(plan=launched_plan(recipe)).first()
    assert run is not None
    run_writes.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door="worker")
    run_writes.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door="worker")
    run.refresh_from_db()
    assert run.state == RunState.RUNNING
    assert run.started_at is not None
    assert list(run.events.values_list("verb", "from_state", "to_state")) == [
        ("queued", "", "queued"),
        ("running", "queued", "running"),
    ]


def test_terminal_state_refuses_to_change_and_names_allowed_states(recipe: Any) -> None:
    run = Run.objects.filter(plan=launched_plan(recipe)).first()
    assert run is not None
    run_writes.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door="worker")
    run_writes.run_transition(
        run_id=run.pk, to_state=RunState.FAILED, failure_kind="code", door="worker"
    )
    with pytest.raises(TransitionNotAllowed) as refused:
        run_writes.run_transition(run_id=run.pk, to_state=RunState.FINISHED, door="worker")
    assert refused.value.allowed == ["running"]
    assert "failed" in refused.value.message
    run.refresh_from_db()
    assert (run.state, run.failure_kind) == (RunState.FAILED, "code")


def test_preempted_run_requeues_with_next_attempt(recipe: Any) -> None:
    run = Run.objects.filter(plan=launched_plan(recipe)).first()
    assert run is not None
    run_writes.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door="worker")
    run_writes.run_transition(
        run_id=run.pk, to_state=RunState.PREEMPTED, failure_kind="preempted", door="worker"
    )
    reconcile.run_reconcile(run_id=run.pk)
    run.refresh_from_db()
    assert (run.state, run.attempt) == (RunState.QUEUED, 2)


def test_preempted_on_last_attempt_fails(recipe: Any) -> None:
    run = Run.objects.filter(plan=launched_plan(recipe)).first()
    assert run is not None
    Run.objects.filter(pk=run.pk).update(state=RunState.PREEMPTED, attempt=3, max_attempts=3)
    reconcile.run_reconcile(run_id=run.pk)
    run.refresh_from_db()
    assert (run.state, run.failure_kind) == (RunState.FAILED, "preempted")


def test_state_change_signal_names_the_states(
    recipe: Any, django_capture_on_commit_callbacks: Any
) -> None:
    run = Run.objects.filter(plan=launched_plan(recipe)).first()
    assert run is not None
    heard: list[dict[str, Any]] = []

    def listener(**kwargs: Any) -> None:
        heard.append(kwargs)

    run_state_changed.connect(listener)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            run_writes.run_transition(run_id=run.pk, to_state=RunState.KILLED, door="web")
    finally:
        run_state_changed.disconnect(listener)
    assert [(h["run_id"], h["from_state"], h["to_state"]) for h in heard] == [
        (run.pk, "queued", "killed")
    ]


def test_token_matches_its_run_only(recipe: Any) -> None:
    plan = launched_plan(recipe)
    one, other = Run.objects.filter(plan=plan)
    for run in (one, other):
        run.token_hash = tokens.token_hash(tokens.run_token(run=run))
        run.save(update_fields=["token_hash"])
    assert tokens.run_token_matches(run=one, token=tokens.run_token(run=one))
    assert not tokens.run_token_matches(run=one, token=tokens.run_token(run=other))
    assert tokens.run_token(run=one) not in one.token_hash
