"""Dispatch and the reconciler on the local executor, with real subprocesses.

The jobs here are small Python commands put in the plan's recipe snapshot, so each test
controls how its job behaves; the tiny trainer itself runs in test_runs_end_to_end.py.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from marin_site.celery import app
from marin_site.errors import DomainError
from runs import tokens
from runs.executors import JobState, JobStatus
from runs.executors.local import LocalExecutor
from runs.metrics import ingest
from runs.metrics import parse as metrics_parse
from runs.models import Plan, PlanLaunch, Run, RunEvent, RunState
from runs.services import dispatch as dispatching
from runs.services import plans as plan_services
from runs.services import reconcile
from runs.services import runs as run_writes
from tests.concurrency import race
from tests.runs.runs_helpers import eager_tasks, launched_plan, wait_for  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("eager_tasks")]

ONE_RUN = ""  # the baseline alone
SLEEPER = '{python} -c "import time; time.sleep(60)"'
QUICK = "{python} -c \"import json; json.load(open('{config_path}'))\""
THREE_POINTS = """axes:
  capacity_factor: [2.0, 3.0]
"""


@pytest.fixture(autouse=True)
def _run_dir(settings: Any, tmp_path: Path) -> Iterator[None]:
    settings.RUNS_WORK_DIR = tmp_path / "runs"
    settings.RUNS_LOCAL_GRACE_SECONDS = 0.5
    yield
    for workdir in (tmp_path / "runs").glob("run-*/attempt-*"):
        LocalExecutor().cancel(str(workdir))


def with_command(plan: Plan, template: str) -> Plan:
    PlanLaunch.objects.filter(plan=plan).update(command_template=template)
    return plan


def dispatch(capture: Any) -> list[int]:
    with capture(execute=True):
        return dispatching.runs_dispatch()


def settle(run: Run, until: set[str], capture: Any, timeout: float = 20) -> Run:
    def reconciled() -> Run | None:
        with capture(execute=True):
            reconcile.run_reconcile(run_id=run.pk)
        run.refresh_from_db()
        return run if run.state in until else None

    return wait_for(reconciled, timeout=timeout, every=0.2)


def test_queued_runs_start_and_finish(recipe: Any, django_capture_on_commit_callbacks: Any) -> None:
    plan = with_command(launched_plan(recipe), QUICK)
    started = dispatch(django_capture_on_commit_callbacks)
    assert len(started) == 2
    for run in Run.objects.filter(plan=plan):
        assert run.state == RunState.RUNNING
        assert run.external_id == run.output_path
        assert run.token_hash
        assert run.token_hash != tokens.run_token(run=run)
        done = settle(run, {RunState.FINISHED, RunState.FAILED}, django_capture_on_commit_callbacks)
        assert done.state == RunState.FINISHED, LocalExecutor().logs(run.external_id)
        config = json.loads((Path(run.output_path) / "config.json").read_text())
        assert config == run.config


def test_executor_limit_keeps_the_rest_queued_with_reason(
    recipe: Any, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    settings.RUNS_EXECUTOR_MAX_CONCURRENT = {"local": 1}
    with_command(launched_plan(recipe), SLEEPER)
    assert len(dispatch(django_capture_on_commit_callbacks)) == 1
    waiting = Run.objects.get(state=RunState.QUEUED)
    assert "executor 'local' is at its limit of 1" in waiting.state_reason


def test_runs_for_a_ray_cluster_the_site_lacks_wait_and_the_rest_start(
    recipe: Any, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    settings.RAY_ADDRESS = ""
    on_ray = with_command(launched_plan(recipe, executor="ray"), SLEEPER)
    local = with_command(launched_plan(recipe, executor="local"), QUICK)

    started = dispatch(django_capture_on_commit_callbacks)

    assert sorted(started) == sorted(Run.objects.filter(plan=local).values_list("pk", flat=True))
    waiting = list(Run.objects.filter(plan=on_ray))
    assert len(waiting) == 2
    for run in waiting:
        assert run.state == RunState.QUEUED
        assert run.external_id == ""
        assert run.state_reason == "waiting: no Ray cluster is set up on this site (RAY_ADDRESS)"


def test_a_plan_runs_where_its_recipe_says_unless_the_launch_says_otherwise(
    recipe: Any, settings: Any
) -> None:
    settings.RUNS_DEFAULT_EXECUTOR = "local"
    assert launched_plan(recipe).launch.executor == "local"  # the recipe names none
    recipe.executor = "ray"
    recipe.save()
    assert launched_plan(recipe).launch.executor == "ray"
    assert launched_plan(recipe, executor="local").launch.executor == "local"


def test_a_run_ending_starts_the_next_queued_one_at_once(
    recipe: Any, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    """The slot a finished run frees is filled by a dispatch nudged from its transition,
    not at the next beat."""
    settings.RUNS_EXECUTOR_MAX_CONCURRENT = {"local": 1}
    plan = with_command(launched_plan(recipe), QUICK)
    [first] = dispatch(django_capture_on_commit_callbacks)
    waiting = Run.objects.get(plan=plan, state=RunState.QUEUED)
    settle(Run.objects.get(pk=first), {RunState.FINISHED}, django_capture_on_commit_callbacks)
    waiting.refresh_from_db()
    assert waiting.state in {RunState.RUNNING, RunState.FINISHED}
    assert waiting.started_at is not None


def test_plan_limit_keeps_the_rest_queued(
    recipe: Any, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    settings.RUNS_EXECUTOR_MAX_CONCURRENT = {"local": 8}
    with_command(launched_plan(recipe, THREE_POINTS, max_concurrent_runs=2), SLEEPER)
    assert len(dispatch(django_capture_on_commit_callbacks)) == 2
    waiting = Run.objects.get(state=RunState.QUEUED)
    assert "the plan is at its limit of 2" in waiting.state_reason


def test_budget_keeps_a_run_queued_with_the_reason(
    recipe: Any, django_capture_on_commit_callbacks: Any
) -> None:
    plan = launched_plan(recipe, budget=1.0)
    with_command(plan, SLEEPER)
    hours = Run.objects.filter(plan=plan).order_by("pk")
    first = hours[0]
    Plan.objects.filter(pk=plan.pk).update(budget_accelerator_hours=first.accelerator_hours * 1.5)
    assert dispatch(django_capture_on_commit_callbacks) == [first.pk]
    waiting = Run.objects.get(plan=plan, state=RunState.QUEUED)
    assert waiting.state_reason.startswith("waiting: would exceed the plan budget")


def test_duplicate_dispatch_starts_each_job_once(
    recipe: Any, django_capture_on_commit_callbacks: Any
) -> None:
    plan = with_command(
        launched_plan(recipe),
        QUICK.replace("json.load", "open('started','a').write('x'); json.load"),
    )
    dispatch(django_capture_on_commit_callbacks)
    assert dispatch(django_capture_on_commit_callbacks) == []
    for run in Run.objects.filter(plan=plan):
        assert dispatching.run_submit(run_id=run.pk) == run.external_id  # a duplicate delivery
        settle(run, {RunState.FINISHED}, django_capture_on_commit_callbacks)
        assert (Path(run.output_path) / "started").read_text() == "x"
        assert run.events.filter(verb="running").count() == 1


def test_cancel_a_queued_run_kills_it_at_once(recipe: Any, maintainer: Any) -> None:
    run = Run.objects.filter(plan=launched_plan(recipe)).first()
    assert run is not None
    run_writes.run_cancel(run_id=run.pk, actor=maintainer)
    run.refresh_from_db()
    assert run.state == RunState.KILLED
    assert run.cancel_requested_at is not None
    assert run.pk not in dispatching.runs_dispatch()


def test_cancel_a_running_run_stops_its_process(
    recipe: Any, maintainer: Any, django_capture_on_commit_callbacks: Any
) -> None:
    plan = with_command(launched_plan(recipe), SLEEPER)
    dispatch(django_capture_on_commit_callbacks)
    run = Run.objects.filter(plan=plan).first()
    assert run is not None
    wait_for((Path(run.output_path) / "child.json").exists)
    with django_capture_on_commit_callbacks(execute=True):
        run_writes.run_cancel(run_id=run.pk, actor=maintainer)
    run.refresh_from_db()
    assert run.state == RunState.RUNNING
    assert run.cancel_requested_at is not None
    done = settle(run, {RunState.KILLED, RunState.CRASHED}, django_capture_on_commit_callbacks)
    assert done.state == RunState.KILLED
    pgid = json.loads((Path(run.output_path) / "child.json").read_text())["pgid"]
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)


def test_a_process_killed_from_outside_is_reconciled_to_killed_not_oom(
    recipe: Any, django_capture_on_commit_callbacks: Any
) -> None:
    plan = with_command(launched_plan(recipe), SLEEPER)
    dispatch(django_capture_on_commit_callbacks)
    run = Run.objects.filter(plan=plan).first()
    assert run is not None
    wait_for((Path(run.output_path) / "child.json").exists)
    os.kill(json.loads((Path(run.output_path) / "child.json").read_text())["pid"], signal.SIGKILL)
    done = settle(
        run,
        {RunState.FAILED, RunState.CRASHED, RunState.KILLED},
        django_capture_on_commit_callbacks,
    )
    assert (done.state, done.failure_kind) == (RunState.KILLED, "")
    assert "killed by SIGKILL from outside" in done.state_reason
    assert "OOM killer" not in done.state_reason


def test_a_local_job_ending_on_sigterm_from_outside_requeues_the_same_run(
    recipe: Any, django_capture_on_commit_callbacks: Any
) -> None:
    """Preemption: the run keeps its points and goes on as its next attempt, in a new
    working directory; a resent step overwrites (the upsert)."""
    plan = with_command(launched_plan(recipe, ONE_RUN), SLEEPER)
    dispatch(django_capture_on_commit_callbacks)
    run = Run.objects.get(plan=plan)
    batch = metrics_parse.points_parse(
        data={"points": [{"key": "train/loss", "step": s, "value": 1.0} for s in (1, 2)]}
    )
    ingest.metrics_ingest(run=run, batch=batch)
    wait_for((Path(run.output_path) / "child.json").exists)
    child = json.loads((Path(run.output_path) / "child.json").read_text())

    os.killpg(child["pgid"], signal.SIGTERM)  # the machine is going away

    done = settle(run, {RunState.QUEUED, RunState.FAILED}, django_capture_on_commit_callbacks)
    assert (done.state, done.attempt) == (RunState.QUEUED, 2)
    assert [e.verb for e in done.events.order_by("pk")][-2:] == ["preempted", "queued"]
    dispatch(django_capture_on_commit_callbacks)
    again = Run.objects.get(pk=run.pk)
    assert (again.state, again.attempt) == (RunState.RUNNING, 2)
    assert again.output_path.endswith("attempt-2")
    assert again.points.count() == 2  # attempt 1's points are kept
    ingest.metrics_ingest(
        run=again,
        batch=metrics_parse.points_parse(
            data={"points": [{"key": "train/loss", "step": 2, "value": 0.5}]}
        ),
    )
    assert sorted(again.points.values_list("step", "value")) == [(1, 1.0), (2, 0.5)]


def test_the_pinned_git_ref_and_attempt_reach_a_local_job(
    recipe: Any, django_capture_on_commit_callbacks: Any
) -> None:
    pinned = "9f3c2a1b" * 5
    plan = launched_plan(recipe, ONE_RUN, git_ref=pinned)
    with_command(
        plan, "{python} -c \"import json, os; json.dump(dict(os.environ), open('env.json', 'w'))\""
    )
    dispatch(django_capture_on_commit_callbacks)
    run = Run.objects.get(plan=plan)
    assert run.git_sha == pinned
    settle(run, {RunState.FINISHED}, django_capture_on_commit_callbacks)
    env = json.loads((Path(run.output_path) / "env.json").read_text())
    assert (env["RUN_GIT_SHA"], env["RUN_GIT_REF"], env["RUN_ATTEMPT"]) == (pinned, pinned, "1")


def test_a_recipe_s_time_limit_reaches_its_runs(recipe: Any, settings: Any) -> None:
    settings.RUNS_TIME_LIMIT_SECONDS = 3600
    two_weeks = 14 * 24 * 3600
    recipe.time_limit_seconds = two_weeks
    recipe.save()
    long = launched_plan(recipe, ONE_RUN)
    recipe.time_limit_seconds = None
    recipe.save()
    default = launched_plan(recipe, ONE_RUN)

    assert Run.objects.get(plan=long).time_limit_seconds == two_weeks
    assert Run.objects.get(plan=default).time_limit_seconds == 3600


def test_vanished_job_is_reconciled_to_crashed(
    recipe: Any, django_capture_on_commit_callbacks: Any
) -> None:
    plan = with_command(launched_plan(recipe), SLEEPER)
    dispatch(django_capture_on_commit_callbacks)
    run = Run.objects.filter(plan=plan).first()
    assert run is not None
    wait_for((Path(run.output_path) / "child.json").exists)
    pids = json.loads((Path(run.output_path) / "child.json").read_text())
    os.kill(pids["supervisor"], signal.SIGKILL)  # the whole job disappears, no exit recorded
    os.killpg(pids["pgid"], signal.SIGKILL)
    done = settle(run, {RunState.CRASHED, RunState.FAILED}, django_capture_on_commit_callbacks)
    assert (done.state, done.failure_kind) == (RunState.CRASHED, "infra")
    assert "vanished" in done.state_reason


def test_stale_heartbeat_is_crashed_and_its_job_stopped(
    recipe: Any, django_capture_on_commit_callbacks: Any
) -> None:
    plan = with_command(launched_plan(recipe), SLEEPER)
    dispatch(django_capture_on_commit_callbacks)
    run = Run.objects.filter(plan=plan).first()
    assert run is not None
    wait_for((Path(run.output_path) / "child.json").exists)
    Run.objects.filter(pk=run.pk).update(heartbeat_timeout_seconds=0)
    with django_capture_on_commit_callbacks(execute=True):
        reconcile.run_reconcile(run_id=run.pk)
    run.refresh_from_db()
    assert (run.state, run.failure_kind) == (RunState.CRASHED, "infra")
    assert "no heartbeat" in run.state_reason
    executor = LocalExecutor()
    assert wait_for(lambda: executor.poll(run.external_id).is_done)


def test_a_heartbeat_arriving_while_the_reconciler_looks_saves_the_run(
    recipe: Any, monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any
) -> None:
    """The reconciler's first look at a run is unlocked; it decides to crash a silent run
    only after locking it and looking again, so a heartbeat that came in between (here:
    while the executor was polled) keeps the run running."""
    plan = with_command(launched_plan(recipe), SLEEPER)
    dispatch(django_capture_on_commit_callbacks)
    run = Run.objects.filter(plan=plan).first()
    assert run is not None
    wait_for((Path(run.output_path) / "child.json").exists)
    long_ago = timezone.now() - timedelta(hours=1)
    Run.objects.filter(pk=run.pk).update(heartbeat_timeout_seconds=60, heartbeat_at=long_ago)
    token = tokens.run_token(run=run)
    poll = LocalExecutor.poll

    def poll_while_a_heartbeat_arrives(executor: LocalExecutor, external_id: str) -> JobStatus:
        status = poll(executor, external_id)
        answer = APIClient().post(
            f"/api/v1/runs/{run.pk}/heartbeat/",
            {},
            format="json",
            HTTP_AUTHORIZATION=f"Bearer {token}",
        )
        assert answer.status_code == 200, answer.content
        return status

    monkeypatch.setattr(LocalExecutor, "poll", poll_while_a_heartbeat_arrives)
    with django_capture_on_commit_callbacks(execute=True):
        reconcile.run_reconcile(run_id=run.pk)

    run.refresh_from_db()
    assert (run.state, run.failure_kind) == (RunState.RUNNING, "")
    assert run.heartbeat_at is not None
    assert run.heartbeat_at > long_ago
    assert poll(LocalExecutor(), run.external_id).state == JobState.RUNNING


def test_a_canceled_plan_s_running_job_is_stopped_after_commit(
    recipe: Any, django_capture_on_commit_callbacks: Any
) -> None:
    """The plan's cancel only marks the running run; a task after commit (eager here)
    asks its executor to stop it, and the reconciler records it killed."""
    plan = with_command(launched_plan(recipe, max_concurrent_runs=1), SLEEPER)
    dispatch(django_capture_on_commit_callbacks)
    running = Run.objects.get(plan=plan, state=RunState.RUNNING)
    wait_for((Path(running.output_path) / "child.json").exists)

    with django_capture_on_commit_callbacks(execute=True):
        assert plan_services.plan_cancel(plan_id=plan.pk) == 2

    assert Run.objects.get(plan=plan, state=RunState.KILLED).pk != running.pk
    executor = LocalExecutor()
    assert wait_for(lambda: executor.poll(running.external_id).is_done, timeout=15)
    done = settle(running, {RunState.KILLED, RunState.CRASHED}, django_capture_on_commit_callbacks)
    assert done.state == RunState.KILLED
    pgid = json.loads((Path(running.output_path) / "child.json").read_text())["pgid"]
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)


def test_a_run_canceled_before_its_job_was_submitted_never_starts_it(
    recipe: Any, django_capture_on_commit_callbacks: Any
) -> None:
    plan = with_command(launched_plan(recipe), SLEEPER)
    run = Run.objects.filter(plan=plan).first()
    assert run is not None
    dispatching.run_start(run_id=run.pk)  # committed; its on-commit submit has not run yet
    plan_services.plan_cancel(plan_id=plan.pk)

    assert dispatching.run_submit(run_id=run.pk) == ""  # the late submit
    assert not Path(dispatching.run_workdir(run=run)).exists()
    with django_capture_on_commit_callbacks(execute=True):
        reconcile.run_reconcile(run_id=run.pk)
    run.refresh_from_db()
    assert run.state == RunState.KILLED
    assert run.state_reason == "canceled before its job was submitted"


@pytest.mark.django_db(transaction=True)
def test_two_dispatchers_at_once_start_no_more_than_the_plan_allows(recipe: Any) -> None:
    """The second dispatch waits for the first one's lock on the plan's launch, then counts
    the run the first one started: one run running, started once, not two."""
    app.conf.task_always_eager = False  # the launch's own nudges must not dispatch first
    plan = with_command(launched_plan(recipe, max_concurrent_runs=1), SLEEPER)
    assert Run.objects.filter(plan=plan, state=RunState.QUEUED).count() == 2

    first, second = race(dispatching.runs_dispatch, dispatching.runs_dispatch)

    assert len(first) + len(second) == 1
    assert Run.objects.filter(plan=plan, state=RunState.RUNNING).count() == 1
    assert RunEvent.objects.filter(run__plan=plan, verb="running").count() == 1


def test_worker_killed_between_commit_and_submit_is_resubmitted(
    recipe: Any, django_capture_on_commit_callbacks: Any
) -> None:
    """What a worker SIGKILLed mid-dispatch leaves: a running run with no job. The
    reconciler submits it (same job id, same token) instead of losing it."""
    plan = with_command(launched_plan(recipe), QUICK)
    run = Run.objects.filter(plan=plan).first()
    assert run is not None
    dispatching.run_start(run_id=run.pk)  # committed, but the on-commit submit never ran
    run.refresh_from_db()
    assert run.state == RunState.RUNNING
    assert not run.external_id
    assert not Path(run.output_path).exists()
    done = settle(run, {RunState.FINISHED}, django_capture_on_commit_callbacks)
    assert done.external_id == done.output_path


def test_lost_dispatch_message_is_made_good_by_the_reconciler(
    recipe: Any, django_capture_on_commit_callbacks: Any
) -> None:
    plan = with_command(launched_plan(recipe), QUICK)
    PlanLaunch.objects.filter(plan=plan).update(expanded_at=None)
    Run.objects.filter(plan=plan).delete()  # neither the expansion nor the dispatch ran
    with django_capture_on_commit_callbacks(execute=True):
        report = reconcile.runs_reconcile()
    assert report["expanded"] == 2
    assert report["started"] == 2
    assert Run.objects.filter(plan=plan, state=RunState.RUNNING).count() == 2


def test_config_error_in_command_template_fails_the_run(
    recipe: Any, django_capture_on_commit_callbacks: Any
) -> None:
    plan = with_command(launched_plan(recipe), "{python} -m x --config {missing}")
    dispatch(django_capture_on_commit_callbacks)
    assert set(Run.objects.filter(plan=plan).values_list("state", "failure_kind")) == {
        (RunState.FAILED, "config")
    }


@pytest.mark.django_db(transaction=True)
def test_a_rerun_asked_while_the_plan_is_being_cancelled_waits_and_is_refused(
    recipe: Any, maintainer: Any
) -> None:
    """The rerun waits for the cancel's lock on the plan's launch (taken first by both), then
    sees the plan cancelled: no queued run is left in a plan that nothing dispatches."""
    app.conf.task_always_eager = False
    plan = launched_plan(recipe)
    done = Run.objects.filter(plan=plan).order_by("pk").first()
    assert done is not None
    run_writes.run_transition(run_id=done.pk, to_state=RunState.RUNNING, door="worker")
    run_writes.run_transition(run_id=done.pk, to_state=RunState.FINISHED, door="worker")

    with pytest.raises(DomainError, match="its plan was cancelled"):
        race(
            lambda: plan_services.plan_cancel(plan_id=plan.pk, actor=maintainer),
            lambda: run_writes.run_rerun(run_id=done.pk, actor=maintainer),
        )
    assert Run.objects.filter(plan=plan).count() == 2
    assert not Run.objects.filter(plan=plan, state=RunState.QUEUED).exists()
