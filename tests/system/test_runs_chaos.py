"""The run queue when its machinery dies: a Celery worker SIGKILLed in the middle of a
plan, and Redis killed and started again while runs are being dispatched.

Everything is a real process: a Redis server of the test's own on a free port (so killing
it touches nobody else's), Celery workers started with the ``celery`` command and killed
with SIGKILL, the tiny trainer in subprocesses reporting to the live server, and the
database they all share. The test process plays beat: it sends the reconciler every
second. Afterwards no run may be lost or left ``running``: every run of the plan finishes.

The worker in another process reaches the test's database: PostgreSQL's (CI's), or on SQLite
the test database's file, as bin/run's worker shares the site's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from marin_site.celery import app
from proposals.models import Proposal
from proposals.services import proposal_transition
from runs import tasks
from runs.executors.local import LocalExecutor
from runs.models import MetricPoint, PlanLaunch, Run, RunState
from tests.factories import ProposalFactory
from tests.runs.runs_helpers import broker, database_url_for_a_process, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

CELERY = Path(sys.executable).with_name("celery")
REDIS_SERVER = "/usr/bin/redis-server"
SPEC = "axes:\n  capacity_factor: [1.5, 2.0, 3.0]\n  top_k: [1, 2]\n"  # 6 points + baseline


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A throwaway redis-server: no disk, its own port; kill() and start() at will."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(  # noqa: S603
            [REDIS_SERVER, "--port", str(self.port), "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(self.url).ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    self.kill()
                    raise
                time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
            self.proc = None


class Worker:
    """``celery -A marin_site worker`` in its own process group, on the test's database."""

    def __init__(self, *, broker_url: str, live_url: str, work_dir: Path) -> None:
        self.log = Path(tempfile.mkstemp(prefix="chaos-worker-", suffix=".log")[1])
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url_for_a_process(),
            "CELERY_BROKER_URL": broker_url,
            "RUNS_API_URL": f"{live_url}/api/v1/",
            "RUNS_WORK_DIR": str(work_dir),
            "RUNS_LOCAL_MAX_CONCURRENT": "2",
            "DJANGO_SETTINGS_MODULE": "marin_site.settings",
            "LOG_LEVEL": "WARNING",
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(  # noqa: S603
                [
                    str(CELERY),
                    "-A",
                    "marin_site",
                    "worker",
                    "--pool",
                    "threads",
                    "--concurrency",
                    "2",
                    "--without-mingle",
                    "--without-gossip",
                    "-l",
                    "WARNING",
                ],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def supervise(self) -> None:
        """What systemd's Restart=always does in production: a worker that exited (Celery's
        Redis transport can stop the worker when the broker vanishes) is started again."""
        if self.proc is not None and self.proc.poll() is not None:
            self.restarts += 1
            self.start()

    def kill(self) -> None:
        """SIGKILL: no warm shutdown, no acknowledgement of what it was doing."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
            self.proc = None


@contextlib.contextmanager
def beat(every: float = 1.0) -> Iterator[None]:
    """Send the reconciler as beat would; while Redis is down the send fails, as beat's would."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every):
            with contextlib.suppress(Exception):
                tasks.reconcile_task.apply_async(retry=False)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


@pytest.fixture
def machinery(live_server: Any, tmp_path: Path) -> Iterator[tuple[RedisServer, Worker]]:
    server = RedisServer()
    server.start()
    worker = Worker(broker_url=server.url, live_url=live_server.url, work_dir=tmp_path / "runs")
    try:
        with broker(server.url):
            yield server, worker
    finally:
        worker.kill()
        server.kill()
        for workdir in (tmp_path / "runs").glob("run-*/attempt-*"):
            LocalExecutor().cancel(str(workdir))


def _approve(recipe: Any, contributor: Any, maintainer: Any) -> int:
    proposal = ProposalFactory.create(
        author=contributor, recipe=recipe, baseline={"steps": 8, "width": 32}, ablation_spec=SPEC
    )
    proposal_transition(proposal_id=proposal.pk, action="submit", actor=contributor)
    proposal_transition(proposal_id=proposal.pk, action="approve", actor=maintainer)
    plan_id = Proposal.objects.get(pk=proposal.pk).plan_id
    assert plan_id is not None
    return plan_id


def _everything_finished(plan_id: int, worker: Worker) -> None:
    def finished() -> bool:
        worker.supervise()
        return PlanLaunch.objects.filter(plan_id=plan_id, finished_at__isnull=False).exists()

    try:
        wait_for(finished, timeout=150, every=1.0)
    except AssertionError:
        states = list(
            Run.objects.filter(plan_id=plan_id).values_list("pk", "state", "state_reason")
        )
        raise AssertionError(
            f"{states}\nworker restarts: {worker.restarts}\n{worker.log.read_text()[-3000:]}"
        ) from None
    runs = list(Run.objects.filter(plan_id=plan_id))
    assert len(runs) == 7
    assert {run.state for run in runs} == {RunState.FINISHED}, [
        (run.pk, run.state, run.failure_kind, run.state_reason) for run in runs
    ]
    for run in runs:
        assert MetricPoint.objects.filter(run=run, key="train/loss").count() == 8
        assert run.events.filter(to_state=RunState.FINISHED).count() == 1


def test_a_worker_killed_mid_plan_loses_no_run(
    machinery: tuple[RedisServer, Worker], recipe: Any, contributor: Any, maintainer: Any
) -> None:
    _, worker = machinery
    worker.start()
    with beat():
        plan_id = _approve(recipe, contributor, maintainer)
        wait_for(
            lambda: Run.objects.filter(plan_id=plan_id, state=RunState.RUNNING).exists(),
            timeout=60,
        )
        worker.kill()  # SIGKILL in the middle of the plan: runs running, runs still queued
        assert Run.objects.filter(plan_id=plan_id, state=RunState.QUEUED).exists()
        time.sleep(2)
        worker.start()  # a new worker; the reconciler finds what the old one left
        _everything_finished(plan_id, worker)


def test_redis_restarted_during_dispatch_loses_no_run(
    machinery: tuple[RedisServer, Worker], recipe: Any, contributor: Any, maintainer: Any
) -> None:
    server, worker = machinery
    worker.start()
    with beat():
        plan_id = _approve(recipe, contributor, maintainer)
        wait_for(
            lambda: Run.objects.filter(plan_id=plan_id, state=RunState.RUNNING).exists(),
            timeout=60,
        )
        server.kill()  # every queued message is gone with it (no persistence)
        time.sleep(3)
        server.start()  # empty; the worker reconnects and beat's reconciler starts again
        _everything_finished(plan_id, worker)
    assert app.conf.broker_url == server.url
