"""Leases: offering a pool's runs within limits, leasing, renewing, reporting, and what
happens when a lease is lost, abandoned or revoked."""

from __future__ import annotations

import json
import signal
from functools import partial
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from marin_site.errors import ActionForbidden
from runs import tokens
from runs.models import PlanLaunch, Run, RunEvent, RunState
from runs.pools import leases, services
from runs.pools.leases import LeaseGone, LeaseReport
from runs.pools.models import Lease, LeaseEnd
from runs.services import dispatch, reconcile
from runs.services import runs as run_writes
from tests.concurrency import Worker
from tests.runs.pools.pool_helpers import (
    FOUR_RUNS,
    ONE_RUN,
    expire,
    make_agent,
    make_pool,
    offered_plan,
    runs_of,
)
from tests.runs.runs_helpers import launched_plan

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner() -> User:
    return User.objects.create_user("olga")


def test_dispatch_offers_pool_runs_up_to_the_pool_limit(recipe: Any, owner: User) -> None:
    pool = make_pool(owner, max_concurrent_runs=2)

    plan = offered_plan(recipe, pool)

    runs = runs_of(plan)
    assert {r.state for r in runs} == {RunState.QUEUED}  # nothing runs until an agent leases
    offered = [r for r in runs if r.dispatched_at is not None]
    assert len(offered) == 2
    assert {r.state_reason for r in offered} == {"waiting for an agent of pool 'gpu'"}
    waiting = [r for r in runs if r.dispatched_at is None]
    assert {r.state_reason for r in waiting} == {
        "waiting: executor 'pool:gpu' is at its limit of 2 concurrent runs"
    }
    assert RunEvent.objects.filter(verb="offered", run__plan=plan).count() == 2
    assert dispatch.runs_dispatch() == []  # offered runs keep their slots: nothing more


def test_an_agent_leases_an_offered_run_and_becomes_its_runner(recipe: Any, owner: User) -> None:
    pool = make_pool(owner)
    plan = offered_plan(recipe, pool)
    agent, _credential = make_agent(pool)

    lease = leases.lease_acquire(agent=agent)

    assert lease is not None
    run = Run.objects.get(pk=lease.run_id)
    assert run.plan_id == plan.pk
    assert (run.state, run.external_id, run.attempt) == (RunState.RUNNING, lease.external_id, 1)
    assert tokens.run_token_matches(run=run, token=tokens.run_token(run=run))
    assert "{python}" in run.command  # the agent fills in its own Python
    event = run.events.get(verb="running")
    assert (event.door, event.actor_label) == ("agent", agent.label)
    offer = leases.lease_offer(lease=lease)
    assert offer["job"]["env"]["RUN_TOKEN"] == tokens.run_token(run=run)
    assert offer["job"]["env"]["RUN_ID"] == str(run.pk)
    assert "WANDB_API_KEY" not in offer["job"]["env"]  # the site's secrets stay on the site
    assert offer["job"]["files"]["config.json"].startswith("{")


def test_a_granted_lease_carries_its_answer_built_in_the_grant(recipe: Any, owner: User) -> None:
    pool = make_pool(owner)
    offered_plan(recipe, pool)
    agents = [make_agent(pool, f"host-{i}")[0] for i in range(3)]

    granted = leases.leases_grant(pool=pool, agents=agents)

    assert len(granted) == 3
    for lease in granted.values():
        assert lease.answer is not None
        with CaptureQueriesContext(connection) as queries:
            answer = leases.lease_answer(lease=lease)
        assert len(queries) == 0  # the poll that gets it only writes it
        stored = Lease.objects.select_related("run", "agent").get(pk=lease.pk)
        assert stored.answer is None  # not a column: a lease read back builds its answer
        assert json.loads(answer) == leases.lease_offer(lease=stored)
        assert json.loads(leases.lease_answer(lease=stored)) == json.loads(answer)


def test_an_offered_run_carries_its_job_filled_but_never_its_token(
    recipe: Any, owner: User
) -> None:
    pool = make_pool(owner)
    plan = launched_plan(recipe, FOUR_RUNS, executor=pool.executor, max_concurrent_runs=100)
    PlanLaunch.objects.filter(plan=plan).update(
        command_template="{python} -m trainer --token=$RUN_TOKEN --config {config_path}"
    )
    dispatch.runs_dispatch()
    offered = runs_of(plan)
    assert all(run.offer for run in offered)  # filled by the dispatcher, as it offered them
    assert not any(tokens.run_token(run=run) in run.offer for run in offered)

    granted = leases.leases_grant(pool=pool, agents=[make_agent(pool, "host-a")[0]])

    (lease,) = granted.values()
    run = Run.objects.get(pk=lease.run_id)
    answer = json.loads(leases.lease_answer(lease=lease))
    token = tokens.run_token(run=run)
    assert f"--token={token}" in answer["job"]["argv"]
    assert answer["job"]["env"]["RUN_TOKEN"] == token
    assert "--token=$RUN_TOKEN" in run.command  # recorded as the variable, never its value
    assert tokens.run_token_matches(run=run, token=token)
    assert run.offer == ""  # told to its agent: not kept
    assert answer == leases.lease_offer(lease=Lease.objects.get(pk=lease.pk))


def test_a_run_requeued_with_its_next_attempt_is_leased_with_that_attempt_s_job(
    recipe: Any, owner: User
) -> None:
    pool = make_pool(owner)
    offered_plan(recipe, pool, ONE_RUN)
    agent, _credential = make_agent(pool)
    first = leases.lease_acquire(agent=agent)
    assert first is not None
    expire(first)
    leases.lease_expire(lease_id=first.pk)  # the same run, queued and offered again

    lease = leases.lease_acquire(agent=make_agent(pool, "host-b")[0])

    assert lease is not None and lease.run_id == first.run_id
    answer = json.loads(leases.lease_answer(lease=lease))
    run = Run.objects.get(pk=lease.run_id)
    assert (answer["run"]["attempt"], answer["job"]["env"]["RUN_ATTEMPT"]) == (2, "2")
    assert answer["job"]["env"]["RUN_TOKEN"] == tokens.run_token(run=run)
    assert answer == leases.lease_offer(lease=Lease.objects.get(pk=lease.pk))


def test_each_agent_gets_a_different_run_and_none_is_left_for_a_fifth(
    recipe: Any, owner: User
) -> None:
    pool = make_pool(owner)
    plan = offered_plan(recipe, pool)
    agents = [make_agent(pool, f"host-{i}")[0] for i in range(5)]

    got = [leases.lease_acquire(agent=agent) for agent in agents]

    leased = [lease.run_id for lease in got if lease is not None]
    assert sorted(leased) == [r.pk for r in runs_of(plan)]
    assert got[4] is None


@pytest.mark.django_db(transaction=True)
def test_agents_leasing_at_once_never_share_a_run(recipe: Any) -> None:
    owner = User.objects.create_user("olga")
    pool = make_pool(owner)
    plan = offered_plan(recipe, pool)
    agents = [make_agent(pool, f"host-{i}")[0] for i in range(6)]

    workers = [Worker(partial(leases.lease_acquire, agent=a), f"agent-{a.pk}") for a in agents]
    for worker in workers:
        worker.start()
    got = [worker.outcome() for worker in workers]

    leased = sorted(lease.run_id for lease in got if lease is not None)
    assert leased == [r.pk for r in runs_of(plan)]  # four runs, four leases, none twice
    assert Lease.objects.count() == 4


def test_a_lost_lease_requeues_the_same_run_with_the_next_attempt(recipe: Any, owner: User) -> None:
    pool = make_pool(owner)
    offered_plan(recipe, pool, ONE_RUN)  # the baseline alone
    first, _ = make_agent(pool, "host-a")
    second, _ = make_agent(pool, "host-b")
    lease = leases.lease_acquire(agent=first)
    assert lease is not None
    old_token = tokens.run_token(run=Run.objects.get(pk=lease.run_id))

    expire(lease)
    assert leases.leases_expire_stale() == 1

    run = Run.objects.get(pk=lease.run_id)
    assert (run.state, run.attempt, run.token_hash) == (RunState.QUEUED, 2, "")
    assert run.dispatched_at is not None  # offered again at once, in its own slot
    lease.refresh_from_db()
    assert lease.end_reason == LeaseEnd.LOST
    verbs = list(run.events.order_by("pk").values_list("verb", flat=True))
    assert verbs[-2:] == ["preempted", "queued"]
    assert tokens.run_token_superseded(run=run, token=old_token) == 1

    again = leases.lease_acquire(agent=second)
    assert again is not None and (again.run_id, again.attempt) == (run.pk, 2)
    with pytest.raises(LeaseGone):
        leases.lease_renew(agent=first, lease_id=lease.pk)
    with pytest.raises(LeaseGone):
        leases.lease_report(
            agent=first, lease_id=lease.pk, report=LeaseReport(outcome="exited", exit_code=0)
        )
    run.refresh_from_db()
    assert (run.state, run.attempt, run.external_id) == (RunState.RUNNING, 2, again.external_id)


def test_a_renewal_after_the_lease_expired_is_refused_and_requeues(
    recipe: Any, owner: User
) -> None:
    pool = make_pool(owner)
    offered_plan(recipe, pool, ONE_RUN)
    agent, _ = make_agent(pool)
    lease = leases.lease_acquire(agent=agent)
    assert lease is not None
    expire(lease)

    with pytest.raises(LeaseGone, match="expired"):
        leases.lease_renew(agent=agent, lease_id=lease.pk, log_tail="late")

    lease.refresh_from_db()
    assert (lease.end_reason, lease.log_tail) == (LeaseEnd.LOST, "")
    assert Run.objects.get(pk=lease.run_id).state == RunState.QUEUED


def test_renewal_extends_the_lease_and_beats_the_run_s_heart(recipe: Any, owner: User) -> None:
    pool = make_pool(owner)
    offered_plan(recipe, pool, ONE_RUN)
    agent, _ = make_agent(pool)
    lease = leases.lease_acquire(agent=agent)
    assert lease is not None
    before = lease.expires_at

    answer = leases.lease_renew(agent=agent, lease_id=lease.pk, log_tail="step 3\n")

    lease.refresh_from_db()
    assert lease.expires_at > before
    assert lease.log_tail == "step 3\n"
    assert answer["cancel_requested"] is False
    assert answer["run_state"] == RunState.RUNNING
    assert Run.objects.get(pk=lease.run_id).heartbeat_at == lease.renewed_at


def test_another_agent_s_lease_is_forbidden(recipe: Any, owner: User) -> None:
    pool = make_pool(owner)
    offered_plan(recipe, pool)
    mine, _ = make_agent(pool, "host-a")
    other, _ = make_agent(pool, "host-b")
    lease = leases.lease_acquire(agent=mine)
    assert lease is not None

    with pytest.raises(ActionForbidden):
        leases.lease_renew(agent=other, lease_id=lease.pk)
    with pytest.raises(ActionForbidden):
        leases.lease_report(
            agent=other, lease_id=lease.pk, report=LeaseReport(outcome="exited", exit_code=0)
        )
    assert Lease.objects.get(pk=lease.pk).ended_at is None


@pytest.mark.parametrize(
    ("report", "state", "kind", "words"),
    [
        (LeaseReport(outcome="exited", exit_code=0), RunState.FINISHED, "", ""),
        (LeaseReport(outcome="exited", exit_code=2), RunState.FAILED, "config", "exit 2"),
        (LeaseReport(outcome="exited", exit_code=1), RunState.FAILED, "code", "exited with 1"),
        (
            LeaseReport(
                outcome="exited", signal=signal.SIGKILL, oom_kills=1, cgroup="/sys/fs/cgroup/a"
            ),
            RunState.FAILED,
            "oom",
            "OOM killer (oom_kill +1 in /sys/fs/cgroup/a)",
        ),
        (
            LeaseReport(
                outcome="exited", signal=signal.SIGKILL, oom_kills=0, cgroup="/sys/fs/cgroup/a"
            ),
            RunState.KILLED,
            "",
            "killed by SIGKILL from outside (no OOM kill was counted in /sys/fs/cgroup/a)",
        ),
        (
            LeaseReport(outcome="exited", signal=signal.SIGKILL),
            RunState.KILLED,
            "",
            "the agent could read no OOM counter",
        ),
        (LeaseReport(outcome="exited", signal=signal.SIGSEGV), RunState.FAILED, "code", "SIGSEGV"),
        (
            LeaseReport(outcome="exited", signal=signal.SIGTERM),
            RunState.PREEMPTED,
            "preempted",
            "SIGTERM from outside",
        ),
        (LeaseReport(outcome="time_limit"), RunState.FAILED, "timeout", "time limit"),
        (LeaseReport(outcome="canceled"), RunState.KILLED, "", "stopped on request"),
        (
            LeaseReport(outcome="start_failed", message="No such file"),
            RunState.FAILED,
            "infra",
            "No such file",
        ),
        (LeaseReport(outcome="preempted"), RunState.PREEMPTED, "preempted", "agent was stopped"),
    ],
)
def test_a_report_is_classified_from_its_evidence(
    report: LeaseReport, state: str, kind: str, words: str
) -> None:
    to_state, failure_kind, message = leases.lease_report_classify(report)

    assert (to_state, failure_kind) == (state, kind)
    assert words in message
    assert "most likely" not in message


def test_a_report_settles_the_run_and_ends_the_lease(recipe: Any, owner: User) -> None:
    pool = make_pool(owner)
    offered_plan(recipe, pool, ONE_RUN)
    agent, _ = make_agent(pool)
    lease = leases.lease_acquire(agent=agent)
    assert lease is not None

    run = leases.lease_report(
        agent=agent,
        lease_id=lease.pk,
        report=LeaseReport(outcome="exited", signal=signal.SIGKILL, oom_kills=0, log_tail="bye\n"),
    )

    assert run.state == RunState.KILLED
    assert "SIGKILL from outside" in run.state_reason
    lease.refresh_from_db()
    assert (lease.end_reason, lease.log_tail) == (LeaseEnd.EXITED, "bye\n")
    assert lease.outcome["classified_as"] == RunState.KILLED
    assert run.events.filter(verb="killed", door="agent").exists()


def test_a_preempted_agent_s_run_is_requeued_and_offered_again(recipe: Any, owner: User) -> None:
    pool = make_pool(owner)
    offered_plan(recipe, pool, ONE_RUN)
    agent, _ = make_agent(pool)
    lease = leases.lease_acquire(agent=agent)
    assert lease is not None

    run = leases.lease_report(
        agent=agent, lease_id=lease.pk, report=LeaseReport(outcome="preempted")
    )

    assert (run.state, run.attempt) == (RunState.QUEUED, 2)
    assert run.dispatched_at is not None
    assert Lease.objects.get(pk=lease.pk).end_reason == LeaseEnd.PREEMPTED


def test_a_run_lost_on_its_last_attempt_fails_as_preempted(recipe: Any, owner: User) -> None:
    pool = make_pool(owner)
    plan = offered_plan(recipe, pool, ONE_RUN)
    Run.objects.filter(plan=plan).update(max_attempts=1)
    agent, _ = make_agent(pool)
    lease = leases.lease_acquire(agent=agent)
    assert lease is not None
    expire(lease)

    leases.leases_expire_stale()

    run = Run.objects.get(pk=lease.run_id)
    assert (run.state, run.failure_kind, run.attempt) == (RunState.FAILED, "preempted", 1)


def test_a_report_after_the_run_finished_by_its_own_word_keeps_that_ending(
    recipe: Any, owner: User
) -> None:
    pool = make_pool(owner)
    offered_plan(recipe, pool, ONE_RUN)
    agent, _ = make_agent(pool)
    lease = leases.lease_acquire(agent=agent)
    assert lease is not None
    run_writes.run_transition(run_id=lease.run_id, to_state=RunState.FINISHED, door="runner")

    run = leases.lease_report(
        agent=agent, lease_id=lease.pk, report=LeaseReport(outcome="exited", exit_code=1)
    )

    assert run.state == RunState.FINISHED
    assert Run.objects.get(pk=run.pk).events.filter(verb="finished").count() == 1
    assert Lease.objects.get(pk=lease.pk).ended_at is not None


def test_a_cancel_is_told_on_renewal_and_the_canceled_report_kills_the_run(
    recipe: Any, owner: User, maintainer: Any
) -> None:
    pool = make_pool(owner)
    offered_plan(recipe, pool, ONE_RUN)
    agent, _ = make_agent(pool)
    lease = leases.lease_acquire(agent=agent)
    assert lease is not None
    run_writes.run_cancel(run_id=lease.run_id, actor=maintainer)
    assert Run.objects.get(pk=lease.run_id).state == RunState.RUNNING

    assert leases.lease_renew(agent=agent, lease_id=lease.pk)["cancel_requested"] is True
    run = leases.lease_report(
        agent=agent, lease_id=lease.pk, report=LeaseReport(outcome="canceled")
    )

    assert run.state == RunState.KILLED


def test_an_agent_asking_for_work_while_holding_a_lease_gives_that_run_back(
    recipe: Any, owner: User
) -> None:
    pool = make_pool(owner)
    offered_plan(recipe, pool, ONE_RUN)
    agent, _ = make_agent(pool)
    lease = leases.lease_acquire(agent=agent)
    assert lease is not None

    again = leases.lease_wait(agent=agent, wait_seconds=0)

    assert Lease.objects.get(pk=lease.pk).end_reason == LeaseEnd.ABANDONED
    assert again is not None  # the same run, on its next attempt, to the same agent
    assert (again.run_id, again.attempt) == (lease.run_id, 2)


def test_revoking_an_agent_requeues_its_run_and_refuses_it(recipe: Any, owner: User) -> None:
    pool = make_pool(owner)
    offered_plan(recipe, pool, ONE_RUN)
    agent, credential = make_agent(pool)
    lease = leases.lease_acquire(agent=agent)
    assert lease is not None

    services.agent_revoke(actor=owner, agent_id=agent.pk)

    run = Run.objects.get(pk=lease.run_id)
    assert (run.state, run.attempt) == (RunState.QUEUED, 2)
    assert Lease.objects.get(pk=lease.pk).end_reason == LeaseEnd.REVOKED
    with pytest.raises(services.AgentUnauthorized):
        services.agent_authenticate(credential=credential)


def test_the_reconciler_requeues_the_run_of_an_expired_lease(recipe: Any, owner: User) -> None:
    pool = make_pool(owner)
    offered_plan(recipe, pool, ONE_RUN)
    agent, _ = make_agent(pool)
    lease = leases.lease_acquire(agent=agent)
    assert lease is not None
    expire(lease)

    run = reconcile.run_reconcile(run_id=lease.run_id)

    assert run is not None and (run.state, run.attempt) == (RunState.QUEUED, 2)


def test_the_reconciler_leaves_a_renewed_lease_alone(recipe: Any, owner: User) -> None:
    pool = make_pool(owner)
    offered_plan(recipe, pool, ONE_RUN)
    agent, _ = make_agent(pool)
    lease = leases.lease_acquire(agent=agent)
    assert lease is not None

    run = reconcile.run_reconcile(run_id=lease.run_id)

    assert run is not None and run.state == RunState.RUNNING
    assert Lease.objects.get(pk=lease.pk).ended_at is None


def test_a_pool_restricted_to_other_recipes_leases_none_of_these(recipe: Any, owner: User) -> None:
    pool = make_pool(owner)
    offered_plan(recipe, pool, ONE_RUN)
    pool.recipes = ["marin-moe"]
    pool.save()
    agent, _ = make_agent(pool)

    assert leases.lease_acquire(agent=agent) is None


def test_a_finished_run_frees_its_slot_for_the_next_offer(recipe: Any, owner: User) -> None:
    pool = make_pool(owner, max_concurrent_runs=1)
    plan = offered_plan(recipe, pool)
    agent, _ = make_agent(pool)
    lease = leases.lease_acquire(agent=agent)
    assert lease is not None
    assert sum(r.dispatched_at is not None for r in runs_of(plan)) == 1

    leases.lease_report(
        agent=agent, lease_id=lease.pk, report=LeaseReport(outcome="exited", exit_code=0)
    )
    dispatch.runs_dispatch()

    offered = [r for r in runs_of(plan) if r.state == RunState.QUEUED and r.dispatched_at]
    assert len(offered) == 1
