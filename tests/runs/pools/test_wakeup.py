"""A held poll is answered when work is offered, not at its next re-check; and a wake-up
that never comes costs only the re-check."""

from __future__ import annotations

import json
import time
from functools import partial
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs.pools import leases, wakeup
from runs.pools.models import Lease
from runs.services import dispatch
from tests.concurrency import Worker
from tests.runs.pools.pool_helpers import ONE_RUN, make_agent, make_pool
from tests.runs.runs_helpers import launched_plan

pytestmark = pytest.mark.django_db(transaction=True)


def held_poll(agent: Any, wait: float) -> Worker:
    def poll() -> tuple[Any, float]:
        started = time.monotonic()
        lease = leases.lease_wait(agent=agent, wait_seconds=wait)
        return lease, time.monotonic() - started

    worker = Worker(poll, "held-poll")
    worker.start()
    return worker


def test_a_held_poll_is_answered_as_soon_as_a_run_is_offered(recipe: Any, settings: Any) -> None:
    settings.RUNS_AGENT_RECHECK_SECONDS = 20  # only the wake-up can answer within the test
    pool = make_pool(User.objects.create_user("olga"))
    agent, _ = make_agent(pool)
    plan = launched_plan(recipe, ONE_RUN, executor=pool.executor)
    poll = held_poll(agent, wait=10)
    time.sleep(1.0)  # the poll is waiting now

    offered_at = time.monotonic()
    dispatch.runs_dispatch()
    lease, _waited = poll.outcome()

    assert lease is not None and lease.run.plan_id == plan.pk
    assert time.monotonic() - offered_at < 1.0


def test_a_poll_woken_with_its_lease_answers_without_the_database(
    recipe: Any, settings: Any
) -> None:
    """Two held polls, two runs offered: one poll wakes and leads (it uses the database to
    lease for both); the other is handed its lease with its answer built, and writes it with
    no database slot and no connection (a hundred woken polls would queue for them)."""
    settings.RUNS_AGENT_RECHECK_SECONDS = 20
    pool = make_pool(User.objects.create_user("olga"))
    agents = [make_agent(pool, f"host-{i}")[0] for i in range(2)]
    launched_plan(recipe, "axes:\n  learning_rate: [0.001]\n", executor=pool.executor)

    def poll(agent: Any) -> tuple[Any, bytes, bool, int]:
        with wakeup.database_slot():  # as the agent's door holds it
            lease = leases.lease_wait(agent=agent, wait_seconds=10)
            assert lease is not None
            untouched = connection.connection is None
            with CaptureQueriesContext(connection) as queries:  # which connects
                answer = leases.lease_answer(lease=lease)
            return lease, answer, untouched, len(queries)

    workers = [Worker(partial(poll, agent), f"held-poll-{agent.pk}") for agent in agents]
    for worker in workers:
        worker.start()
    time.sleep(1.0)  # the polls are waiting now
    dispatch.runs_dispatch()
    outcomes = [worker.outcome() for worker in workers]

    assert sorted(no_connection for _l, _a, no_connection, _q in outcomes) == [False, True]
    assert [queries for _l, _a, _c, queries in outcomes] == [0, 0]
    for lease, answer, _c, _q in outcomes:
        stored = Lease.objects.select_related("run", "agent").get(pk=lease.pk)
        assert json.loads(answer) == leases.lease_offer(lease=stored)


def test_a_lost_wake_up_costs_only_the_re_check(
    recipe: Any, settings: Any, monkeypatch: Any
) -> None:
    settings.RUNS_AGENT_RECHECK_SECONDS = 2
    monkeypatch.setattr(wakeup, "work_offered", lambda pool: None)  # the nudge is lost
    pool = make_pool(User.objects.create_user("olga"))
    agent, _ = make_agent(pool)
    launched_plan(recipe, ONE_RUN, executor=pool.executor)
    poll = held_poll(agent, wait=10)
    time.sleep(0.5)

    dispatch.runs_dispatch()
    lease, waited = poll.outcome()

    assert lease is not None  # the database is the truth: the re-check found it
    assert 1.5 < waited < 5


def test_a_poll_with_nothing_to_do_returns_empty_after_its_wait(settings: Any) -> None:
    settings.RUNS_AGENT_RECHECK_SECONDS = 0.3
    pool = make_pool(User.objects.create_user("olga"))
    agent, _ = make_agent(pool)

    lease, waited = held_poll(agent, wait=1).outcome()

    assert lease is None
    assert 0.9 < waited < 3


@pytest.mark.skipif(connection.vendor != "postgresql", reason="pg_stat_activity is PostgreSQL's")
def test_held_polls_hold_no_database_connections(live_server: Any, settings: Any) -> None:
    """Twelve agents in held polls, through the live server: while they wait, the server
    holds its listener's connection and nothing else."""
    import json
    import threading
    import urllib.request

    settings.RUNS_AGENT_RECHECK_SECONDS = 30
    pool = make_pool(User.objects.create_user("olga"))
    credentials = [make_agent(pool, f"host-{i}")[1] for i in range(12)]
    answers: list[int] = []

    def poll(credential: str) -> None:
        request = urllib.request.Request(  # noqa: S310
            f"{live_server.url}/api/v1/agent/poll/",
            data=json.dumps({"wait": 3}).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {credential}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
            answers.append(response.status)

    threads = [threading.Thread(target=poll, args=(c,)) for c in credentials]
    for thread in threads:
        thread.start()
    time.sleep(1.5)  # every poll is waiting now
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        )
        others = cursor.fetchone()[0]
    for thread in threads:
        thread.join()

    assert answers == [204] * 12
    assert others <= 2, others  # the listener (and at most one request between two looks)
