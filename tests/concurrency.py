"""Real concurrent transactions, for the tests of the paths that lock rows.

Each piece of work runs in a thread of its own, so it has its own database connection
(Django gives each thread one), which the thread closes when it is done. The tests using
these need ``pytest.mark.django_db(transaction=True)``: the threads see only what commits.

A test holds a first transaction open (``held``) at the point where a second must meet
its lock, starts the second, waits until that one is blocked (``wait_until_blocked``),
then lets the first commit. On PostgreSQL, the production database, the second waits on
the row lock and ``wait_until_blocked`` sees it waiting in ``pg_stat_activity``; that is
what these tests are about. On SQLite (the embedded default) every transaction begins
IMMEDIATE and waits for the whole database instead, which SQLite does not show, so
``wait_until_blocked`` only gives the second thread time to get there: the tests pass
there too, and never hang, but only PostgreSQL shows that the row locks themselves hold.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import connection, connections, transaction

TIMEOUT = 30.0


class Worker(threading.Thread):
    """Run ``work`` in a thread with its own connection; ``outcome()`` is its result or
    re-raises its error."""

    def __init__(self, work: Callable[[], Any], name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.work = work
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.work()
        except BaseException as exc:  # handed to the test by outcome()
            self.error = exc
        finally:
            connections.close_all()

    def outcome(self, timeout: float = TIMEOUT) -> Any:
        self.join(timeout)
        if self.is_alive():
            raise AssertionError(f"{self.name} did not finish in {timeout} s")
        if self.error is not None:
            raise self.error
        return self.result


class Held:
    """``work`` done inside a transaction that stays open until ``release()``."""

    def __init__(self, work: Callable[[], Any]) -> None:
        self.work = work
        self.inside = threading.Event()
        self.released = threading.Event()

    def __call__(self) -> Any:
        with transaction.atomic():
            result = self.work()
            self.inside.set()
            if not self.released.wait(TIMEOUT):
                raise AssertionError("the held transaction was never released")
        return result

    def release(self) -> None:
        self.released.set()


def held(work: Callable[[], Any], name: str = "first") -> tuple[Worker, Held]:
    """Start ``work`` in a thread, in a transaction held open once the work is done."""
    hold = Held(work)
    worker = Worker(hold, name)
    worker.start()
    if not hold.inside.wait(TIMEOUT):
        worker.outcome(0)  # raises the error that stopped it, if any
        raise AssertionError("the first transaction never got inside")
    return worker, hold


def started(work: Callable[[], Any], name: str = "second") -> Worker:
    worker = Worker(work, name)
    worker.start()
    return worker


def wait_until_blocked(waiters: int = 1, timeout: float = 10.0) -> None:
    """Return once ``waiters`` other connections wait for a lock (PostgreSQL); on SQLite,
    after a pause long enough for them to be waiting for the database."""
    if connection.vendor != "postgresql":
        time.sleep(0.5)
        return
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            row = cursor.fetchone()
            if row is not None and row[0] >= waiters:
                return
            time.sleep(0.02)
    raise AssertionError(f"no {waiters} connection(s) waited for a lock within {timeout} s")


def race(first: Callable[[], Any], second: Callable[[], Any]) -> tuple[Any, Any]:
    """Run ``first`` and hold its transaction open; start ``second``, wait until it is
    blocked on what ``first`` holds, then let ``first`` commit. Returns both results."""
    one, hold = held(first, "first")
    two = started(second, "second")
    try:
        wait_until_blocked()
    finally:
        hold.release()
        one.join(TIMEOUT)
        two.join(TIMEOUT)
    return one.outcome(0), two.outcome(0)
