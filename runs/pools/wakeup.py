"""How a waiting long-poll learns that a run became available to its pool.

The database is the truth: a poll looks for work in the database when it starts, a waiting
poll's process looks whenever it is woken, and at least every ``RUNS_AGENT_RECHECK_SECONDS``
in any case, so a lost wake-up costs a few seconds, never a run.

On PostgreSQL the wake-up is ``NOTIFY runs_pool_work, '<pool>'`` issued in the transaction
that offers a run (PostgreSQL delivers it at commit, never for a rolled-back offer). Each
server process keeps one listening connection in a daemon thread, started on first use (so
after gunicorn forks), and wakes the requests of that process that wait on the pool. A
waiting request holds no database connection of its own: 200 held polls cost 200 threads
and one connection per process. A wake-up wakes one held poll per process, which leases
runs for the others (``runs.pools.handout``), not all of them at once. On SQLite (one
machine, one process in practice) the offering process wakes its own waiters after commit;
others find the work on their re-check.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.db import connection, connections, transaction

from runs.pools import handout

logger = logging.getLogger(__name__)

CHANNEL = "runs_pool_work"


class _Board:
    """Per pool, a counter bumped on every wake-up, and a condition to wait for the next one."""

    def __init__(self) -> None:
        self.condition = threading.Condition()
        self.generations: dict[str, int] = {}

    def generation(self, pool: str) -> int:
        with self.condition:
            return self.generations.setdefault(pool, 0)

    def bump(self, pool: str) -> None:
        with self.condition:
            self.generations[pool] = self.generations.get(pool, 0) + 1
            self.condition.notify_all()
        handout.poke(pool)  # one held poll of this process leads the hand-out

    def wait(self, pool: str, since: int, timeout: float) -> bool:
        """Wait until ``pool``'s counter passes ``since`` or ``timeout`` runs out."""
        deadline = time.monotonic() + timeout
        with self.condition:
            while self.generations.get(pool, 0) == since:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self.condition.wait(remaining)
            return True


board = _Board()
_listener_lock = threading.Lock()
_listener: threading.Thread | None = None
_stop = threading.Event()


def _listen_forever(params: dict[str, Any]) -> None:
    import psycopg

    while not _stop.is_set():
        try:
            with psycopg.connect(**params, autocommit=True) as conn:
                conn.execute(f"LISTEN {CHANNEL}")
                logger.info("listening for pool work on %s", CHANNEL)
                # The database may have offered work while nobody listened: wake everyone.
                _bump_all()
                while not _stop.is_set():
                    for notify in conn.notifies(timeout=1.0):
                        board.bump(notify.payload)
        except Exception:
            logger.warning(
                "the pool work listener lost its connection; reconnecting", exc_info=True
            )
            _stop.wait(1.0)


def _bump_all() -> None:
    with board.condition:
        for pool in list(board.generations):
            board.generations[pool] += 1
        board.condition.notify_all()
    handout.poke_all()


def ensure_listening() -> None:
    """Start this process's listener once (PostgreSQL only)."""
    global _listener  # noqa: PLW0603  (one listener thread per process)
    if connection.vendor != "postgresql" or (_listener is not None and _listener.is_alive()):
        return
    with _listener_lock:
        if _listener is not None and _listener.is_alive():
            return
        params = connections["default"].get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        _listener = threading.Thread(
            target=_listen_forever, args=(params,), name="pool-work-listener", daemon=True
        )
        _listener.start()


def stop_listening() -> None:
    """Close this process's listener (tests do, before their database is dropped)."""
    global _listener  # noqa: PLW0603
    with _listener_lock:
        if _listener is not None:
            _stop.set()
            _listener.join(timeout=10)
            _listener = None
            _stop.clear()


_slots_lock = threading.Lock()
_slots: threading.BoundedSemaphore | None = None
_holding = threading.local()


def _semaphore() -> threading.BoundedSemaphore:
    global _slots  # noqa: PLW0603  (one per process, sized from settings on first use)
    with _slots_lock:
        if _slots is None:
            _slots = threading.BoundedSemaphore(max(1, int(settings.RUNS_AGENT_DB_SLOTS)))
        return _slots


@contextlib.contextmanager
def database_slot() -> Iterator[None]:
    """Hold one of this process's RUNS_AGENT_DB_SLOTS for an agent's request, and close its
    database connection after: however many agents wait in held polls (one thread each),
    at most that many of them use the database at once, so 200 agents never open 200
    connections. ``lease_wait`` gives the slot up while it waits (``slot_release``) and
    takes one again after (``slot_take``)."""
    slots = _semaphore()
    slots.acquire()
    _holding.slot = True
    try:
        yield
    finally:
        if _holding.slot:
            slots.release()
        _holding.slot = None
        if not connection.in_atomic_block:
            connection.close()


def slot_release() -> None:
    """Inside ``database_slot``: let another request have this one's slot, closing its
    connection (outside one: close the connection, if no transaction is open)."""
    if not connection.in_atomic_block:
        connection.close()
    if getattr(_holding, "slot", None):
        _holding.slot = False
        _semaphore().release()


def slot_take() -> None:
    """Inside ``database_slot``, after ``slot_release``: take a slot again before using the
    database (outside one: nothing to take)."""
    if getattr(_holding, "slot", None) is False:
        _semaphore().acquire()
        _holding.slot = True


@contextlib.contextmanager
def slot_given_up() -> Iterator[None]:
    """Inside ``database_slot``: give the slot up for the block, take one again after."""
    slot_release()
    try:
        yield
    finally:
        slot_take()


def work_offered(pool: str) -> None:
    """Say, in the current transaction, that ``pool`` has a run to lease."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, pool])
    else:
        transaction.on_commit(lambda: board.bump(pool))


def generation(pool: str) -> int:
    ensure_listening()
    return board.generation(pool)


def wait_for_work(pool: str, *, since: int, timeout: float) -> bool:
    """Wait (holding no database connection) until work is offered to ``pool``; True if woken."""
    return board.wait(pool, since, timeout)
