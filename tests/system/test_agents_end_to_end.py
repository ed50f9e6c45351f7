"""Runs on someone else's machines, end to end, with real processes.

The site is a live server on the test database (PostgreSQL in CI) with Redis as the Celery
broker and a worker in this process; the test plays beat, sending the reconciler every
second. Two agents of one pool are real processes running the agent program as the site
serves it (downloaded from ``/agent/marin-site-agent.py``, run with ``python -I`` from a
directory outside the project: the standard library is all it has). Their jobs are the tiny
trainer, reporting over HTTP with their run tokens.

One agent is SIGKILLed in the middle of a run: its lease runs out, the same run goes back to
the queue with its next attempt and the other agent finishes it, exactly once. The dead
agent's late report is refused (409), and so is anything its old run token sends; a revoked
agent is refused (401) and stops. A held poll is answered within a second of a run being
offered to the pool (the re-check interval is ten times longer, so only the wake-up can).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, BinaryIO

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User

from proposals.models import Proposal
from proposals.services import proposal_transition
from runs import tasks, tokens
from runs.models import MetricPoint, PlanLaunch, Run, RunEvent, RunState
from runs.pools import handout, services
from runs.pools.models import Agent, Lease, LeaseEnd, Pool
from tests.factories import ProposalFactory
from tests.runs.runs_helpers import redis_broker, wait_for

__all__ = ["redis_broker"]  # a fixture

SIX_RUNS = "axes:\n  capacity_factor: [1.5, 2.0, 3.0, 4.0, 5.0]\n"  # five points + the baseline
STEPS = 300  # about three seconds of training each on this machine
PINNED = "0123456789abcdef0123456789abcdef01234567"


class AgentProcess:
    """The served agent program, registered and running in a process of its own."""

    def __init__(self, program: Path, home: Path, name: str) -> None:
        self.program = program
        self.home = home
        self.name = name
        self.state = home / "agent.json"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: BinaryIO | None = None
        home.mkdir(parents=True)

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-I", str(self.program), "--state", str(self.state), *args]

    def env(self) -> dict[str, str]:
        # The job (the tiny trainer) needs the project and numpy: as an outsider's checkout
        # of the pinned version would give it. The agent itself runs isolated (-I).
        return {**os.environ, "PYTHONPATH": str(django_settings.BASE_DIR)}

    def register(self, url: str, token: str) -> dict[str, Any]:
        subprocess.run(  # noqa: S603
            self.command("register", "--url", url, "--token", token, "--name", self.name),
            cwd=self.home,
            env=self.env(),
            check=True,
            capture_output=True,
            timeout=60,
        )
        return dict(json.loads(self.state.read_text()))

    def start(self, *extra: str) -> None:
        self.log = (self.home / "agent.log").open("wb")
        self.proc = subprocess.Popen(  # noqa: S603
            self.command("run", "--work-dir", str(self.home / "work"), "--wait", "5", *extra),
            cwd=self.home,
            env=self.env(),
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        return (self.home / "agent.log").read_text(errors="replace")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if self.log is not None:
            self.log.close()


@pytest.mark.django_db(transaction=True)
def test_two_agents_run_a_plan_and_survive_one_of_them_dying(
    live_server: Any,
    redis_broker: None,
    settings: Any,
    tmp_path: Path,
    recipe: Any,
    contributor: Any,
    maintainer: Any,
) -> None:
    settings.SITE_URL = live_server.url
    settings.RUNS_API_URL = f"{live_server.url}/api/v1/"
    settings.RUNS_AGENT_LEASE_SECONDS = 3
    settings.RUNS_AGENT_RECHECK_SECONDS = 10
    settings.RUNS_AGENT_GRACE_SECONDS = 2
    owner = User.objects.create_user("olga")
    pool = services.pool_create(
        actor=maintainer,
        data={"name": "lab", "labels": ["cpu:x86"], "max_concurrent_runs": 4},
        owner=owner,
    )
    recipe.executor = pool.executor
    recipe.save()
    _row, token = services.registration_token_create(actor=owner, pool_id=pool.pk)

    program = tmp_path / "marin-site-agent.py"
    with urllib.request.urlopen(f"{live_server.url}/agent/marin-site-agent.py") as response:  # noqa: S310
        program.write_bytes(response.read())
    agents = [AgentProcess(program, tmp_path / name, name) for name in ("host-a", "host-b")]
    try:
        states = [agent.register(live_server.url, token) for agent in agents]
        assert {s["agent"]["pool"] for s in states} == {"lab"}
        for agent in agents:
            agent.start()
        # Both agents wait in a held poll (the live server is this process) before the plan
        # is approved. Their registration set their last contact already: waiting for that
        # let a slow agent start polling only after the offer, its lease seconds late.
        wait_for(lambda: handout.waiting("lab") == 2, timeout=60)

        proposal = ProposalFactory.create(
            author=contributor,
            recipe=recipe,
            baseline={"steps": STEPS, "width": 32},
            ablation_spec=SIX_RUNS,
        )
        proposal_transition(proposal_id=proposal.pk, action="submit", actor=contributor)
        proposal_transition(
            proposal_id=proposal.pk, action="approve", actor=maintainer, git_ref=PINNED
        )
        plan_id = Proposal.objects.get(pk=proposal.pk).plan_id
        assert plan_id is not None

        # Both agents were waiting in a held poll: each gets a run within a second of the offer.
        first = wait_for(
            lambda: Lease.objects.count() >= 2 and list(Lease.objects.order_by("pk")[:2])
        )
        for lease in first:
            offered = RunEvent.objects.get(run_id=lease.run_id, verb="offered").created_at
            assert (lease.created_at - offered).total_seconds() < 1.0, (lease.created_at, offered)
        assert {lease.agent.name for lease in first} == {"host-a", "host-b"}

        # Kill host-a in the middle of its run: once its job has reported some steps.
        victim_lease = next(lease for lease in first if lease.agent.name == "host-a")
        wait_for(lambda: MetricPoint.objects.filter(run_id=victim_lease.run_id).exists())
        assert agents[0].proc is not None
        agents[0].proc.send_signal(signal.SIGKILL)
        agents[0].proc.wait(timeout=10)
        old_token = tokens.run_token(run=Run.objects.get(pk=victim_lease.run_id))

        def plan_done() -> bool:
            tasks.reconcile_task.delay()  # what beat sends, through Redis
            return PlanLaunch.objects.filter(plan_id=plan_id, finished_at__isnull=False).exists()

        try:
            wait_for(plan_done, timeout=180, every=1.0)
        except AssertionError:
            seen = list(Run.objects.values_list("pk", "state", "attempt", "state_reason"))
            raise AssertionError(f"{seen}\n{agents[1].output()[-3000:]}") from None

        runs = list(Run.objects.filter(plan_id=plan_id))
        assert len(runs) == 6
        assert {run.state for run in runs} == {RunState.FINISHED}
        for run in runs:
            assert run.events.filter(verb="finished").count() == 1  # finished exactly once
            assert run.git_sha == PINNED
            assert MetricPoint.objects.filter(run=run, key="train/loss").count() == STEPS
        victim = Run.objects.get(pk=victim_lease.run_id)
        assert victim.attempt == 2
        history = list(
            victim.leases.order_by("pk").values_list("agent__name", "attempt", "end_reason")
        )
        assert history == [("host-a", 1, LeaseEnd.LOST), ("host-b", 2, LeaseEnd.EXITED)]
        # Its life on the timeline (alerts on its metrics, a separate story, may be there too).
        verbs = [
            verb
            for verb in victim.events.order_by("pk").values_list("verb", flat=True)
            if not verb.startswith("alert_")
        ]
        assert verbs == [
            "queued",
            "offered",
            "running",
            "preempted",
            "queued",
            "running",
            "finished",
        ]
        assert Lease.objects.filter(agent__name="host-b").count() >= 1
        # A job reports its run finished before it exits; its agent's report of the exit,
        # which ends the lease, comes a moment later.
        wait_for(lambda: not Lease.objects.filter(ended_at__isnull=True).exists(), timeout=30)

        # The dead agent's late report, and its old job's token, are refused.
        dead = states[0]
        late = _post(
            f"{live_server.url}/api/v1/agent/leases/{victim_lease.pk}/report/",
            dead["credential"],
            {"outcome": "exited", "exit_code": 0},
        )
        assert late == 409
        stale_job = _post(
            f"{live_server.url}/api/v1/runs/{victim.pk}/status/", old_token, {"state": "failed"}
        )
        assert stale_job == 409
        assert Run.objects.get(pk=victim.pk).state == RunState.FINISHED

        # A revoked agent is refused and stops.
        services.agent_revoke(actor=owner, agent_id=Agent.objects.get(name="host-b").pk)
        assert agents[1].proc is not None
        assert agents[1].proc.wait(timeout=30) == 3
        assert "refused this agent" in agents[1].output()
        assert Pool.objects.get(pk=pool.pk).agents.filter(revoked_at__isnull=True).count() == 1
    finally:
        for agent in agents:
            agent.stop()


def _post(url: str, token: str, body: dict[str, Any]) -> int:
    request = urllib.request.Request(  # noqa: S310
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
