"""How one server process hands the runs offered to a pool to the polls waiting on it.

Without this, a wake-up (one NOTIFY for a 256-run plan) woke every held poll of the pool at
once: 200 threads each authenticated, expired stale leases and raced ``SELECT ... FOR UPDATE
SKIP LOCKED`` for one run, and the last of them waited for the 199 before it. Here the held
polls of a process queue at the pool's desk, in the order they came, and a wake-up wakes
**one** of them, the leader: it leases runs for the waiting polls in batches (one
transaction each, ``leases.leases_grant``) and hands each lease to its poll, which answers
its agent. Polls that got nothing keep waiting; nobody else touched the database.

Several processes each have their own desk and leader; ``SKIP LOCKED`` keeps their batches
apart, and the partial unique indexes keep a run from being leased twice whatever happens
here. The database stays the truth: a poll that hears nothing leads a look of its own at
its re-check (at most one look per pool and process per re-check interval), so a lost
wake-up costs a few seconds, never a run.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings

logger = logging.getLogger(__name__)


class Waiter:
    """One held poll: its agent, the lease handed to it, and the event that wakes it."""

    __slots__ = ("agent", "claimed", "event", "lead", "lease", "unheard_seen")

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.unheard_seen = 0
        self.event = threading.Event()
        self.lease: Any = None
        self.claimed = False  # a leader is leasing for it right now
        self.lead = False  # a wake-up asks it to lead the next hand-out


class _Desk:
    def __init__(self) -> None:
        self.waiters: list[Waiter] = []
        self.unheard = 0  # wake-ups that found no poll to wake
        self.leading = False
        self.again = False  # woken while a leader was at work: it looks once more
        self.last_look = 0.0


_condition = threading.Condition()
_desks: dict[str, _Desk] = {}


def _desk(pool: str) -> _Desk:
    desk = _desks.get(pool)
    if desk is None:
        desk = _desks[pool] = _Desk()
    return desk


def _deliver(desk: _Desk, batch: list[Waiter], served: dict[int, Any], got: dict[int, Any]) -> None:
    """Hand the leases of ``got`` to their polls of ``batch`` (once each) and wake them."""
    with _condition:
        for w in batch:
            lease = got.get(w.agent.pk)
            if lease is not None and w.claimed:
                served[w.agent.pk] = lease
                w.claimed = False
                w.lease = lease
                if w in desk.waiters:
                    desk.waiters.remove(w)
                w.event.set()
        _condition.notify_all()


Grant = Callable[[list[Any], Callable[[dict[int, Any]], None]], dict[int, Any]]


def join(pool: str, agent: Any) -> Waiter:
    waiter = Waiter(agent)
    with _condition:
        desk = _desk(pool)
        desk.waiters.append(waiter)
        waiter.unheard_seen = desk.unheard
    return waiter


def leave(pool: str, waiter: Waiter) -> Any:
    """Leave the desk; if a leader is leasing for this poll now, wait for it. Returns the
    lease handed to the poll, if one was: it must reach its agent, never be dropped."""
    with _condition:
        while waiter.claimed:
            _condition.wait(1.0)
        desk = _desk(pool)
        if waiter in desk.waiters:
            desk.waiters.remove(waiter)
        return waiter.lease


def waiting(pool: str) -> int:
    """How many polls of ``pool`` wait at this process's desk for a lease now (held, not
    looking for themselves)."""
    with _condition:
        desk = _desks.get(pool)
        if desk is None:
            return 0
        return sum(1 for w in desk.waiters if not w.claimed and w.lease is None)


def poke(pool: str) -> None:
    """Work was offered to ``pool``: wake one waiting poll of this process to lead (or tell
    the leader at work to look once more). The others sleep on."""
    with _condition:
        desk = _desks.get(pool)
        if desk is None:
            return
        if desk.leading:
            desk.again = True
            return
        for waiter in desk.waiters:
            if not waiter.claimed and waiter.lease is None:
                waiter.lead = True
                waiter.event.set()
                return
        desk.unheard += 1  # every poll was looking for itself: they look again after


def poke_all() -> None:
    for pool in list(_desks):
        poke(pool)


def look_alone(pool: str, waiter: Waiter, grant: Grant) -> bool:
    """A new poll's first look, for itself alone (a run waiting now is leased at once,
    whether or not a leader is at work). True if a wake-up came meanwhile that found no
    poll to wake (they were all looking): this one should lead a look for the desk now."""
    with _condition:
        if waiter.claimed or waiter.lease is not None:
            return False
        waiter.claimed = True
        desk = _desk(pool)
    served: dict[int, Any] = {}
    deliver = functools.partial(_deliver, desk, [waiter], served)
    try:
        deliver(grant([waiter.agent], deliver))
    finally:
        with _condition:
            waiter.claimed = False
            _condition.notify_all()
            missed = desk.unheard != waiter.unheard_seen
    return missed and waiter.lease is None


def take_lead(pool: str, waiter: Waiter, *, recheck: float, asked: bool = False) -> bool:
    """Whether ``waiter`` (new, woken, or at its re-check) leads a hand-out now. A new or
    woken poll leads unless another leads already (which then looks once more, for it); a
    re-check leads only if nobody looked at this pool in this process for ``recheck``
    seconds."""
    with _condition:
        waiter.event.clear()
        asked, waiter.lead = asked or waiter.lead, False
        desk = _desk(pool)
        if waiter.lease is not None:
            return False
        if desk.leading:
            desk.again = desk.again or asked
            return False
        if not asked and time.monotonic() - desk.last_look < recheck:
            return False
        desk.leading = True
        return True


def lead(pool: str, waiter: Waiter, grant: Grant) -> None:
    """Lease runs for the waiting polls of ``pool`` (the leader's own first), a batch of at
    most ``RUNS_AGENT_LEASE_BATCH`` per transaction, handing each batch's leases out the
    moment it commits; until a batch comes back short (no more runs) and no wake-up came
    meanwhile. ``grant(agents, deliver)`` leases and answers {agent id: lease}, calling
    ``deliver`` with them as soon as they are committed (before anything else it does after
    the commit, such as the transitions' signals)."""
    size = max(1, int(settings.RUNS_AGENT_LEASE_BATCH))
    try:
        while True:
            with _condition:
                desk = _desk(pool)
                desk.again = False
                desk.last_look = time.monotonic()
                free = [w for w in desk.waiters if not w.claimed and w.lease is None]
                if waiter in free:
                    free.remove(waiter)
                    free.insert(0, waiter)
                batch = free[:size]
                for w in batch:
                    w.claimed = True
            if not batch:
                return
            served: dict[int, Any] = {}
            deliver = functools.partial(_deliver, desk, batch, served)
            failed = False
            try:
                deliver(grant([w.agent for w in batch], deliver))
            except Exception:  # the polls look again at their re-check; the database is the truth
                logger.exception("leasing runs for %d polls of pool %s failed", len(batch), pool)
                failed = True
            with _condition:
                for w in batch:
                    w.claimed = False
                _condition.notify_all()
                more = len(served) == len(batch) and len(free) > len(batch)
                if failed or not (more or desk.again):
                    return
    finally:
        with _condition:
            _desk(pool).leading = False
            _condition.notify_all()
