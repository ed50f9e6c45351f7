"""The ray executor against a real local Ray head that these tests start and stop.

The head runs in its own session, on free ports and its own temp dir, so it touches no
other Ray on the machine; teardown stops exactly the processes it started.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.cache import cache

from runs.executors import ExecutorError, JobSpec, JobState
from runs.executors.ray import RayExecutor, ray_status
from runs.models import MetricPoint, PlanLaunch, Run, RunState
from runs.services import dispatch as dispatching
from runs.services import plans as plan_services
from runs.services import reconcile
from runs.tokens import run_token
from tests.runs.git_helpers import git, repo_fixture  # noqa: F401  (the repo fixture)
from tests.runs.runs_helpers import (  # noqa: F401
    eager_tasks,
    frozen_plan,
    launched_plan,
    wait_for,
)

RAY = Path(sys.executable).with_name("ray")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _own_processes(marker: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if marker.encode() in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
    return pids


@pytest.fixture(scope="session")
def ray_address() -> Iterator[str]:
    temp_dir = tempfile.mkdtemp(prefix="marin-ray-")
    dashboard = free_port()
    head = subprocess.Popen(  # noqa: S603
        [
            str(RAY),
            "start",
            "--head",
            "--block",
            "--disable-usage-stats",
            f"--port={free_port()}",
            f"--dashboard-port={dashboard}",
            "--dashboard-host=127.0.0.1",
            "--include-dashboard=true",
            "--num-cpus=2",
            f"--temp-dir={temp_dir}",
            f"--ray-client-server-port={free_port()}",
            f"--node-manager-port={free_port()}",
            f"--object-manager-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            "--min-worker-port=0",
            "--max-worker-port=0",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    address = f"http://127.0.0.1:{dashboard}"

    def answers() -> bool:
        try:
            with urllib.request.urlopen(f"{address}/api/version", timeout=2) as response:  # noqa: S310
                return response.status == 200
        except OSError:
            return False

    try:
        wait_for(answers, timeout=90, every=0.5)
        yield address
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)
        for pid in [head.pid, *_own_processes(temp_dir)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            head.wait(timeout=5)


def ray_job(tmp_path: Path, name: str, code: str) -> JobSpec:
    return JobSpec(
        job_id=f"{name}-{time.time_ns()}",
        argv=[sys.executable, "-c", code],
        workdir=tmp_path / name,
        env={"RUN_ID": "3"},
        files={"config.json": "{}"},
    )


def ended(executor: RayExecutor, job_id: str) -> JobState | None:
    status = executor.poll(job_id)
    return status.state if status.is_done else None


def test_ray_job_runs_once_with_its_files_and_env(ray_address: str, tmp_path: Path) -> None:
    executor = RayExecutor(address=ray_address)
    job = ray_job(
        tmp_path, "ok", "import os; print('run', os.environ['RUN_ID'], open('config.json').read())"
    )
    assert executor.submit(job) == job.job_id
    assert executor.submit(job) == job.job_id  # Ray refuses a second job with that id
    assert wait_for(lambda: ended(executor, job.job_id), timeout=60) == JobState.SUCCEEDED
    assert "run 3 {}" in executor.logs(job.job_id)


def test_ray_failure_and_stop_are_mapped(ray_address: str, tmp_path: Path) -> None:
    executor = RayExecutor(address=ray_address)
    bad = ray_job(tmp_path, "bad", "raise SystemExit(2)")
    slow = ray_job(tmp_path, "slow", "import time; time.sleep(120)")
    executor.submit(bad)
    executor.submit(slow)
    assert wait_for(lambda: ended(executor, bad.job_id), timeout=60) == JobState.FAILED
    assert executor.poll(bad.job_id).failure_kind == "config"
    wait_for(lambda: executor.poll(slow.job_id).state == JobState.RUNNING, timeout=60)
    executor.cancel(slow.job_id)
    assert wait_for(lambda: ended(executor, slow.job_id), timeout=60) == JobState.STOPPED
    assert executor.poll("never-submitted").state == JobState.MISSING


def test_without_ray_address_the_executor_looks_for_no_cluster(settings: Any) -> None:
    """Ray's client would go looking for a cluster on this machine by itself."""
    settings.RAY_ADDRESS = ""
    executor = RayExecutor()
    for call in (lambda: executor.poll("job-1"), lambda: executor.cancel("job-1")):
        with pytest.raises(ExecutorError, match=r"no Ray cluster is set up on this site"):
            call()


def test_without_ray_installed_the_executor_says_so(settings: Any, monkeypatch: Any) -> None:
    """bin/run installs the site without Ray (the `ray` extra)."""
    settings.RAY_ADDRESS = "http://127.0.0.1:8265"
    monkeypatch.setitem(sys.modules, "ray", None)  # as if it were not installed
    executor = RayExecutor()
    assert "Ray's client is not installed" in executor.unavailable()
    with pytest.raises(ExecutorError, match=r"Ray's client is not installed"):
        executor.poll("job-1")


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("eager_tasks")
def test_tiny_recipe_runs_on_ray_and_a_job_stopped_behind_our_back_crashes(
    ray_address: str, live_server: Any, settings: Any, tmp_path: Path, recipe: Any
) -> None:
    cache.clear()
    settings.RAY_ADDRESS = ray_address
    settings.RUNS_API_URL = f"{live_server.url}/api/v1/"
    settings.RUNS_WORK_DIR = tmp_path / "runs"
    # The run stopped behind our back trains for long enough to be stopped mid-way (ten
    # steps can finish before the stop lands); the other trains ten steps to the end.
    plan = frozen_plan(recipe, "axes:\n  steps: [5000]\n", baseline={"steps": 10, "width": 32})
    plan_services.plan_launch(plan_id=plan.pk, executor="ray")  # eager: expands and dispatches
    runs = list(Run.objects.filter(plan=plan).order_by("pk"))
    assert [run.state for run in runs] == [RunState.RUNNING, RunState.RUNNING]
    trained, stopped = sorted(runs, key=lambda run: run.config["steps"])
    assert (trained.config["steps"], stopped.config["steps"]) == (10, 5000)
    executor = RayExecutor(address=ray_address)
    wait_for(lambda: executor.poll(stopped.external_id).state == JobState.RUNNING, timeout=60)
    executor.cancel(stopped.external_id)  # someone stops the job in Ray, not through us

    def settled() -> bool:
        reconcile.runs_reconcile()
        return not Run.objects.filter(plan=plan, state=RunState.RUNNING).exists()

    wait_for(settled, timeout=90, every=1.0)
    trained.refresh_from_db()
    stopped.refresh_from_db()
    assert trained.state == RunState.FINISHED, executor.logs(trained.external_id)
    assert trained.external_id == f"run-{trained.pk}-attempt-1"
    assert MetricPoint.objects.filter(run=trained, key="train/loss").count() == 10
    assert (stopped.state, stopped.failure_kind) == (RunState.CRASHED, "infra")
    assert "stopped outside" in stopped.state_reason
    summary = PlanLaunch.objects.get(plan=plan).summary
    assert summary is not None
    assert summary["states"] == {"finished": 1, "crashed": 1}
    assert json.dumps(summary)


@pytest.mark.parametrize(
    ("state", "message", "error_type", "exit_code", "expected", "kind"),
    [
        (
            JobState.STOPPED,
            "Job was stopped: node preempted by the cloud",
            "",
            None,
            JobState.PREEMPTED,
            "",
        ),
        (
            JobState.FAILED,
            "The node running the job was PREEMPTED",
            "",
            -15,
            JobState.PREEMPTED,
            "",
        ),
        (
            JobState.FAILED,
            "Task was killed due to the node running low on memory.",
            "",
            -9,
            JobState.FAILED,
            "oom",
        ),
        (JobState.FAILED, "", "", 137, JobState.KILLED, ""),
        (JobState.FAILED, "no room left on device", "", 1, JobState.FAILED, "code"),
        (JobState.FAILED, "", "", 2, JobState.FAILED, "config"),
        (JobState.FAILED, "driver died", "JOB_SUPERVISOR_ACTOR_DIED", None, JobState.MISSING, ""),
        (JobState.STOPPED, "Job was intentionally stopped.", "", None, JobState.STOPPED, ""),
    ],
)
def test_a_ray_job_s_end_is_classified_from_ray_s_own_reason(
    state: JobState,
    message: str,
    error_type: str,
    exit_code: int | None,
    expected: JobState,
    kind: str,
) -> None:
    status = ray_status(state, message=message, error_type=error_type, exit_code=exit_code)

    assert (status.state, status.failure_kind) == (expected, kind)


# Runs the pinned commit's module, then says which commit wrote its file.
PINNED = (
    "{python} -c \"import pathlib, runpy; runpy.run_module('pinned_job', run_name='__main__'); "
    "print('which', pathlib.Path('which.json').read_text())\""
)


@pytest.mark.django_db
def test_a_ray_job_runs_from_the_pinned_commit_s_checkout(
    ray_address: str,
    recipe: Any,
    repo: Path,
    settings: Any,
    tmp_path: Path,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """Its working_dir is a copy of the pinned commit's clean checkout (not the repository's
    newer commit, not the site's runs package)."""
    settings.RAY_ADDRESS = ray_address
    settings.RUNS_WORK_DIR = tmp_path / "runs"
    settings.RUNS_CODE_DIR = tmp_path / "code"
    settings.RUNS_CODE_REPOSITORY = str(repo)
    first = git("rev-parse", "HEAD~1", cwd=repo)
    plan = launched_plan(recipe, "", executor="ray", git_ref=first[:12])
    PlanLaunch.objects.filter(plan=plan).update(command_template=PINNED)
    with django_capture_on_commit_callbacks(execute=True):
        dispatching.runs_dispatch()
    run = Run.objects.get(plan=plan)
    assert (run.git_sha, run.git_clean) == (first, True)
    assert run.external_id == f"run-{run.pk}-attempt-1"

    def finished() -> Run | None:
        reconcile.run_reconcile(run_id=run.pk)
        done = Run.objects.get(pk=run.pk)
        return done if done.is_terminal else None

    executor = RayExecutor(address=ray_address)
    done = wait_for(finished, timeout=120, every=1.0)
    logs = executor.logs(run.external_id)
    assert done.state == RunState.FINISHED, logs
    assert 'which {"version": "first"}' in logs
    info = executor._client().get_job_info(run.external_id)
    assert "py_modules" not in (info.runtime_env or {})
    assert not (Path(settings.RUNS_CODE_DIR) / "trees" / first / "which.json").exists()


# Says what its manifest held (each run's id and its token's digest, never a token) and the
# file's mode, in the job's log; a token is read from the manifest, not from the bundle.
MANIFEST_READER = (
    "{python} -c \"import hashlib, json, os; m = json.load(open(os.environ['RUN_MANIFEST'])); "
    "print('manifest', json.dumps([[t['run_id'], hashlib.sha256(t['token'].encode()).hexdigest()] "
    "for t in m['trainings']])); "
    "print('mode', oct(os.stat(os.environ['RUN_MANIFEST']).st_mode & 0o777)); "
    "print('leftover', 'RUNS_JOB_FILES' in os.environ)\""
)


@pytest.mark.django_db
def test_a_ray_job_of_several_trainings_gets_their_tokens_outside_its_bundle(
    ray_address: str,
    recipe: Any,
    settings: Any,
    tmp_path: Path,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """The manifest (every run's token) is not in the working_dir Ray uploads, nor in the
    entrypoint: it travels in this submission's runtime env and the job's first step
    writes it (mode 0600) where the job reads it."""
    settings.RAY_ADDRESS = ray_address
    settings.RUNS_WORK_DIR = tmp_path / "runs"
    plan = launched_plan(recipe, executor="ray")
    PlanLaunch.objects.filter(plan=plan).update(
        command_template=MANIFEST_READER, launch_options={"trainings": "plan"}
    )
    with django_capture_on_commit_callbacks(execute=True):
        dispatching.runs_dispatch()
    runs = list(Run.objects.filter(plan=plan).order_by("entry__index"))
    assert len(runs) == 2 and len({run.external_id for run in runs}) == 1
    external_id = runs[0].external_id
    folder = dispatching.run_workdir(run=runs[0])
    assert (folder / "config.json").exists()
    assert not (folder / "trainings.json").exists()  # never in the uploaded folder
    executor = RayExecutor(address=ray_address)
    assert wait_for(lambda: ended(executor, external_id), timeout=120) == JobState.SUCCEEDED
    logs = executor.logs(external_id)
    tokens = [run_token(run=run) for run in runs]
    expected = [
        [run.pk, hashlib.sha256(token.encode()).hexdigest()]
        for run, token in zip(runs, tokens, strict=True)
    ]
    assert f"manifest {json.dumps(expected)}" in logs, logs
    assert "mode 0o600" in logs
    assert "leftover False" in logs  # the variable is gone from the job's environment
    assert not any(token in logs for token in tokens)
    info = executor._client().get_job_info(external_id)
    assert not any(token in info.entrypoint for token in tokens)
