"""The agent program (client/marin_client/agent.py) against a live server: how it stops its job and what
it reports when it is told to stop, when the run is canceled, when the time limit passes,
when the command cannot start, and when its lease is lost. Jobs here are small Python
commands, so each test controls its job; the trainer runs in test_agents_end_to_end.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from marin_client import agent as agent_program

from runs import tokens
from runs.models import PlanLaunch, Recipe, Run, RunState
from runs.pools import leases, services
from runs.pools.models import Lease, LeaseEnd
from runs.services import dispatch
from runs.services import runs as run_writes
from tests.runs.git_helpers import git, repo_fixture  # noqa: F401  (the repo fixture)
from tests.runs.pools.pool_helpers import ONE_RUN, make_pool
from tests.runs.runs_helpers import launched_plan, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

AGENT = Path(agent_program.__file__)
# Writes its pid and environment, then waits; SIGTERM ends it with exit 143 after a moment.
PATIENT = (
    '{python} -c "import json, os, signal, sys, time; '
    "json.dump(dict(os.environ), open('env.json', 'w')); "
    'signal.signal(signal.SIGTERM, lambda *a: sys.exit(143)); time.sleep(120)"'
)
STUBBORN = '{python} -c "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"'


STARTED: list[subprocess.Popen[bytes]] = []


@pytest.fixture(autouse=True)
def _agents_stopped() -> Iterator[None]:
    """An agent a failed test left running is killed (its job dies with it: PDEATHSIG)."""
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def site(live_server: Any, settings: Any) -> str:
    settings.SITE_URL = live_server.url
    settings.RUNS_API_URL = f"{live_server.url}/api/v1/"
    settings.RUNS_AGENT_LEASE_SECONDS = 4
    settings.RUNS_AGENT_RECHECK_SECONDS = 0.5
    settings.RUNS_AGENT_GRACE_SECONDS = 1
    return str(live_server.url)


def start_agent(
    site: str, tmp_path: Path, command: str, **launch: Any
) -> tuple[subprocess.Popen[bytes], Run]:
    """A pool with one offered run of ``command``, and the agent program registered to it."""
    owner = User.objects.create_user("olga")
    pool = make_pool(owner)
    plan = launched_plan(Recipe.objects.get(), ONE_RUN, executor=pool.executor, **launch)
    PlanLaunch.objects.filter(plan=plan).update(command_template=command)
    dispatch.runs_dispatch()
    _row, token = services.registration_token_create(actor=owner, pool_id=pool.pk)
    state = tmp_path / "agent.json"
    base = [sys.executable, "-I", str(AGENT), "--state", str(state)]
    subprocess.run(  # noqa: S603
        [*base, "register", "--url", site, "--token", token, "--name", "box"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    with (tmp_path / "agent.log").open("wb") as log:  # the child keeps its own copy
        proc = subprocess.Popen(  # noqa: S603
            [*base, "run", "--work-dir", str(tmp_path / "work"), "--wait", "2", "--once"],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    STARTED.append(proc)
    return proc, Run.objects.get(plan=plan)


def leased_job_env(tmp_path: Path, run: Run) -> dict[str, str]:
    import json

    path = tmp_path / "work" / f"run-{run.pk}" / "attempt-1" / "env.json"
    wait_for(path.exists, timeout=30)
    wait_for(lambda: path.stat().st_size > 0)
    return dict(json.loads(path.read_text()))


def test_sigterm_to_the_agent_stops_the_job_and_reports_it_preempted(
    site: str, tmp_path: Path, recipe: Any
) -> None:
    proc, run = start_agent(site, tmp_path, PATIENT)
    env = leased_job_env(tmp_path, run)

    proc.send_signal(signal.SIGTERM)

    assert proc.wait(timeout=30) == 0
    run.refresh_from_db()
    assert (run.state, run.attempt) == (RunState.QUEUED, 2)  # the same run, next attempt
    lease = Lease.objects.get(run=run)
    assert lease.end_reason == LeaseEnd.PREEMPTED
    assert run.events.filter(verb="preempted", door="agent").exists()
    assert env["RUN_ID"] == str(run.pk)
    assert env["RUN_API_URL"] == f"{site}/api/v1/"
    assert env["RUN_ATTEMPT"] == "1"
    assert "RUN_GIT_SHA" in env
    assert env["RUN_TOKEN"] == tokens.run_token(run=Run(pk=run.pk, attempt=1))
    assert (tmp_path / "work" / f"run-{run.pk}" / "attempt-1" / "marin_run_client.py").exists()


def test_a_canceled_run_s_job_is_stopped_and_reported_killed(
    site: str, tmp_path: Path, recipe: Any, maintainer: Any
) -> None:
    proc, run = start_agent(site, tmp_path, PATIENT)
    leased_job_env(tmp_path, run)

    run_writes.run_cancel(run_id=run.pk, actor=maintainer)

    assert proc.wait(timeout=30) == 0
    run.refresh_from_db()
    assert run.state == RunState.KILLED
    assert Lease.objects.get(run=run).outcome["outcome"] == "canceled"


def test_a_job_past_its_time_limit_is_stopped_even_if_it_ignores_sigterm(
    site: str, tmp_path: Path, recipe: Any
) -> None:
    proc, run = start_agent(site, tmp_path, STUBBORN)
    Run.objects.filter(pk=run.pk).update(time_limit_seconds=2)  # read when it is leased

    assert proc.wait(timeout=60) == 0
    run.refresh_from_db()
    assert (run.state, run.failure_kind) == (RunState.FAILED, "timeout")


def test_a_command_that_cannot_start_is_reported(site: str, tmp_path: Path, recipe: Any) -> None:
    proc, run = start_agent(site, tmp_path, "/nonexistent/trainer --config {config_path}")

    assert proc.wait(timeout=60) == 0
    run.refresh_from_db()
    assert (run.state, run.failure_kind) == (RunState.FAILED, "infra")
    assert "could not start" in run.state_reason


def test_a_job_killed_from_outside_is_reported_as_killed_not_oom(
    site: str, tmp_path: Path, recipe: Any
) -> None:
    proc, run = start_agent(site, tmp_path, PATIENT)
    env = leased_job_env(tmp_path, run)
    pid = _job_pid(tmp_path, run)
    assert env["RUN_ID"] == str(run.pk)

    os.kill(pid, signal.SIGKILL)

    assert proc.wait(timeout=30) == 0
    run.refresh_from_db()
    assert run.state == RunState.KILLED
    assert "SIGKILL from outside" in run.state_reason
    assert "OOM killer" not in run.state_reason


def test_a_lost_lease_stops_the_job_and_reports_nothing(
    site: str, tmp_path: Path, recipe: Any
) -> None:
    proc, run = start_agent(site, tmp_path, PATIENT)
    leased_job_env(tmp_path, run)
    lease = Lease.objects.get(run=run)

    Lease.objects.filter(pk=lease.pk).update(expires_at=lease.created_at)  # it ran out
    leases.leases_expire_stale()

    assert proc.wait(timeout=30) == 0  # told 409 on its next renewal: the run is not its own
    lease.refresh_from_db()
    assert (lease.end_reason, lease.outcome) == (LeaseEnd.LOST, {})
    run.refresh_from_db()
    assert (run.state, run.attempt) == (RunState.QUEUED, 2)
    assert "is over" in (tmp_path / "agent.log").read_text()


def _job_pid(tmp_path: Path, run: Run) -> int:
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if cwd.endswith(f"run-{run.pk}/attempt-1"):
            return int(proc.name)
    raise AssertionError("the job's process was not found")


def test_the_installed_console_script_is_the_agent() -> None:
    script = Path(sys.executable).with_name("marin-site-agent")

    done = subprocess.run([str(script), "--version"], capture_output=True, text=True, check=True)  # noqa: S603

    assert done.stdout.strip() == f"marin-site-agent {agent_program.VERSION}"


# The commit pinned at approval: the agent fetches its source archive from the site with its
# credential, and the job imports its code from it, so a recipe whose code is not on the
# agent's machine runs there (a repository made in the test: tests/runs/git_helpers.py).


def test_the_agent_runs_the_pinned_commit_from_its_archive(
    site: str, tmp_path: Path, recipe: Any, repo: Path, settings: Any
) -> None:
    settings.RUNS_CODE_REPOSITORY, settings.RUNS_CODE_DIR = str(repo), tmp_path / "site-code"
    first = git("rev-parse", "HEAD~1", cwd=repo)
    proc, run = start_agent(site, tmp_path, "{python} -m pinned_job", git_ref=first[:12])

    assert proc.wait(timeout=60) == 0
    run.refresh_from_db()
    assert run.state == RunState.FINISHED, run.state_reason
    assert (run.git_sha, run.git_clean) == (first, True)
    which = tmp_path / "work" / f"run-{run.pk}" / "attempt-1" / "which.json"
    assert json.loads(which.read_text()) == {"version": "first"}
    assert (tmp_path / "work" / "code" / first[:12] / "pinned_job" / "__main__.py").exists()


def test_an_agent_given_a_commit_that_does_not_exist_fails_the_run_and_starts_nothing(
    site: str, tmp_path: Path, recipe: Any, repo: Path, settings: Any
) -> None:
    settings.RUNS_CODE_REPOSITORY, settings.RUNS_CODE_DIR = str(repo), tmp_path / "site-code"
    proc, run = start_agent(site, tmp_path, "{python} -m pinned_job", git_ref="e" * 40)

    assert proc.wait(timeout=60) == 0
    done = wait_for(lambda: Run.objects.filter(pk=run.pk, state=RunState.FAILED).first())
    assert done.failure_kind == "config"
    assert f"commit {'e' * 40} does not exist" in done.state_reason
    assert not (tmp_path / "work" / f"run-{run.pk}" / "attempt-1" / "which.json").exists()


# Nothing pinned and no RUNS_CODE_REPOSITORY: a pool's launch pins the site's own HEAD, and
# the agent runs the shipped tiny recipe from that commit's archive, on a Python that has
# numpy but not the site's code (an outsider's machine), started outside the project.


def outsider_python(tmp_path: Path) -> str:
    """A Python with numpy and nothing of the site: a fresh venv seeing this one's
    site-packages as a plain folder (so the site's editable install is not read)."""
    import sysconfig

    env = tmp_path / "outsider"
    subprocess.run(  # noqa: S603
        [sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120
    )
    python = str(env / "bin" / "python")
    purelib = subprocess.run(  # noqa: S603
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(purelib, "numpy-only.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def test_a_fresh_agent_runs_the_tiny_recipe_from_the_site_s_own_commit(
    site: str, tmp_path: Path, recipe: Any, settings: Any
) -> None:
    from runs.executors.code import site_checkout

    settings.RUNS_CODE_REPOSITORY, settings.RUNS_CODE_DIR = "", tmp_path / "site-code"
    repository, head = site_checkout()
    assert (repository, len(head)) == (str(settings.BASE_DIR), 40)  # the site is a checkout
    python = outsider_python(tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    for module in ("trainers.tiny_moe", "marin_client.client", "runs"):
        probe = subprocess.run(  # noqa: S603
            [python, "-c", f"import {module}"],
            cwd=outside,
            capture_output=True,
            text=True,
            check=False,
        )
        assert probe.returncode != 0 and "No module named" in probe.stderr, module
    subprocess.run([python, "-c", "import numpy"], cwd=outside, check=True)  # noqa: S603

    owner = User.objects.create_user("olga")
    pool = make_pool(owner)
    plan = launched_plan(Recipe.objects.get(), ONE_RUN, executor=pool.executor)  # no ref
    launch = PlanLaunch.objects.get(plan=plan)
    assert (launch.git_repository, launch.git_ref) == (repository, head)
    Run.objects.filter(plan=plan).update(config={**Run.objects.get(plan=plan).config, "steps": 20})
    dispatch.runs_dispatch()
    _row, token = services.registration_token_create(actor=owner, pool_id=pool.pk)
    base = [python, "-I", str(AGENT), "--state", str(tmp_path / "agent.json")]
    subprocess.run(  # noqa: S603
        [*base, "register", "--url", site, "--token", token, "--name", "box"],
        cwd=outside,
        check=True,
        capture_output=True,
        timeout=60,
    )
    with (tmp_path / "agent.log").open("wb") as log:
        proc = subprocess.Popen(  # noqa: S603
            [*base, "run", "--work-dir", str(tmp_path / "work"), "--wait", "2", "--once"],
            cwd=outside,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)},
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    STARTED.append(proc)
    assert proc.wait(timeout=300) == 0, (tmp_path / "agent.log").read_text()[-3000:]
    run = Run.objects.get(plan=plan)
    job_log = "".join(
        path.read_text(errors="replace") for path in (tmp_path / "work").rglob("*.log")
    )
    assert run.state == RunState.FINISHED, (run.state_reason, job_log[-3000:])
    assert (run.git_sha, run.git_clean) == (head, True)
    assert "No module named" not in job_log
    assert (tmp_path / "work" / "code" / head / "trainers" / "tiny_moe" / "train.py").exists()
    from runs.models import MetricPoint

    assert MetricPoint.objects.filter(run=run, key="train/loss").count() == 20
