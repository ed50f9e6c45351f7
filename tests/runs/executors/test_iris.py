"""The iris executor against a real Iris controller started locally (one per session).

Every `iris` command costs seconds to start, so each test submits few jobs; status,
look-ups and cancels go through the controller's RPCs and are quick.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import uuid
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.test import override_settings
from django.utils import timezone

from proposals import services as proposal_services
from proposals.models import State
from proposals.selectors import proposal_status_text
from runs.executors import ExecutorError, JobSpec, JobState, get_executor, iris_process
from runs.executors import iris as iris_module
from runs.executors.iris import IrisExecutor, iris_status, resource_flags, resources_problems
from runs.models import (
    DryRun,
    DryRunState,
    MetricPoint,
    PlanLaunch,
    Recipe,
    Run,
    RunEvent,
    RunState,
)
from runs.services import dispatch, dry_runs, reconcile
from runs.services import plans as plan_services
from runs.services.recipes import recipe_update, recipe_validate
from tests.factories import TINY_MOE, ProposalFactory, RecipeFactory, UserFactory
from tests.runs.executors.iris_controller import (  # noqa: F401
    IrisController,
    controller_start,
    controller_stop,
    iris_controller,
)
from tests.runs.git_helpers import git, repo_fixture  # noqa: F401  (the repo fixture)
from tests.runs.runs_helpers import (  # noqa: F401
    database_url_for_a_process,
    eager_tasks,
    frozen_plan,
    launched_plan,
    wait_for,
)

pytestmark = pytest.mark.iris

SECRET = "s3cr3t-" + uuid.uuid4().hex


def iris_settings(controller: IrisController) -> dict[str, Any]:
    return {
        "RUNS_IRIS_CONTROLLER_URL": controller.url,
        "RUNS_IRIS_COMMAND": controller.command,
        "RUNS_IRIS_HOME": controller.home,
        "RUNS_IRIS_LOCAL": True,
        "RUNS_IRIS_LOGS_TIMEOUT": 180,  # a loaded machine starts the command slowly
        "RUNS_IRIS_JOB_PREFIX": f"t{uuid.uuid4().hex[:10]}",  # one controller, many tests
    }


@pytest.fixture
def iris(iris_controller: IrisController, settings: Any) -> IrisExecutor:  # noqa: F811
    cache.delete(iris_module.BACKOFF_KEY)
    for name, value in iris_settings(iris_controller).items():
        setattr(settings, name, value)
    executor = get_executor("iris")
    assert isinstance(executor, IrisExecutor)
    return executor


def spy_on_iris(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Every `iris` command the executor runs (they do run), whether it goes to the
    long-lived submitter or starts a process; and every line a submitter is sent."""
    seen: list[list[str]] = []
    real_run = IrisExecutor._run
    real_send = iris_process.Submitter.run

    def spy(self: IrisExecutor, command: list[str], **kwargs: Any) -> Any:
        seen.append(list(command))
        return real_run(self, command, **kwargs)

    def send_spy(self: Any, argv: list[str], **kwargs: Any) -> Any:
        seen.append([*argv, *[f"{k}={v}" for k, v in kwargs["environ"].items()]])
        return real_send(self, argv, **kwargs)

    monkeypatch.setattr(IrisExecutor, "_run", spy)
    monkeypatch.setattr(iris_process.Submitter, "run", send_spy)
    return seen


@pytest.fixture
def argv_seen(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    return spy_on_iris(monkeypatch)


@pytest.fixture(scope="module", autouse=True)
def job_of_2_seconds(
    iris_controller: IrisController,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[str, list[list[str]]]:
    """A job with a time limit of 2 s, submitted as the module starts, and the commands that
    submitted it. Iris reads its jobs' limits once a minute (its controller's timeout scan),
    so the test that waits for this job to fail comes last in the module: the others run
    meanwhile, where it waited up to a minute alone."""
    workdir = tmp_path_factory.mktemp("iris-time-limit")
    spec = JobSpec(**{**job(workdir, "slow", "import time; time.sleep(600)").__dict__,
                      "time_limit_seconds": 2})  # fmt: skip
    with override_settings(**iris_settings(iris_controller)), pytest.MonkeyPatch.context() as mp:
        cache.delete(iris_module.BACKOFF_KEY)
        seen = spy_on_iris(mp)
        external_id = get_executor("iris").submit(spec)
    return external_id, seen


def submits_of(seen: list[list[str]]) -> list[list[str]]:
    """The `iris job run` commands among those seen (not the lines sent to a submitter)."""
    return [argv for argv in seen if argv[:1] != ["--controller-url"] and "run" in argv]


def job(tmp_path: Path, name: str, code: str, **env: str) -> JobSpec:
    return JobSpec(
        job_id=f"{name}-attempt-1",
        argv=[sys.executable, "-c", code],
        workdir=tmp_path / name,
        env={"RUN_ID": "7", **env},
        files={"config.json": json.dumps({"width": 32})},
    )


def ended(executor: IrisExecutor, job_id: str) -> JobState | None:
    status = executor.poll(job_id)
    return status.state if status.is_done else None


def test_a_job_runs_once_with_its_files_and_env_and_its_secret_in_no_argv(
    iris: IrisExecutor, argv_seen: list[list[str]], tmp_path: Path
) -> None:
    code = (
        "import os, json; "
        "print('run', os.environ['RUN_ID'], json.load(open('config.json'))['width'], "
        "'token ok' if os.environ['RUN_TOKEN'] == os.environ['EXPECTED_KEY'] else 'token bad')"
    )
    # Both secrets (the run's token, a name saying KEY) reach the job, never an argv.
    spec = job(tmp_path, "ok", code, RUN_TOKEN=SECRET, EXPECTED_KEY=SECRET)
    external_id = iris.submit(spec)
    assert external_id.endswith(f"/{iris.job_name(spec)}")
    assert iris.submit(spec) == external_id  # found by its name: no second job
    assert wait_for(lambda: ended(iris, external_id), timeout=120) == JobState.SUCCEEDED
    logs = iris.logs(external_id)
    assert "run 7 32 token ok" in logs
    assert SECRET not in logs
    submits = submits_of(argv_seen)
    assert len(submits) == 1
    assert submits[0][submits[0].index("-e") :][:3] == ["-e", "RUN_ID", "7"]
    assert all(SECRET not in arg for argv in argv_seen for arg in argv)
    assert not (spec.workdir / ".marin.yaml").exists()  # the secrets' file is gone
    stored = iris._rpc("GetJobStatus", {"job_id": external_id})
    assert SECRET not in json.dumps(stored.get("job", {}))
    provenance = stored["request"]["environment"]["envVars"].get("MARIN_PROVENANCE", "")
    assert "RUN_ID" in provenance  # Iris keeps the submitting command line...
    assert SECRET not in provenance  # ...which holds no secret


def test_workers_racing_to_submit_one_job_start_it_once(
    iris: IrisExecutor, argv_seen: list[list[str]], tmp_path: Path
) -> None:
    """Iris would start a finished job of the same name again: a racing submit waits."""
    spec = job(tmp_path, "race", "print('once')")
    answers: list[str] = []
    racers = [threading.Thread(target=lambda: answers.append(iris.submit(spec))) for _ in range(3)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join()
    assert len(answers) == 3
    assert len(set(answers)) == 1
    assert len(submits_of(argv_seen)) == 1
    assert wait_for(lambda: ended(iris, answers[0]), timeout=120) == JobState.SUCCEEDED


def test_failures_cancel_and_a_job_iris_does_not_know(iris: IrisExecutor, tmp_path: Path) -> None:
    bad = iris.submit(job(tmp_path, "bad", "raise SystemExit(2)"))
    slow = iris.submit(job(tmp_path, "slow", "import time; time.sleep(300)"))
    assert wait_for(lambda: ended(iris, bad), timeout=120) == JobState.FAILED
    assert iris.poll(bad).failure_kind == "config"
    wait_for(lambda: iris.poll(slow).state == JobState.RUNNING, timeout=120)
    iris.cancel(slow)
    assert wait_for(lambda: ended(iris, slow), timeout=60) == JobState.STOPPED
    iris.cancel(slow)  # idempotent
    gone = iris.poll("/nobody/never-submitted")
    assert gone.state == JobState.MISSING
    iris.cancel("/nobody/never-submitted")  # nothing to stop: no error


def test_a_refused_submit_says_why_and_backs_off(
    iris: IrisExecutor, tmp_path: Path, settings: Any
) -> None:
    spec = job(tmp_path, "refused", "print(1)")
    refused = JobSpec(**{**spec.__dict__, "resources": {"gpu": "NOSUCHGPU"}})
    with pytest.raises(ExecutorError, match=r"Iris refused job .*NOSUCHGPU"):
        iris.submit(refused)
    assert iris.job_by_name(iris.job_name(refused)) is None  # nothing half-made
    reason = iris.unavailable()  # runs wait in the queue with the reason
    assert "NOSUCHGPU" in reason
    assert "tried again in" in reason
    cache.delete(iris_module.BACKOFF_KEY)
    assert iris.unavailable() == ""


def test_iris_down_keeps_runs_waiting_with_the_reason(settings: Any, tmp_path: Path) -> None:
    cache.delete(iris_module.BACKOFF_KEY)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the block ends: nobody listens there
    settings.RUNS_IRIS_CONTROLLER_URL = f"http://127.0.0.1:{port}"
    settings.RUNS_IRIS_COMMAND = "/bin/true"
    executor = IrisExecutor()
    reason = executor.unavailable()
    assert f"Iris at http://127.0.0.1:{port} does not answer" in reason
    again = executor.unavailable()  # within the backoff: no new try, the time left said
    assert "does not answer" in again
    assert "tried again in" in again
    with pytest.raises(ExecutorError, match="does not answer"):
        executor.submit(job(tmp_path, "down", "print(1)"))
    with pytest.raises(ExecutorError, match="does not answer"):
        executor.poll("/x/run-1-attempt-1")
    settings.RUNS_IRIS_CONTROLLER_URL = ""
    assert "no Iris controller is set up" in IrisExecutor().unavailable()
    cache.delete(iris_module.BACKOFF_KEY)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("eager_tasks")
def test_tiny_recipe_trains_on_iris_a_worker_dying_mid_submit_starts_no_second_job(
    iris: IrisExecutor, live_server: Any, settings: Any, tmp_path: Path, recipe: Any
) -> None:
    settings.RUNS_API_URL = f"{live_server.url}/api/v1/"
    settings.RUNS_WORK_DIR = tmp_path / "runs"
    # Ten steps train to the end; 5000 run long enough to be found again, then canceled.
    plan = frozen_plan(recipe, "axes:\n  steps: [5000]\n", baseline={"steps": 10, "width": 32})
    plan_services.plan_launch(plan_id=plan.pk, executor="iris")  # eager: expands, dispatches
    trained, long = sorted(Run.objects.filter(plan=plan), key=lambda run: run.config["steps"])
    prefix = settings.RUNS_IRIS_JOB_PREFIX
    assert trained.external_id.endswith(f"/{prefix}-run-{trained.pk}-attempt-1")
    assert long.state == RunState.RUNNING
    # The long run's worker died after Iris took the job but before the site kept its id.
    long_id = long.external_id
    Run.objects.filter(pk=long.pk).update(external_id="")
    reconcile.run_reconcile(run_id=long.pk)  # the reconciler submits again: finds that job
    long.refresh_from_db()
    assert long.external_id == long_id
    answer = iris._rpc("ListJobs", {"query": {"name_filter": f"run-{long.pk}-attempt-1"}})
    assert [job["jobId"] for job in answer["jobs"]] == [long_id]  # one job, never two
    wait_for(lambda: iris.poll(long_id).state == JobState.RUNNING, timeout=120)
    Run.objects.filter(pk=long.pk).update(cancel_requested_at=timezone.now())

    def settled() -> bool:
        reconcile.runs_reconcile()
        return not Run.objects.filter(plan=plan, state=RunState.RUNNING).exists()

    wait_for(settled, timeout=240, every=1.0)
    trained.refresh_from_db()
    long.refresh_from_db()
    assert trained.state == RunState.FINISHED, iris.logs(trained.external_id)
    assert MetricPoint.objects.filter(run=trained, key="train/loss").count() == 10
    assert long.state == RunState.KILLED
    assert iris.poll(long_id).state == JobState.STOPPED
    assert PlanLaunch.objects.get(plan=plan).summary is not None


# Copies the manifest and the recipe's variable it was handed, then runs the pinned module.
PINNED_TOGETHER = (
    '{python} -c "import os, runpy, shutil; '
    "shutil.copy(os.environ['RUN_MANIFEST'], 'seen.json'); "
    "open('env.txt', 'w').write(os.environ['WANDB_PROJECT']); "
    "runpy.run_module('pinned_job', run_name='__main__')\""
)


@pytest.mark.django_db
def test_one_iris_job_trains_the_plan_from_the_pinned_commit(
    iris: IrisExecutor,
    argv_seen: list[list[str]],
    recipe: Any,
    repo: Path,
    settings: Any,
    tmp_path: Path,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """The job is submitted from a copy of the pinned commit's clean checkout (not the
    site's tree, not the repository's newer commit), with the filled command, the recipe's
    allowed variable and the manifest of both runs; both runs take the one job's end."""
    settings.RUNS_WORK_DIR = tmp_path / "runs"
    settings.RUNS_CODE_DIR = tmp_path / "code"
    settings.RUNS_CODE_REPOSITORY = str(repo)
    first = git("rev-parse", "HEAD~1", cwd=repo)
    plan = launched_plan(recipe, executor="iris", git_ref=first[:12])
    PlanLaunch.objects.filter(plan=plan).update(
        command_template=PINNED_TOGETHER,
        launch_options={"trainings": "plan", "env": {"WANDB_PROJECT": "marin_moe"}},
    )
    with django_capture_on_commit_callbacks(execute=True):
        started = dispatch.runs_dispatch()
    runs = list(Run.objects.filter(plan=plan).order_by("entry__index"))
    assert sorted(started) == [run.pk for run in runs]
    assert len({run.external_id for run in runs}) == 1 and runs[0].external_id.startswith("/")
    assert all((run.git_sha, run.git_clean) == (first, True) for run in runs)
    submits = submits_of(argv_seen)
    assert len(submits) == 1  # one job for the plan
    submit = submits[0]
    assert submit[submit.index("WANDB_PROJECT") - 1 :][:3] == ["-e", "WANDB_PROJECT", "marin_moe"]
    assert submit[submit.index("RUN_MANIFEST") - 1 :][:3] == [
        "-e",
        "RUN_MANIFEST",
        "trainings.json",
    ]

    def ended() -> list[Run] | None:
        for run in runs:
            reconcile.run_reconcile(run_id=run.pk)
        fresh = [Run.objects.get(pk=run.pk) for run in runs]
        return fresh if all(run.is_terminal for run in fresh) else None

    done = wait_for(ended, timeout=180, every=1.0)
    assert [run.state for run in done] == [RunState.FINISHED, RunState.FINISHED], iris.logs(
        runs[0].external_id
    )
    folder = dispatch.run_workdir(run=runs[0])
    assert json.loads((folder / "which.json").read_text()) == {"version": "first"}
    assert not (folder / ".git").exists()  # the tree, not the repository
    assert (folder / "env.txt").read_text() == "marin_moe"
    seen = json.loads((folder / "seen.json").read_text())
    assert [t["run_id"] for t in seen["trainings"]] == [run.pk for run in runs]
    # The manifest holds each run's token: never bundled, nor in an argument list; the
    # job's first step wrote it (mode 0600) from the secrets Iris handed over.
    pairs = list(itertools.pairwise(submit))
    assert ("--include", "config.json") in pairs
    assert ("--include", "trainings.json") not in pairs
    assert ("--exclude", r"(^|/)trainings\.json$") in pairs
    tokens = [t["token"] for t in seen["trainings"]]
    assert not any(token in arg for token in tokens for argv in argv_seen for arg in argv)
    assert (folder / "trainings.json").stat().st_mode & 0o777 == 0o600
    stored = json.dumps(iris._rpc("GetJobStatus", {"job_id": runs[0].external_id}))
    assert not any(token in stored for token in tokens)
    checkout = Path(settings.RUNS_CODE_DIR) / "trees" / first
    assert not (checkout / "which.json").exists()  # the shared checkout was not written to


# Prints its plan when given --dry_run true; would train (here: refuses) when given --run.
DRY_RUN_SCRIPT = (
    "import json, sys; args = sys.argv[1:]; "
    "assert '--run' not in args, 'the dry run must not train'; "
    "print('would train', json.load(open('config.json'))['steps'], 'steps'); "
    "print('DRY_RUN', json.dumps(dict(steps=12, flops=3.5e12, cost=0.25)))"
)


def proposal_with_dry_run_mode(recipe: Any) -> Any:
    recipe = recipe_update(
        recipe=recipe,
        data={
            "command_template": ["{python}", "-c", DRY_RUN_SCRIPT, "--run"],
            "launch": {"dry_run": {"drop": ["--run"], "append": ["--dry_run", "true"]}},
        },
    )
    author = UserFactory.create(username="carla", roles=["contributor"])
    return ProposalFactory.create(author=author, recipe=recipe, state=State.SUBMITTED)


@pytest.mark.django_db
def test_a_dry_run_runs_on_iris_as_a_cpu_job_and_shows_on_the_proposal_and_its_status(
    iris: IrisExecutor,
    argv_seen: list[list[str]],
    recipe: Any,
    settings: Any,
    tmp_path: Path,
    client: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    settings.RUNS_WORK_DIR = tmp_path / "runs"
    settings.RUNS_DRY_RUN_EXECUTOR = "iris"
    proposal = proposal_with_dry_run_mode(recipe)
    maintainer = UserFactory.create(username="max", roles=["maintainer"])
    with django_capture_on_commit_callbacks(execute=False):  # the worker's task, below
        dry_run = proposal_services.proposal_dry_run(proposal_id=proposal.pk, actor=maintainer)
    external_id = dry_runs.dry_run_submit(dry_run_id=dry_run.pk)
    assert external_id.endswith(f"/{settings.RUNS_IRIS_JOB_PREFIX}-dry-run-{dry_run.pk}")
    submit = submits_of(argv_seen)[0]
    assert submit[submit.index("--cpu") :][:2] == ["--cpu", "1"]  # a CPU job
    assert not {"--tpu", "--gpu"} & set(submit)
    assert dry_runs.dry_run_submit(dry_run_id=dry_run.pk) == ""  # running: not again
    before = client.get(f"/proposals/{proposal.pk}/").content.decode()  # kept as a fragment
    assert "Running</span> Dry run" in before and "3.5e+12" not in before

    def ended() -> DryRun | None:
        done = dry_runs.dry_run_settle(dry_run_id=dry_run.pk)
        return done if done is not None and done.state in ("succeeded", "failed") else None

    done = wait_for(ended, timeout=180, every=1.0)
    assert done.state == DryRunState.SUCCEEDED, (done.reason, done.output)
    assert done.figures == {"steps": 12.0, "flops": 3.5e12, "cost": 0.25}
    assert "would train" in done.output
    status = proposal_status_text(proposal)
    assert f"dry run {dry_run.pk}: succeeded (12 steps, 3.5e+12 FLOPs, cost 0.25)" in status
    assert "the site's estimate" in status
    page = client.get(f"/proposals/{proposal.pk}/").content.decode()
    assert "Dry runs" in page
    assert "The script says" in page and "3.5e+12" in page  # its end made the fragment stale
    assert "Succeeded</span> Dry run" in page
    assert f"Dry run {dry_run.pk} on <code>iris</code>" in page


@pytest.mark.django_db
def test_a_dry_run_waits_saying_why_while_iris_does_not_answer(
    recipe: Any, settings: Any, tmp_path: Path, client: Any, django_capture_on_commit_callbacks: Any
) -> None:
    cache.delete(iris_module.BACKOFF_KEY)
    settings.RUNS_WORK_DIR = tmp_path / "runs"
    settings.RUNS_DRY_RUN_EXECUTOR = "iris"
    settings.RUNS_IRIS_COMMAND = "/bin/true"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nobody listens there once the block ends
    settings.RUNS_IRIS_CONTROLLER_URL = f"http://127.0.0.1:{port}"
    proposal = proposal_with_dry_run_mode(recipe)
    maintainer = UserFactory.create(username="max", roles=["maintainer"])
    with django_capture_on_commit_callbacks(execute=False):
        dry_run = proposal_services.proposal_dry_run(proposal_id=proposal.pk, actor=maintainer)
    assert dry_runs.dry_run_submit(dry_run_id=dry_run.pk) == ""
    dry_runs.dry_runs_settle()  # the reconciler's pass, within the backoff: still waiting
    waiting = DryRun.objects.get(pk=dry_run.pk)
    assert waiting.state == DryRunState.QUEUED
    assert waiting.reason.startswith(f"waiting: Iris at http://127.0.0.1:{port} does not answer")
    assert "tried again in" in waiting.reason
    assert "does not answer" in proposal_status_text(proposal)
    assert "does not answer" in client.get(f"/proposals/{proposal.pk}/").content.decode()
    cache.delete(iris_module.BACKOFF_KEY)


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_submit_leaves_no_orphan_job(
    iris: IrisExecutor, recipe: Any, settings: Any, tmp_path: Path
) -> None:
    """A real worker process is killed (SIGKILL, with its `iris` command) once Iris has the
    job but before the site kept its id: the reconciler finds that job by its name and
    keeps it; Iris holds one job of that name, never two."""
    settings.RUNS_WORK_DIR = tmp_path / "runs"
    plan = launched_plan(recipe, "", executor="iris")
    PlanLaunch.objects.filter(plan=plan).update(command_template="{python} -c \"print('once')\"")
    run = Run.objects.get(plan=plan)
    assert dispatch.run_start(run_id=run.pk, submit=False) is not None  # running, no job yet
    env = {
        **os.environ,
        "DATABASE_URL": database_url_for_a_process(),
        "DJANGO_SETTINGS_MODULE": "marin_site.settings",
        "RUNS_IRIS_CONTROLLER_URL": settings.RUNS_IRIS_CONTROLLER_URL,
        "RUNS_IRIS_COMMAND": settings.RUNS_IRIS_COMMAND,
        "RUNS_IRIS_HOME": settings.RUNS_IRIS_HOME,
        "RUNS_IRIS_LOCAL": "1",
        "RUNS_IRIS_JOB_PREFIX": settings.RUNS_IRIS_JOB_PREFIX,
        "RUNS_WORK_DIR": str(settings.RUNS_WORK_DIR),
        "LOG_LEVEL": "WARNING",
    }
    # The submit takes a fraction of a second: the worker is held once Iris has answered,
    # before it keeps the job's id, so the kill lands in that window every time.
    code = (
        "import time, django; django.setup(); from runs.executors.iris import IrisExecutor; "
        "real = IrisExecutor.submit; "
        "IrisExecutor.submit = lambda self, job: (real(self, job), time.sleep(600))[0]; "
        "from runs.services.dispatch import run_submit; "
        f"run_submit(run_id={run.pk})"
    )
    worker = subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", code],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    name = f"{settings.RUNS_IRIS_JOB_PREFIX}-run-{run.pk}-attempt-1"
    try:
        found = wait_for(lambda: iris.job_by_name(name), timeout=180, every=0.02)
    finally:
        os.killpg(worker.pid, signal.SIGKILL)  # the worker and its `iris` command
        worker.wait(timeout=30)
    orphan = str(found["jobId"])
    killed = Run.objects.get(pk=run.pk)
    assert (killed.state, killed.external_id) == (RunState.RUNNING, "")  # its id never kept
    reconcile.run_reconcile(run_id=run.pk)  # submits again: finds the job by its name
    assert Run.objects.get(pk=run.pk).external_id == orphan
    answer = iris._rpc("ListJobs", {"query": {"name_filter": name}})
    assert [job["jobId"] for job in answer["jobs"]] == [orphan]  # one job, not two

    def finished() -> bool:
        reconcile.run_reconcile(run_id=run.pk)
        return Run.objects.get(pk=run.pk).state == RunState.FINISHED

    wait_for(finished, timeout=180, every=1.0)


@pytest.mark.django_db
def test_a_job_lost_with_its_controller_s_state_is_crashed(
    recipe: Any, settings: Any, tmp_path: Path, django_capture_on_commit_callbacks: Any
) -> None:
    """A controller of its own runs the job; it stops, and the site is pointed at its
    replacement, which started with a fresh state (Iris lost its jobs; a local cluster
    picks its own port): the next reconcile pass crashes the run, saying its job vanished,
    and submits nothing to the new controller."""
    cache.delete(iris_module.BACKOFF_KEY)
    first, address, root = controller_start()
    settings.RUNS_IRIS_CONTROLLER_URL = address.url
    settings.RUNS_IRIS_COMMAND = address.command
    settings.RUNS_IRIS_HOME = address.home
    settings.RUNS_IRIS_LOCAL = True
    settings.RUNS_IRIS_JOB_PREFIX = f"t{uuid.uuid4().hex[:10]}"
    settings.RUNS_WORK_DIR = tmp_path / "runs"
    try:
        plan = launched_plan(recipe, "", executor="iris")
        PlanLaunch.objects.filter(plan=plan).update(
            command_template='{python} -c "import time; time.sleep(600)"'
        )
        with django_capture_on_commit_callbacks(execute=True):
            dispatch.runs_dispatch()
        run = Run.objects.get(plan=plan)
        assert run.external_id.startswith("/")
        executor = IrisExecutor()
        wait_for(lambda: executor.poll(run.external_id).state == JobState.RUNNING, timeout=120)
    finally:
        controller_stop(first, root)
    second, again, root = controller_start()
    try:
        settings.RUNS_IRIS_CONTROLLER_URL = again.url
        settings.RUNS_IRIS_HOME = again.home
        reconcile.run_reconcile(run_id=run.pk)
        run.refresh_from_db()
        assert (run.state, run.failure_kind) == (RunState.CRASHED, "infra")
        assert "vanished" in run.state_reason
        name = f"{settings.RUNS_IRIS_JOB_PREFIX}-run-{run.pk}-attempt-1"
        assert IrisExecutor().job_by_name(name) is None  # nothing submitted again
    finally:
        controller_stop(second, root)
        cache.delete(iris_module.BACKOFF_KEY)


@pytest.mark.django_db
def test_a_job_that_vanished_from_iris_is_crashed(
    iris: IrisExecutor, settings: Any, tmp_path: Path, recipe: Any
) -> None:
    settings.RUNS_WORK_DIR = tmp_path / "runs"
    plan = frozen_plan(recipe, "axes:\n  steps: [10]\n", baseline={"steps": 10, "width": 32})
    plan_services.plan_launch(plan_id=plan.pk, executor="iris")
    dispatch.plan_expand(plan_id=plan.pk)
    run = Run.objects.filter(plan=plan).first()
    assert run is not None
    Run.objects.filter(pk=run.pk).update(state=RunState.RUNNING, external_id="/marin-site/gone")
    reconcile.run_reconcile(run_id=run.pk)
    run.refresh_from_db()
    assert (run.state, run.failure_kind) == (RunState.CRASHED, "infra")
    assert "vanished" in run.state_reason


@pytest.mark.parametrize(
    ("job", "expected", "kind"),
    [
        ({"state": "JOB_STATE_PENDING", "pendingReason": "no workers"}, JobState.PENDING, ""),
        ({"state": "JOB_STATE_BUILDING"}, JobState.PENDING, ""),
        ({"state": "JOB_STATE_RUNNING"}, JobState.RUNNING, ""),
        ({"state": "JOB_STATE_SUCCEEDED", "exitCode": 0}, JobState.SUCCEEDED, ""),
        ({"state": "JOB_STATE_KILLED", "error": "Terminated by user"}, JobState.STOPPED, ""),
        (
            {"state": "JOB_STATE_FAILED", "error": "Exit code: 2. stderr: bad flag"},
            JobState.FAILED,
            "config",
        ),
        (
            {"state": "JOB_STATE_FAILED", "exit_code": 1, "failure_count": 1},
            JobState.FAILED,
            "code",
        ),
        (
            {"state": "JOB_STATE_FAILED", "error": "Task OOM killed", "failureCount": 1},
            JobState.FAILED,
            "oom",
        ),
        ({"state": "JOB_STATE_FAILED", "exitCode": 137}, JobState.KILLED, ""),
        ({"state": "JOB_STATE_WORKER_FAILED", "preemptionCount": 1}, JobState.PREEMPTED, ""),
        (
            {"state": "JOB_STATE_FAILED", "preemptionCount": 3, "failureCount": 0},
            JobState.PREEMPTED,
            "",
        ),
        (
            {"state": "JOB_STATE_UNSCHEDULABLE", "pendingReason": "no v5p-8 anywhere"},
            JobState.FAILED,
            "config",
        ),
    ],
)
def test_an_iris_job_s_state_is_read_from_its_status(
    job: dict[str, Any], expected: JobState, kind: str
) -> None:
    status = iris_status(job)
    assert (status.state, status.failure_kind) == (expected, kind)


def test_a_recipe_s_resources_are_checked_when_it_is_saved() -> None:
    data = {
        **TINY_MOE,
        "resources": {"gpu": "H100x8", "cpu": -1, "priority": "system", "colour": "red"},
    }
    with pytest.raises(ValidationError) as refused:
        recipe_validate(data=data)
    problems = refused.value.message_dict["resources"]
    assert any(p.startswith("'colour' is not a resource") for p in problems)
    assert "cpu: a number of cores above 0, at most 1024" in problems
    assert any(p.startswith("priority: one of production") for p in problems)
    assert not any(p.startswith("gpu") for p in problems)
    assert resources_problems("v5p-8") == [
        "must be a mapping of tpu, gpu, cpu, memory, disk, region, zone, ... to values"
    ]
    assert resources_problems({"tpu": "v5p-8", "memory": "lots", "region": "us"}) == [
        "memory: a size such as 16GB or 512MiB",
        "region: a list of region names such as us-central2",
    ]
    recipe_validate(data={**TINY_MOE, "resources": {"tpu": "v5p-8", "region": ["us-central2"]}})


@pytest.mark.django_db
def test_the_recipe_s_resources_become_the_job_s_flags(settings: Any, tmp_path: Path) -> None:
    settings.RUNS_WORK_DIR = tmp_path / "runs"
    recipe = RecipeFactory.create(
        resources={
            "tpu": "v5p-8",
            "cpu": 4,
            "memory": "16GB",
            "region": ["us-central2", "us-east5"],
            "preemptible": False,
            "priority": "batch",
            "reserve": ["v5p-8"],
        }
    )
    plan = frozen_plan(recipe, "axes:\n  steps: [12]\n", baseline={"steps": 10, "width": 32})
    Recipe.objects.filter(pk=recipe.pk).update(resources={})  # the plan keeps what it froze
    plan_services.plan_launch(plan_id=plan.pk, executor="iris")
    dispatch.plan_expand(plan_id=plan.pk)
    run = Run.objects.filter(plan=plan).first()
    assert run is not None
    flags = resource_flags(dispatch.run_job_spec(run=run).resources)
    assert flags == [
        "--tpu",
        "v5p-8",
        "--enable-extra-resources",
        "--cpu",
        "4",
        "--memory",
        "16GB",
        "--priority",
        "batch",
        "--region",
        "us-central2",
        "--region",
        "us-east5",
        "--reserve",
        "v5p-8",
        "--no-preemptible",
    ]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("eager_tasks")
def test_runs_iris_refuses_or_cannot_reach_stay_queued_saying_why(
    iris: IrisExecutor, settings: Any, tmp_path: Path
) -> None:
    settings.RUNS_WORK_DIR = tmp_path / "runs"
    recipe = RecipeFactory.create(resources={"gpu": "NOSUCHGPU"})  # Iris knows no such GPU
    plan = frozen_plan(recipe, "axes:\n  steps: [12]\n", baseline={"steps": 10, "width": 32})
    plan_services.plan_launch(plan_id=plan.pk, executor="iris")  # eager: submits, is refused
    runs = list(Run.objects.filter(plan=plan).order_by("pk"))
    assert [run.state for run in runs] == [RunState.QUEUED, RunState.QUEUED]
    for run in runs:
        assert run.state_reason.startswith("waiting: Iris refused job"), run.state_reason
        assert "NOSUCHGPU" in run.state_reason
        assert (run.attempt, run.external_id, run.started_at) == (1, "", None)
        assert iris.job_by_name(f"{settings.RUNS_IRIS_JOB_PREFIX}-run-{run.pk}-attempt-1") is None
    assert RunEvent.objects.filter(run=runs[0], message__startswith="not submitted").exists()
    dispatch.runs_dispatch()  # within the backoff: nobody tries again, the reason stays
    for run in Run.objects.filter(plan=plan):
        assert run.state == RunState.QUEUED
        assert "tried again in" in run.state_reason
    # Iris goes down: the next pass after the backoff finds it silent; the runs wait on.
    cache.delete(iris_module.BACKOFF_KEY)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings.RUNS_IRIS_CONTROLLER_URL = f"http://127.0.0.1:{port}"
    reconcile.runs_reconcile()
    for run in Run.objects.filter(plan=plan):
        assert run.state == RunState.QUEUED
        assert run.state_reason.startswith(f"waiting: Iris at http://127.0.0.1:{port} does not")
    cache.delete(iris_module.BACKOFF_KEY)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("eager_tasks")
def test_a_refused_job_of_several_trainings_puts_them_all_back_in_the_queue(
    iris: IrisExecutor, settings: Any, tmp_path: Path
) -> None:
    settings.RUNS_WORK_DIR = tmp_path / "runs"
    recipe = RecipeFactory.create(resources={"gpu": "NOSUCHGPU"})  # Iris knows no such GPU
    Recipe.objects.filter(pk=recipe.pk).update(launch={"trainings": "plan"})
    recipe.refresh_from_db()
    plan = frozen_plan(recipe, "axes:\n  steps: [12]\n", baseline={"steps": 10, "width": 32})
    plan_services.plan_launch(plan_id=plan.pk, executor="iris")  # eager: one job, refused
    runs = list(Run.objects.filter(plan=plan).order_by("pk"))
    assert len(runs) == 2
    for run in runs:  # both wait, none left running without a job
        assert (run.state, run.external_id) == (RunState.QUEUED, "")
        assert run.state_reason.startswith("waiting: Iris refused job"), run.state_reason
    cache.delete(iris_module.BACKOFF_KEY)


def test_submits_go_to_one_long_lived_submitter_started_again_when_it_dies(
    iris: IrisExecutor, argv_seen: list[list[str]], tmp_path: Path, monkeypatch: Any
) -> None:
    """No `iris` process per submit: one submitter, in Iris's own Python, takes them all;
    killed, the next submit starts another; each job is submitted once."""
    started: list[list[str]] = []
    real_run = subprocess.run

    def no_iris_process(command: list[str], *args: Any, **kwargs: Any) -> Any:
        started.append(list(command))
        return real_run(command, *args, **kwargs)

    monkeypatch.setattr(iris_module.subprocess, "run", no_iris_process)
    first = iris.submit(job(tmp_path, "warm-1", "print(1)", RUN_TOKEN=SECRET))
    submitter = iris_process.submitter_for(
        iris_process.submitter_python(iris.command), iris._environ(None)
    )
    assert submitter.process is not None
    assert Path(submitter.python[0]).parent == Path(iris.command[0]).parent  # Iris's Python
    pid = submitter.process.pid
    second = iris.submit(job(tmp_path, "warm-2", "print(2)"))
    assert submitter.process.pid == pid  # the same process took both
    os.kill(pid, signal.SIGKILL)
    submitter.process.wait(timeout=30)
    third = iris.submit(job(tmp_path, "warm-3", "print(3)"))  # a new one is started
    assert submitter.process.pid != pid
    assert started == []  # no `iris` process was started for a submit
    assert len(submits_of(argv_seen)) == 3
    for external_id in (first, second, third):
        name = external_id.rsplit("/", 1)[-1]
        answer = iris._rpc("ListJobs", {"query": {"name_filter": name}})
        assert [j["jobId"] for j in answer["jobs"]] == [external_id]  # once each
        assert wait_for(partial(ended, iris, external_id), timeout=120) == JobState.SUCCEEDED
    assert all(SECRET not in arg for argv in argv_seen for arg in argv)  # nor in a request


def test_the_command_submits_when_asked_to(
    iris: IrisExecutor, tmp_path: Path, settings: Any, monkeypatch: Any
) -> None:
    """RUNS_IRIS_SUBMITTER=command: one `iris job run` process per submit, as before."""
    settings.RUNS_IRIS_SUBMITTER = "command"
    started: list[list[str]] = []
    real_run = subprocess.run

    def seen(command: list[str], *args: Any, **kwargs: Any) -> Any:
        started.append(list(command))
        return real_run(command, *args, **kwargs)

    monkeypatch.setattr(iris_module.subprocess, "run", seen)
    external_id = iris.submit(job(tmp_path, "by-command", "print('by command')"))
    assert [argv[:2] for argv in started] == [[iris.command[0], "--controller-url"]]
    assert wait_for(lambda: ended(iris, external_id), timeout=120) == JobState.SUCCEEDED


def test_a_submitter_that_cannot_start_says_why(
    iris: IrisExecutor, tmp_path: Path, settings: Any
) -> None:
    settings.RUNS_IRIS_PYTHON = sys.executable  # the site's Python: it has no Iris
    spec = job(tmp_path, "no-iris", "print(1)")
    with pytest.raises(ExecutorError, match=r"submitter did not start: .*No module named 'iris'"):
        iris.submit(spec)
    assert iris.job_by_name(iris.job_name(spec)) is None
    assert "No module named 'iris'" in iris.unavailable()  # runs wait, saying why
    cache.delete(iris_module.BACKOFF_KEY)


def test_the_submitter_s_python_follows_the_iris_command(settings: Any, tmp_path: Path) -> None:
    settings.RUNS_IRIS_PYTHON = ""
    marin = ["uv", "run", "--project", "/srv/marin", "iris"]
    assert iris_process.submitter_python(marin) == [
        "uv",
        "run",
        "--project",
        "/srv/marin",
        "python",
    ]
    (tmp_path / "bin").mkdir()
    for name in ("iris", "python"):
        (tmp_path / "bin" / name).touch()
    assert iris_process.submitter_python([str(tmp_path / "bin" / "iris")]) == [
        str(tmp_path / "bin" / "python")
    ]
    assert iris_process.submitter_python(["/usr/local/bin/submit-to-iris"]) == []  # the command
    settings.RUNS_IRIS_PYTHON = "/opt/iris/bin/python -I"
    assert iris_process.submitter_python(marin) == ["/opt/iris/bin/python", "-I"]


@pytest.mark.django_db
def test_the_reconciler_leaves_an_iris_job_s_time_limit_to_iris(
    iris: IrisExecutor,
    recipe: Any,
    settings: Any,
    tmp_path: Path,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """Iris counts the limit from the task's start (a job may wait long for its TPU): the
    reconciler, which fails a Ray run that outlived its limit since its submit, leaves an
    Iris run running however long ago it was submitted."""
    settings.RUNS_WORK_DIR = tmp_path / "runs"
    plan = launched_plan(recipe, "", executor="iris")
    PlanLaunch.objects.filter(plan=plan).update(
        command_template='{python} -c "import time; time.sleep(600)"'
    )
    with django_capture_on_commit_callbacks(execute=True):
        dispatch.runs_dispatch()
    run = Run.objects.get(plan=plan)
    wait_for(lambda: iris.poll(run.external_id).state == JobState.RUNNING, timeout=120)
    Run.objects.filter(pk=run.pk).update(started_at=timezone.now() - timedelta(days=2))
    reconcile.run_reconcile(run_id=run.pk)
    assert Run.objects.get(pk=run.pk).state == RunState.RUNNING
    assert iris.poll(run.external_id).state == JobState.RUNNING
    iris.cancel(run.external_id)


def test_an_idle_submitter_exits_and_the_next_submit_starts_another(
    iris: IrisExecutor, tmp_path: Path, settings: Any
) -> None:
    settings.RUNS_IRIS_SUBMITTER_IDLE_SECONDS = 1
    iris_process.submitters_stop()  # the next one starts with that idle time
    try:
        iris.submit(job(tmp_path, "idle-1", "print(1)"))
        submitter = iris_process.submitter_for(
            iris_process.submitter_python(iris.command), iris._environ(None)
        )
        first = submitter.process
        assert first is not None
        wait_for(lambda: first.poll() is not None, timeout=60)
        assert first.returncode == 0  # it left by itself, idle
        second_id = iris.submit(job(tmp_path, "idle-2", "print(2)"))
        assert submitter.process is not None and submitter.process.pid != first.pid
        assert wait_for(lambda: ended(iris, second_id), timeout=120) == JobState.SUCCEEDED
    finally:
        iris_process.submitters_stop()  # not left with a second's idle time for the others


def test_a_submitter_that_does_not_answer_in_time_is_killed_and_no_job_is_doubled(
    iris: IrisExecutor, tmp_path: Path, settings: Any
) -> None:
    iris.warm()
    submitter = iris_process.submitter_for(
        iris_process.submitter_python(iris.command), iris._environ(None)
    )
    assert submitter.process is not None
    late = submitter.process
    iris.submit(job(tmp_path, "ready", "print(0)"))  # started and answering
    spec = job(tmp_path, "late", "print('late')")
    # Shorter than any submit: the deadline has passed by the time the request is written (a
    # warm submitter on a quiet machine answered within 0.01 s, and was rightly not killed).
    settings.RUNS_IRIS_SUBMIT_TIMEOUT = 1e-9
    try:
        outcome = iris.submit(spec)  # Iris may or may not have taken it: either way, said
    except ExecutorError as exc:
        outcome = str(exc)
    assert outcome.startswith("/") or "took over 1e-09 s" in outcome, outcome
    assert late.poll() is not None  # the submitter that did not answer was killed
    settings.RUNS_IRIS_SUBMIT_TIMEOUT = 120
    cache.delete(iris_module.BACKOFF_KEY)
    external_id = iris.submit(spec)  # found by its name if Iris took it, else submitted: once
    answer = iris._rpc("ListJobs", {"query": {"name_filter": iris.job_name(spec)}})
    assert [j["jobId"] for j in answer["jobs"]] == [external_id]
    assert wait_for(lambda: ended(iris, external_id), timeout=120) == JobState.SUCCEEDED
    iris.submit(job(tmp_path, "after", "print('after')"))  # a new submitter takes it
    assert submitter.process is not None and submitter.process.pid != late.pid


# Last in the module: its job was submitted as the module started (job_of_2_seconds).
def test_the_run_s_time_limit_is_the_iris_job_s_timeout(
    iris: IrisExecutor, job_of_2_seconds: tuple[str, list[list[str]]]
) -> None:
    external_id, argv_seen = job_of_2_seconds
    submit = submits_of(argv_seen)[0]
    assert submit[submit.index("--timeout") :][:2] == ["--timeout", "2"]
    assert wait_for(lambda: ended(iris, external_id), timeout=180) == JobState.FAILED
    status = iris.poll(external_id)
    assert status.failure_kind == "timeout", status.message
    assert status.message.startswith("the time limit was reached")
