"""The hand-out: a wake-up wakes one held poll per process, which leases runs for the
waiting polls in batches of a few statements each, instead of every poll racing for a run."""

from __future__ import annotations

import threading
import time
from functools import partial
from types import SimpleNamespace
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from marin_site.errors import TransitionNotAllowed
from runs.models import Run, RunEvent, RunState
from runs.pools import handout, leases
from runs.pools.models import Lease
from runs.services import dispatch
from runs.services import runs as run_writes
from tests.concurrency import Worker
from tests.runs.pools.pool_helpers import ONE_RUN, make_agent, make_pool, offered_plan, runs_of
from tests.runs.runs_helpers import launched_plan

EIGHT_RUNS = "axes:\n  learning_rate: [0.001, 0.002, 0.004, 0.005, 0.006, 0.007, 0.008]\n"


@pytest.fixture
def owner() -> User:
    return User.objects.create_user("olga")


# --- the batch: a few statements however many agents -----------------------------------


@pytest.mark.sqlite  # the PostgreSQL UPDATE ... FROM unnest, and its fallback
@pytest.mark.django_db
def test_a_batch_of_six_leases_takes_the_statements_of_two(recipe: Any, owner: User) -> None:
    pool = make_pool(owner, max_concurrent_runs=20)
    agents = [make_agent(pool, f"host-{i}")[0] for i in range(9)]
    offered_plan(recipe, pool, EIGHT_RUNS)

    with CaptureQueriesContext(connection) as two:
        single = leases.leases_grant(pool=pool, agents=agents[:2])
    with CaptureQueriesContext(connection) as six:
        batch = leases.leases_grant(pool=pool, agents=agents[2:])

    assert len(single) == 2 and len(batch) == 6  # eight runs: the last agent gets none
    assert len(six.captured_queries) == len(two.captured_queries)
    granted = [*single.values(), *batch.values()]
    assert len({lease.run_id for lease in granted}) == 8
    for lease in granted:
        run = Run.objects.get(pk=lease.run_id)
        assert (run.state, run.external_id, lease.attempt) == (
            RunState.RUNNING,
            f"lease-{lease.pk}",
            run.attempt,
        )
        event = RunEvent.objects.get(run=run, verb=RunState.RUNNING)
        assert (event.from_state, event.actor_label) == (RunState.QUEUED, lease.agent.label)
        assert f"(lease {lease.pk})" in event.message
    assert leases.leases_grant(pool=pool, agents=agents[8:]) == {}  # nothing left


@pytest.mark.sqlite  # the PostgreSQL UPDATE ... FROM unnest, and its fallback
@pytest.mark.django_db
def test_a_batch_leaves_out_an_agent_that_holds_a_lease_and_leases_the_others(
    recipe: Any, owner: User
) -> None:
    pool = make_pool(owner, max_concurrent_runs=20)
    agents = [make_agent(pool, f"host-{i}")[0] for i in range(3)]
    offered_plan(recipe, pool, EIGHT_RUNS)
    held = leases.lease_acquire(agent=agents[1])  # a second poll of this agent, elsewhere
    assert held is not None

    got = leases.leases_grant(pool=pool, agents=agents)

    assert set(got) == {agents[0].pk, agents[2].pk}
    assert Lease.objects.filter(agent=agents[1], ended_at__isnull=True).count() == 1
    leased = Run.objects.filter(state=RunState.RUNNING).count()
    assert leased == 3 == Lease.objects.count()  # the run it did not get is still offered


@pytest.mark.sqlite  # the PostgreSQL UPDATE ... FROM unnest, and its fallback
@pytest.mark.django_db
def test_runs_transition_keeps_the_rules_of_run_transition(recipe: Any) -> None:
    plan = launched_plan(recipe, ONE_RUN + "axes:\n  learning_rate: [0.001, 0.002]\n")
    first, second, third = runs_of(plan)
    run_writes.run_transition(run_id=third.pk, to_state=RunState.FAILED, door="worker")

    with pytest.raises(TransitionNotAllowed):
        run_writes.runs_transition(
            moves=[run_writes.Move(first.pk), run_writes.Move(third.pk)],
            to_state=RunState.RUNNING,
            door="worker",
        )
    assert Run.objects.get(pk=first.pk).state == RunState.QUEUED  # all or nothing

    moved = run_writes.runs_transition(
        moves=[run_writes.Move(first.pk, message="one"), run_writes.Move(second.pk, message="two")],
        to_state=RunState.FAILED,
        door="worker",
        failure_kind="infra",
    )
    assert [(r.pk, r.state) for r in moved] == [
        (first.pk, RunState.FAILED),
        (second.pk, RunState.FAILED),
    ]
    for run, message in ((first, "one"), (second, "two")):
        run.refresh_from_db()
        assert (run.state_reason, run.failure_kind, run.finished_at is not None) == (
            message,
            "infra",
            True,
        )
        event = RunEvent.objects.get(run=run, verb=RunState.FAILED)
        assert (event.from_state, event.message) == (RunState.QUEUED, f"[infra] {message}")
    again = run_writes.runs_transition(
        moves=[run_writes.Move(first.pk)], to_state=RunState.FAILED, door="worker"
    )
    assert again[0].state == RunState.FAILED
    assert RunEvent.objects.filter(run=first, verb=RunState.FAILED).count() == 1  # no second


# --- the desk, alone: who is woken and who leads ------------------------------------------


def fake_agents(n: int) -> list[Any]:
    return [SimpleNamespace(pk=i) for i in range(1, n + 1)]


@pytest.fixture
def desk(settings: Any) -> Any:
    name = f"test-{time.monotonic_ns()}"
    yield name
    handout._desks.pop(name, None)


def test_a_wake_up_wakes_one_waiting_poll(desk: str) -> None:
    waiters = [handout.join(desk, agent) for agent in fake_agents(5)]

    handout.poke(desk)

    assert [w.event.is_set() for w in waiters] == [True, False, False, False, False]
    assert handout.take_lead(desk, waiters[0], recheck=60)
    assert not handout.take_lead(desk, waiters[1], recheck=60, asked=True)  # one leader


def test_the_leader_hands_out_in_batches_its_own_first(desk: str, settings: Any) -> None:
    settings.RUNS_AGENT_LEASE_BATCH = 2
    waiters = [handout.join(desk, agent) for agent in fake_agents(5)]
    leader = waiters[3]
    calls: list[list[int]] = []

    def grant(agents: list[Any], deliver: Any) -> dict[int, str]:
        calls.append([a.pk for a in agents])
        return {a.pk: f"lease-{a.pk}" for a in agents}

    assert handout.take_lead(desk, leader, recheck=60, asked=True)
    handout.lead(desk, leader, grant)

    assert calls == [[4, 1], [2, 3], [5]]
    assert [w.lease for w in waiters] == [f"lease-{i}" for i in range(1, 6)]
    assert all(w.event.is_set() for w in waiters)
    assert handout._desks[desk].waiters == []


def test_a_short_batch_stops_the_hand_out_and_the_rest_wait_on(desk: str, settings: Any) -> None:
    settings.RUNS_AGENT_LEASE_BATCH = 2
    waiters = [handout.join(desk, agent) for agent in fake_agents(5)]
    runs = ["r1", "r2", "r3"]

    def grant(agents: list[Any], deliver: Any) -> dict[int, str]:
        return {a.pk: runs.pop(0) for a in agents if runs}

    assert handout.take_lead(desk, waiters[0], recheck=60, asked=True)
    handout.lead(desk, waiters[0], grant)

    assert [w.lease for w in waiters] == ["r1", "r2", "r3", None, None]
    assert [w.event.is_set() for w in waiters[3:]] == [False, False]
    assert not handout._desks[desk].leading


def test_a_failed_grant_leaves_every_poll_waiting(desk: str) -> None:
    waiters = [handout.join(desk, agent) for agent in fake_agents(3)]

    def grant(agents: list[Any], deliver: Any) -> dict[int, str]:
        raise RuntimeError("the database went away")

    assert handout.take_lead(desk, waiters[0], recheck=60, asked=True)
    handout.lead(desk, waiters[0], grant)

    assert [(w.lease, w.claimed) for w in waiters] == [(None, False)] * 3
    assert not handout._desks[desk].leading


def test_a_poll_leaving_while_its_lease_is_made_waits_and_gets_it(desk: str) -> None:
    waiters = [handout.join(desk, agent) for agent in fake_agents(2)]
    granting = threading.Event()
    finish = threading.Event()

    def grant(agents: list[Any], deliver: Any) -> dict[int, str]:
        granting.set()
        finish.wait(5)
        return {a.pk: f"lease-{a.pk}" for a in agents}

    assert handout.take_lead(desk, waiters[0], recheck=60, asked=True)
    leader = threading.Thread(target=handout.lead, args=(desk, waiters[0], grant))
    leader.start()
    granting.wait(5)
    threading.Timer(0.3, finish.set).start()

    started = time.monotonic()
    assert handout.leave(desk, waiters[1]) == "lease-2"  # its deadline came mid-grant
    assert time.monotonic() - started >= 0.2
    leader.join(5)


def test_a_re_check_leads_only_when_nobody_looked_lately(desk: str) -> None:
    first, second = (handout.join(desk, agent) for agent in fake_agents(2))
    assert handout.take_lead(desk, first, recheck=60, asked=True)
    handout.lead(desk, first, lambda agents, deliver: {})

    assert not handout.take_lead(desk, second, recheck=60)  # a look a moment ago
    assert handout.take_lead(desk, second, recheck=0)


# --- held polls, for real: one leader per wake-up -----------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_wake_up_leases_for_every_held_poll_in_one_hand_out(
    recipe: Any, settings: Any, monkeypatch: Any, owner: User
) -> None:
    settings.RUNS_AGENT_RECHECK_SECONDS = 20  # only the wake-up can answer within the test
    pool = make_pool(owner, max_concurrent_runs=4)
    agents = [make_agent(pool, f"host-{i}")[0] for i in range(6)]
    launched_plan(
        recipe, "axes:\n  learning_rate: [0.001, 0.002, 0.004, 0.005]\n", executor=pool.executor
    )
    grants: list[int] = []
    real = leases.leases_grant

    def counted(**kwargs: Any) -> Any:
        grants.append(len(kwargs["agents"]))
        return real(**kwargs)

    monkeypatch.setattr(leases, "leases_grant", counted)
    polls = [
        Worker(partial(leases.lease_wait, agent=a, wait_seconds=4), f"poll-{a.pk}") for a in agents
    ]
    for poll in polls:
        poll.start()
    time.sleep(1.0)  # every poll waits now
    grants.clear()

    dispatch.runs_dispatch()  # offers four runs (the pool's limit)
    got = [poll.outcome() for poll in polls]

    leased = [lease for lease in got if lease is not None]
    assert len(leased) == 4 and len({lease.run_id for lease in leased}) == 4
    assert grants == [6]  # one leader, one transaction, for all six waiting polls
    assert Lease.objects.count() == 4
