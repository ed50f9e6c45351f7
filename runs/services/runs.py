"""Writes for runs: the one state transition and the run's history, and cancel, rerun and
retry by a person (or a bot on their behalf).

The database is the truth and a queue message only a nudge: every function here can run
twice, or after a lost message, and leaves the same rows behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth.models import AnonymousUser, User
from django.db import connection, transaction
from django.db.models import Max
from django.utils import timezone

from marin_site.doors import Door
from marin_site.errors import Conflict, DomainError, TransitionNotAllowed
from marin_site.events import Verb
from marin_site.invalidation import rows_changed
from marin_site.nudges import nudge
from marin_site.roles import permission_require
from runs.models import TERMINAL_RUN_STATES, PlanLaunch, Run, RunEvent, RunState
from runs.permissions import CANCEL_RUN, RERUN_RUN, RETRY_RUN
from runs.signals import run_state_changed

Actor = User | AnonymousUser | None


# target state -> the states it may be reached from
RUN_TRANSITIONS: dict[str, frozenset[str]] = {
    RunState.RUNNING: frozenset({RunState.QUEUED}),
    RunState.FINISHED: frozenset({RunState.RUNNING}),
    RunState.FAILED: frozenset({RunState.QUEUED, RunState.RUNNING, RunState.PREEMPTED}),
    RunState.KILLED: frozenset({RunState.QUEUED, RunState.RUNNING, RunState.PREEMPTED}),
    RunState.CRASHED: frozenset({RunState.QUEUED, RunState.RUNNING}),
    RunState.PREEMPTED: frozenset({RunState.RUNNING}),
    RunState.QUEUED: frozenset({RunState.PREEMPTED}),  # the next attempt
}


def run_event_record(
    *,
    run: Run,
    verb: Verb,
    door: str,
    actor: Actor = None,
    actor_label: str = "",
    from_state: str = "",
    to_state: str = "",
    message: str = "",
) -> RunEvent:
    """A row of the run's timeline, saved (``RunEvent.build`` for rows to bulk-create)."""
    event = RunEvent.build(
        run=run,
        verb=verb,
        door=door,
        actor=actor,
        actor_label=actor_label,
        from_state=from_state,
        to_state=to_state,
        message=message,
    )
    event.save(force_insert=True)
    return event


@dataclass(frozen=True)
class Move:
    """One run's part in a transition: its message, who moved it, and its own changes."""

    run_id: int
    message: str = ""
    actor_label: str = ""
    changes: dict[str, Any] | None = None


def _transition_check(run: Run, to_state: str) -> bool:
    """Whether ``run`` moves to ``to_state`` (False: it is there already); refuses (naming
    the allowed source states) a move the state machine does not have."""
    allowed = RUN_TRANSITIONS[to_state]
    if run.state == to_state:
        return False
    if run.state not in allowed:
        raise TransitionNotAllowed(
            action=f"move a run to {to_state}", current=run.state, allowed=allowed
        )
    return True


def _transition_apply(
    run: Run,
    *,
    to_state: str,
    failure_kind: str,
    move: Move,
    door: str,
    actor: Actor,
    now: datetime | None = None,
) -> tuple[set[str], RunEvent]:
    """Change ``run`` in memory for its move to ``to_state``: the fields to save, and its
    timeline event (unsaved). ``now``: the moment of the move (one for a batch)."""
    now = now or timezone.now()
    source = run.state
    update_fields = {"state", "state_reason", "failure_kind", "updated_at"}
    run.state = to_state
    run.state_reason = move.message
    run.failure_kind = failure_kind
    run.updated_at = now
    if to_state == RunState.RUNNING:
        run.started_at = run.started_at or now
        run.heartbeat_at = now
        update_fields |= {"started_at", "heartbeat_at"}
    elif to_state == RunState.QUEUED:
        # The next attempt: the last one's token opens nothing any more (its late reports
        # are refused with 409), and the run waits to be dispatched (or offered) again.
        run.attempt += 1
        run.external_id = ""
        run.dispatched_at = None
        run.heartbeat_at = None
        run.token_hash = ""
        update_fields |= {"attempt", "external_id", "dispatched_at", "heartbeat_at", "token_hash"}
    elif to_state in TERMINAL_RUN_STATES:
        run.finished_at = now
        update_fields.add("finished_at")
    for field, value in (move.changes or {}).items():
        setattr(run, field, value)
        update_fields.add(field)
    event = RunEvent.build(
        run=run,
        verb=Verb(to_state),
        door=door,
        actor=actor,
        actor_label=move.actor_label,
        from_state=source,
        to_state=to_state,
        message=move.message if not failure_kind else f"[{failure_kind}] {move.message}".strip(),
    )
    return update_fields, event


def _transition_after(*, run_id: int, plan_id: int, source: str, to_state: str) -> None:
    """What follows a transition's commit: the signal, and the nudges it calls for."""
    transaction.on_commit(
        lambda: run_state_changed.send(
            sender=Run, run_id=run_id, plan_id=plan_id, from_state=source, to_state=to_state
        )
    )
    if to_state in TERMINAL_RUN_STATES:
        nudge("runs.plan_check_finished", plan_id=plan_id)
    if source == RunState.RUNNING:
        nudge("runs.dispatch")  # a slot is free: start the next queued run now, not at beat


@transaction.atomic
def run_transition(
    *,
    run_id: int,
    to_state: str,
    door: str,
    actor: Actor = None,
    actor_label: str = "",
    failure_kind: str = "",
    message: str = "",
    changes: dict[str, Any] | None = None,
) -> Run:
    """The one way a run changes state: lock, check, change, record.

    Does nothing when the run is already in ``to_state``; refuses (naming the allowed source
    states) a move the state machine does not have. Terminal states never change. For many
    runs at once, ``runs_transition`` applies the same rules in a few statements.
    """
    if to_state not in RUN_TRANSITIONS:
        raise DomainError(f"Unknown run state '{to_state}'.")
    run = Run.objects.select_for_update().get(pk=run_id)
    if not _transition_check(run, to_state):
        return run
    source = run.state
    move = Move(run_id, message=message, actor_label=actor_label, changes=changes)
    update_fields, event = _transition_apply(
        run, to_state=to_state, failure_kind=failure_kind, move=move, door=door, actor=actor
    )
    run.save(update_fields=sorted(update_fields))
    event.save(force_insert=True)
    _transition_after(run_id=run_id, plan_id=run.plan_id, source=source, to_state=to_state)
    return run


def runs_save(runs: list[Run], fields: set[str]) -> None:
    """Save ``fields`` of many runs in one statement, each row written once: on PostgreSQL an
    UPDATE ... FROM unnest(arrays) for the fields that differ from run to run, setting those
    whose value is the same on every run as one value (``bulk_update``'s CASE per row and
    field costs the ORM far more CPU, and a second UPDATE of the same rows would write each
    row and its ten index entries twice). The pages showing them are told, as a save
    would tell them (``rows_changed``)."""
    rows_changed(Run, runs)
    ids = [run.pk for run in runs]
    concrete = [f for f in Run._meta.concrete_fields if f.name in fields]
    first = runs[0]
    same = [
        f for f in concrete if all(getattr(r, f.attname) == getattr(first, f.attname) for r in runs)
    ]
    differ = [f for f in concrete if f not in same]
    if connection.vendor != "postgresql" or any(
        f.get_internal_type() == "JSONField" for f in differ
    ):
        if same:
            Run.objects.filter(pk__in=ids).update(
                **{f.name: getattr(first, f.attname) for f in same}
            )
        if differ:
            Run.objects.bulk_update(runs, [f.name for f in differ])
        return
    table = Run._meta.db_table
    sets = [f'"{f.column}" = %s' for f in same] + [f'"{f.column}" = v."{f.column}"' for f in differ]
    arrays = "".join(f", %s::{f.db_type(connection)}[]" for f in differ)
    names = "".join(f', "{f.column}"' for f in differ)
    params: list[Any] = [f.get_db_prep_save(getattr(first, f.attname), connection) for f in same]
    params += [ids] + [
        [f.get_db_prep_save(getattr(run, f.attname), connection) for run in runs] for f in differ
    ]
    with connection.cursor() as cursor:
        cursor.execute(
            f'UPDATE "{table}" SET {", ".join(sets)} '  # noqa: S608
            f'FROM unnest(%s::bigint[]{arrays}) AS v("id"{names}) WHERE "{table}"."id" = v."id"',
            params,
        )


def _events_insert(events: list[RunEvent]) -> None:
    """Insert timeline rows made by ``RunEvent.build``, all of one moment: on PostgreSQL one
    INSERT ... SELECT FROM unnest(arrays), without the ORM's work per row and field; the
    timelines showing them are told (``rows_changed``)."""
    rows_changed(RunEvent, events)
    if connection.vendor != "postgresql":
        RunEvent.objects.bulk_create(events)
        return
    now = timezone.now()
    for event in events:
        event.created_at = now
    fields = [f for f in RunEvent._meta.concrete_fields if not f.primary_key]
    columns = ", ".join(f'"{f.column}"' for f in fields)
    arrays = ", ".join(f"%s::{f.db_type(connection)}[]" for f in fields)
    params = [
        [f.get_db_prep_save(getattr(e, f.attname), connection) for e in events] for f in fields
    ]
    with connection.cursor() as cursor:
        cursor.execute(
            f'INSERT INTO "{RunEvent._meta.db_table}" ({columns}) '  # noqa: S608
            f"SELECT * FROM unnest({arrays})",
            params,
        )


def runs_transition(
    *,
    moves: list[Move],
    to_state: str,
    door: str,
    actor: Actor = None,
    failure_kind: str = "",
    locked: dict[int, Run] | None = None,
) -> list[Run]:
    """``run_transition`` for many runs at once, by the same rules (``_transition_check``,
    ``_transition_apply``, ``_transition_after``), in a few statements however many runs:
    one ``SELECT ... FOR UPDATE`` (in id order), one UPDATE, one INSERT of the events. A
    move the state machine does not have refuses them all. Answers the runs, as ``moves``.
    ``locked``: the runs by id, read with ``SELECT ... FOR UPDATE`` by the caller in this
    transaction already, so not read again (with at least the fields a transition reads and
    writes). In the caller's transaction it takes no savepoint: a refusal comes before any
    write."""
    if not connection.in_atomic_block:
        with transaction.atomic():
            return runs_transition(
                moves=moves,
                to_state=to_state,
                door=door,
                actor=actor,
                failure_kind=failure_kind,
                locked=locked,
            )
    if to_state not in RUN_TRANSITIONS:
        raise DomainError(f"Unknown run state '{to_state}'.")
    ids = [move.run_id for move in moves]
    if locked is not None and all(run_id in locked for run_id in ids):
        runs = {run_id: locked[run_id] for run_id in ids}
    else:
        runs = Run.objects.select_for_update().filter(pk__in=ids).order_by("pk").in_bulk()
    if len(runs) != len(set(ids)):
        raise Run.DoesNotExist(f"No run {sorted(set(ids) - set(runs))[0]}.")
    moved: list[tuple[Run, str]] = []
    fields: set[str] = set()
    events: list[RunEvent] = []
    now = timezone.now()  # one moment for the batch: its times are one value in the UPDATE
    for move in moves:
        run = runs[move.run_id]
        if not _transition_check(run, to_state):
            continue
        source = run.state
        update_fields, event = _transition_apply(
            run,
            to_state=to_state,
            failure_kind=failure_kind,
            move=move,
            door=door,
            actor=actor,
            now=now,
        )
        fields |= update_fields
        events.append(event)
        moved.append((run, source))
    if moved:
        runs_save([run for run, _ in moved], fields)
        _events_insert(events)
    for run, source in moved:
        _transition_after(run_id=run.pk, plan_id=run.plan_id, source=source, to_state=to_state)
    return [runs[move.run_id] for move in moves]


def run_cancel(*, run_id: int, actor: Actor, door: str = Door.WEB) -> Run:
    """Ask for a run to stop: a queued run is killed at once, a running one once its
    executor confirms. Asking twice changes nothing. Needs ``runs.cancel_run``."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        permission_require(actor, CANCEL_RUN, run, "cancel this run")
        if run.is_terminal:
            raise TransitionNotAllowed(
                action="cancel a run",
                current=run.state,
                allowed=[RunState.QUEUED, RunState.RUNNING, RunState.PREEMPTED],
            )
        if run.cancel_requested_at is None:
            run.cancel_requested_at = timezone.now()
            run.save(update_fields=["cancel_requested_at", "updated_at"])
            run_event_record(run=run, verb=Verb.CANCEL_REQUESTED, door=door, actor=actor)
        if run.state in {RunState.QUEUED, RunState.PREEMPTED}:
            return run_transition(
                run_id=run_id,
                to_state=RunState.KILLED,
                door=door,
                actor=actor,
                message="canceled before it started",
            )
        nudge("runs.run_reconcile", run_id=run_id)
        return run


def _run_again(
    *, run_id: int, actor: Actor, door: str, verb: str, sources: frozenset[str], permission: str
) -> Run:
    with transaction.atomic():
        # The plan's launch first, then the run: the order plan_cancel locks them in.
        plan_id = Run.objects.values_list("plan_id", flat=True).get(pk=run_id)
        launch = PlanLaunch.objects.select_for_update().filter(plan_id=plan_id).first()
        source = Run.objects.select_for_update().get(pk=run_id)
        permission_require(actor, permission, source, f"{verb} this run")
        if source.state not in sources:
            raise TransitionNotAllowed(
                action=f"{verb} a run", current=source.state, allowed=sources
            )
        if launch is None or launch.canceled_at is not None:
            # Nothing dispatches a stopped plan's runs: a new one would wait forever.
            raise Conflict(
                f"Cannot {verb} run {source.pk}: its plan "
                + ("was cancelled" if launch is not None else "was never launched")
                + ", so nothing would start the new run."
            )
        latest = Run.objects.filter(entry_id=source.entry_id).aggregate(m=Max("sequence"))["m"]
        if latest != source.sequence:
            newer = Run.objects.get(entry_id=source.entry_id, sequence=latest)
            if not newer.is_terminal:
                return newer  # already asked: the newer run is on its way
        run = Run.objects.create(
            plan_id=source.plan_id,
            entry_id=source.entry_id,
            sequence=(latest or 0) + 1,
            recipe_name=source.recipe_name,
            recipe_version=source.recipe_version,
            config=source.config,
            config_hash=source.config_hash,
            accelerator_hours=source.accelerator_hours,
            executor=source.executor,
            git_sha=source.git_sha,  # a rerun runs the commit pinned at approval too
            max_attempts=source.max_attempts,
            heartbeat_timeout_seconds=source.heartbeat_timeout_seconds,
            time_limit_seconds=source.time_limit_seconds,
            state_reason=f"{verb} of run {source.pk}",
        )
        run_event_record(
            run=run,
            verb=Verb(verb),
            door=door,
            actor=actor,
            to_state=run.state,
            message=f"{verb} of run {source.pk}",
        )
        run_event_record(
            run=source,
            verb=Verb(f"{verb}_requested"),
            door=door,
            actor=actor,
            message=f"run {run.pk} queued",
        )
        PlanLaunch.objects.filter(plan_id=source.plan_id).update(finished_at=None, summary=None)
        rows_changed(PlanLaunch, PlanLaunch.objects.filter(plan_id=source.plan_id))
        nudge("runs.dispatch")
        return run


def run_rerun(*, run_id: int, actor: Actor, door: str = Door.WEB) -> Run:
    """Run a terminal run's config again, even when it finished (or was a cached result).
    Needs ``runs.rerun_run``."""
    return _run_again(
        run_id=run_id,
        actor=actor,
        door=door,
        verb=Verb.RERUN,
        sources=TERMINAL_RUN_STATES,
        permission=RERUN_RUN,
    )


def run_retry(*, run_id: int, actor: Actor, door: str = Door.WEB) -> Run:
    """Give a run that failed, crashed or was killed another go. Needs ``runs.retry_run``."""
    return _run_again(
        run_id=run_id,
        actor=actor,
        door=door,
        verb=Verb.RETRY,
        sources=frozenset({RunState.FAILED, RunState.CRASHED, RunState.KILLED}),
        permission=RETRY_RUN,
    )
