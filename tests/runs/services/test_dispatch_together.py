"""One job, several trainings: a recipe that trains its plan's runs in one launch gets one
job with a manifest of each run's own id, token and tracker name; the job's end fans out to
its runs, and a training that reported its own end keeps it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runs import tokens
from runs.executors.local import LocalExecutor
from runs.models import PlanLaunch, Run, RunState
from runs.services import dispatch as dispatching
from runs.services import reconcile
from runs.services import runs as run_writes
from tests.runs.runs_helpers import launched_plan, wait_for

pytestmark = pytest.mark.django_db

# Copies the manifest it was handed beside itself, then ends as told by the config.
COPY_MANIFEST = (
    "{python} -c \"import json, os, shutil; shutil.copy(os.environ['RUN_MANIFEST'], 'seen.json')\""
)


@pytest.fixture(autouse=True)
def _run_dir(settings: Any, tmp_path: Path) -> Iterator[None]:
    settings.RUNS_WORK_DIR = tmp_path / "runs"
    settings.RUNS_LOCAL_GRACE_SECONDS = 0.5
    settings.RUNS_EXECUTOR_MAX_CONCURRENT = {"local": 1}
    yield
    for workdir in (tmp_path / "runs").glob("run-*/attempt-*"):
        LocalExecutor().cancel(str(workdir))


def together(recipe: Any) -> list[Run]:
    plan = launched_plan(recipe)
    PlanLaunch.objects.filter(plan=plan).update(
        command_template=COPY_MANIFEST, launch_options={"trainings": "plan"}
    )
    return list(Run.objects.filter(plan=plan).order_by("entry__index"))


def settled(runs: list[Run]) -> list[Run]:
    def done() -> list[Run] | None:
        for run in runs:
            reconcile.run_reconcile(run_id=run.pk)
        fresh = [Run.objects.get(pk=run.pk) for run in runs]
        return fresh if all(run.is_terminal for run in fresh) else None

    result: list[Run] = wait_for(done, timeout=30, every=0.2)
    return result


def test_one_job_trains_every_run_of_the_plan_each_with_its_own_token(
    recipe: Any, django_capture_on_commit_callbacks: Any
) -> None:
    runs = together(recipe)
    with django_capture_on_commit_callbacks(execute=True):
        started = dispatching.runs_dispatch()
    assert sorted(started) == sorted(run.pk for run in runs)  # the executor's limit is 1 job
    fresh = [Run.objects.get(pk=run.pk) for run in runs]
    assert {run.state for run in fresh} == {RunState.RUNNING}
    assert len({run.external_id for run in fresh}) == 1 and fresh[0].external_id

    ended = settled(runs)
    assert [run.state for run in ended] == [RunState.FINISHED, RunState.FINISHED]
    seen = json.loads((dispatching.run_workdir(run=runs[0]) / "seen.json").read_text())
    trainings = {t["run_id"]: t for t in seen["trainings"]}
    assert set(trainings) == {run.pk for run in runs}
    for run in runs:
        assert trainings[run.pk]["token"] == tokens.run_token(run=run)
        assert trainings[run.pk]["run_name"].endswith(f"run{run.pk}")
        assert trainings[run.pk]["config"] == run.config
    assert "runs/{run_id}/status/" in seen["report_end"]


def test_a_training_that_reported_its_failure_keeps_it_and_the_others_take_the_jobs_end(
    recipe: Any, django_capture_on_commit_callbacks: Any
) -> None:
    runs = together(recipe)
    with django_capture_on_commit_callbacks(execute=True):
        dispatching.runs_dispatch()
    run_writes.run_transition(  # as its training reports through its own token
        run_id=runs[1].pk,
        to_state=RunState.FAILED,
        failure_kind="code",
        door="runner",
        message="diverged",
    )
    ended = settled(runs)
    assert [run.state for run in ended] == [RunState.FINISHED, RunState.FAILED]
    assert ended[1].state_reason == "diverged"


def test_a_plan_launched_one_run_per_job_still_starts_one_at_a_time(
    recipe: Any, django_capture_on_commit_callbacks: Any
) -> None:
    plan = launched_plan(recipe)
    PlanLaunch.objects.filter(plan=plan).update(
        command_template=COPY_MANIFEST.replace("RUN_MANIFEST", "RUN_ID")
    )
    with django_capture_on_commit_callbacks(execute=True):
        assert len(dispatching.runs_dispatch()) == 1
