"""Writes for runs: the one state transition, expansion of a launched plan, dispatch,
cancel, rerun and retry, and the reconciler that keeps every run's state true.

The database is the truth and a queue message only a nudge: every function here can run
twice, or after a lost message, and leaves the same rows behind.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import shlex
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.db import transaction
from django.db.models import Max, Q
from django.utils import timezone

from marin_site.doors import Door
from marin_site.errors import DomainError, TransitionNotAllowed
from marin_site.roles import permission_require
from runs.executors import (
    ExecutorError,
    JobSpec,
    JobState,
    JobStatus,
    executor_unavailable,
    get_executor,
    is_pull_executor,
    pool_name,
)
from runs.models import (
    TERMINAL_RUN_STATES,
    FailureKind,
    Plan,
    PlanLaunch,
    Run,
    RunEvent,
    RunState,
)
from runs.permissions import CANCEL_RUN, RERUN_RUN, RETRY_RUN
from runs.signals import reconcile_pass, run_state_changed

logger = logging.getLogger(__name__)

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


def _user(actor: Actor) -> User | None:
    return actor if isinstance(actor, User) else None


def _nudge(task_name: str, **kwargs: int) -> None:
    """Enqueue a task after commit; a lost nudge is picked up by the reconciler."""
    from runs import tasks

    task = getattr(tasks, task_name)
    transaction.on_commit(lambda: _send(task, kwargs), robust=True)


def _send(task: Any, kwargs: dict[str, int]) -> None:
    try:
        task.apply_async(kwargs=kwargs, retry=False)
    except Exception:  # the broker is down: the reconciler will do it
        logger.warning("could not enqueue %s%s; the reconciler will", task.name, kwargs)


def _run_event(
    *,
    run: Run,
    verb: str,
    door: str,
    actor: Actor = None,
    actor_label: str = "",
    from_state: str = "",
    to_state: str = "",
    message: str = "",
) -> RunEvent:
    return RunEvent(
        run=run,
        actor=_user(actor),
        actor_label=actor_label,
        verb=verb,
        door=door,
        from_state=from_state,
        to_state=to_state,
        message=message[:10_000],
    )


def run_event_record(
    *,
    run: Run,
    verb: str,
    door: str,
    actor: Actor = None,
    actor_label: str = "",
    from_state: str = "",
    to_state: str = "",
    message: str = "",
) -> RunEvent:
    event = _run_event(
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
    run: Run, *, to_state: str, failure_kind: str, move: Move, door: str, actor: Actor
) -> tuple[set[str], RunEvent]:
    """Change ``run`` in memory for its move to ``to_state``: the fields to save, and its
    timeline event (unsaved)."""
    now = timezone.now()
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
    event = _run_event(
        run=run,
        verb=to_state,
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
        _nudge("plan_check_finished_task", plan_id=plan_id)
    if source == RunState.RUNNING:
        _nudge("dispatch_task")  # a slot is free: start the next queued run now, not at beat


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


def _runs_save(runs: list[Run], fields: set[str]) -> None:
    """Save ``fields`` of many runs in two statements: one UPDATE of the fields whose value is
    the same on every run, one of those that differ (on PostgreSQL an UPDATE ... FROM
    unnest(arrays): ``bulk_update``'s CASE per row and field costs the ORM far more CPU)."""
    from django.db import connection

    ids = [run.pk for run in runs]
    concrete = {name: Run._meta.get_field(name) for name in sorted(fields)}
    same = {
        name: getattr(runs[0], field.attname)
        for name, field in concrete.items()
        if all(getattr(run, field.attname) == getattr(runs[0], field.attname) for run in runs)
    }
    if same:
        Run.objects.filter(pk__in=ids).update(**same)
    differ = [field for name, field in concrete.items() if name not in same]
    if not differ:
        return
    if connection.vendor != "postgresql" or any(
        f.get_internal_type() == "JSONField" for f in differ
    ):
        Run.objects.bulk_update(runs, [field.name for field in differ])
        return
    columns = ", ".join(f'"{f.column}" = v."{f.column}"' for f in differ)
    arrays = ", ".join(f"%s::{f.db_type(connection)}[]" for f in differ)
    names = ", ".join(f'"{f.column}"' for f in differ)
    table = Run._meta.db_table
    params: list[Any] = [ids] + [
        [f.get_db_prep_save(getattr(run, f.attname), connection) for run in runs] for f in differ
    ]
    with connection.cursor() as cursor:
        cursor.execute(
            f'UPDATE "{table}" SET {columns} FROM unnest(%s::bigint[], {arrays}) '  # noqa: S608
            f'AS v("id", {names}) WHERE "{table}"."id" = v."id"',
            params,
        )


@transaction.atomic
def runs_transition(
    *,
    moves: list[Move],
    to_state: str,
    door: str,
    actor: Actor = None,
    failure_kind: str = "",
) -> list[Run]:
    """``run_transition`` for many runs at once, by the same rules (``_transition_check``,
    ``_transition_apply``, ``_transition_after``), in a few statements however many runs:
    one ``SELECT ... FOR UPDATE`` (in id order), one UPDATE, one INSERT of the events. A
    move the state machine does not have refuses them all. Answers the runs, as ``moves``."""
    if to_state not in RUN_TRANSITIONS:
        raise DomainError(f"Unknown run state '{to_state}'.")
    ids = [move.run_id for move in moves]
    runs = Run.objects.select_for_update().filter(pk__in=ids).order_by("pk").in_bulk()
    if len(runs) != len(set(ids)):
        raise Run.DoesNotExist(f"No run {sorted(set(ids) - set(runs))[0]}.")
    moved: list[tuple[Run, str]] = []
    fields: set[str] = set()
    events: list[RunEvent] = []
    for move in moves:
        run = runs[move.run_id]
        if not _transition_check(run, to_state):
            continue
        source = run.state
        update_fields, event = _transition_apply(
            run, to_state=to_state, failure_kind=failure_kind, move=move, door=door, actor=actor
        )
        fields |= update_fields
        events.append(event)
        moved.append((run, source))
    if moved:
        _runs_save([run for run, _ in moved], fields)
        RunEvent.objects.bulk_create(events)
    for run, source in moved:
        _transition_after(run_id=run.pk, plan_id=run.plan_id, source=source, to_state=to_state)
    return [runs[move.run_id] for move in moves]


# --- tokens ---------------------------------------------------------------------------


def run_token(*, run: Run) -> str:
    """The run's token for its current attempt.

    Derived from SECRET_KEY, so a dispatch repeated after a crash hands the job the same
    token; only its SHA-256 is stored on the run.
    """
    key = settings.SECRET_KEY.encode()
    digest = hmac.new(key, f"run-token:{run.pk}:{run.attempt}".encode(), hashlib.sha256)
    return f"r{run.pk}.{digest.hexdigest()}"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class RunEnded(DomainError):
    """A write with the token of a run that has ended: nothing it sends is taken (409)."""

    status_code = 409


class RunTokenExpired(DomainError):
    """A run token past its run's time limit and grace (401)."""

    status_code = 401


def run_token_refusal(*, run: Run, write: bool) -> DomainError | None:
    """Why a token that matches ``run`` may not be used now, or None.

    Once the run is terminal its token writes nothing more (a late job cannot replace a
    finished run's numbers), and whatever the state it ends with the run's time limit plus
    ``RUNS_TOKEN_GRACE_SECONDS`` after the run started: a leaked token does not live on."""
    if write and run.state in TERMINAL_RUN_STATES:
        return RunEnded(f"Run {run.pk} has ended ({run.state}); its token writes nothing more.")
    if run.started_at is not None:
        lifetime = timedelta(seconds=run.time_limit_seconds + settings.RUNS_TOKEN_GRACE_SECONDS)
        if timezone.now() > run.started_at + lifetime:
            return RunTokenExpired(
                f"The token of run {run.pk} expired: its time limit and "
                f"{settings.RUNS_TOKEN_GRACE_SECONDS} s of grace have passed since it started."
            )
    return None


def run_token_matches(*, run: Run, token: str) -> bool:
    return bool(run.token_hash) and hmac.compare_digest(token_hash(token), run.token_hash)


class TokenSuperseded(DomainError):
    """A token of an attempt that is over (its lease was lost, its run requeued): 409."""

    status_code = 409


def run_token_superseded(*, run: Run, token: str) -> int:
    """The earlier attempt of ``run`` whose token this is (its lease or job is over), or 0.

    Tokens derive from (run, attempt), so an earlier attempt's token is recognised without
    storing it: a late report from a lost lease is told 409, not mistaken for a stranger."""
    for attempt in range(run.attempt - 1, 0, -1):
        key = settings.SECRET_KEY.encode()
        digest = hmac.new(key, f"run-token:{run.pk}:{attempt}".encode(), hashlib.sha256)
        if hmac.compare_digest(token, f"r{run.pk}.{digest.hexdigest()}"):
            return attempt
    return 0


# --- plan expansion -----------------------------------------------------------------------


@transaction.atomic
def plan_expand(*, plan_id: int) -> int:
    """Turn a launched plan into runs: one per entry, cached where the config already ran.

    Returns how many runs were created (0 when the plan was already expanded).
    """
    launch = PlanLaunch.objects.select_for_update().filter(plan_id=plan_id).first()
    if launch is None or launch.expanded_at is not None or launch.canceled_at is not None:
        return 0
    plan = Plan.objects.get(pk=plan_id)
    snapshot = plan.recipe_snapshot
    name, version = str(snapshot.get("name")), str(snapshot.get("version"))
    entries = list(plan.entries.order_by("index"))
    finished_before: dict[str, tuple[int, dict[str, Any]]] = {}
    for done in (
        Run.objects.filter(
            recipe_name=name,
            recipe_version=version,
            config_hash__in=[e.config_hash for e in entries],
            state=RunState.FINISHED,
        )
        .exclude(plan_id=plan_id)
        .order_by("pk")
    ):
        source = done.cached_from_id or done.pk
        finished_before.setdefault(done.config_hash, (source, done.final_metrics))
    now = timezone.now()
    time_limit = launch.time_limit_seconds or settings.RUNS_TIME_LIMIT_SECONDS
    runs = []
    for entry in entries:
        cached = finished_before.get(entry.config_hash)
        runs.append(
            Run(
                plan=plan,
                entry=entry,
                sequence=0,
                recipe_name=name,
                recipe_version=version,
                config=entry.config,
                config_hash=entry.config_hash,
                accelerator_hours=entry.accelerator_hours,
                executor=launch.executor,
                git_sha=launch.git_ref,
                max_attempts=settings.RUNS_MAX_ATTEMPTS,
                heartbeat_timeout_seconds=settings.RUNS_HEARTBEAT_TIMEOUT_SECONDS,
                time_limit_seconds=time_limit,
                state=RunState.FINISHED if cached else RunState.QUEUED,
                cached_from_id=cached[0] if cached else None,
                final_metrics=cached[1] if cached else {},
                finished_at=now if cached else None,
                state_reason=f"cached: identical config finished as run {cached[0]}"
                if cached
                else "",
            )
        )
    Run.objects.bulk_create(runs, ignore_conflicts=True)
    created = list(Run.objects.filter(plan_id=plan_id, sequence=0).only("pk", "state"))
    RunEvent.objects.bulk_create(
        RunEvent(
            run=run,
            verb="cached" if run.state == RunState.FINISHED else "queued",
            door=Door.WORKER,
            to_state=run.state,
            created_at=now,
        )
        for run in created
    )
    launch.expanded_at = now
    launch.save(update_fields=["expanded_at"])
    _nudge("dispatch_task")
    if all(run.state == RunState.FINISHED for run in created):
        _nudge("plan_check_finished_task", plan_id=plan_id)
    return len(created)


# --- dispatch -----------------------------------------------------------------------------


@dataclass
class _Capacity:
    executor_running: dict[str, int]
    plan_running: dict[int, int]
    plan_spent: dict[int, float]


# A run holds a slot while it runs, and, on an executor whose agents pull their work, from
# the moment it is offered to them (queued, with ``dispatched_at`` set) until it is leased.
OFFERED = Q(state=RunState.QUEUED, dispatched_at__isnull=False)
HOLDS_SLOT = Q(state=RunState.RUNNING) | OFFERED


def _capacity(plan_ids: list[int]) -> _Capacity:
    executor_running: dict[str, int] = {}
    for executor in Run.objects.filter(HOLDS_SLOT).values_list("executor", flat=True).iterator():
        executor_running[executor] = executor_running.get(executor, 0) + 1
    plan_running: dict[int, int] = {}
    plan_spent: dict[int, float] = {}
    rows = Run.objects.filter(plan_id__in=plan_ids, cached_from__isnull=True).filter(
        HOLDS_SLOT | Q(started_at__isnull=False)
    )
    for plan_id, state, offered, hours in rows.values_list(
        "plan_id", "state", "dispatched_at", "accelerator_hours"
    ):
        if state == RunState.RUNNING or (state == RunState.QUEUED and offered is not None):
            plan_running[plan_id] = plan_running.get(plan_id, 0) + 1
        plan_spent[plan_id] = plan_spent.get(plan_id, 0.0) + hours
    return _Capacity(executor_running, plan_running, plan_spent)


def executor_limit(executor: str) -> int:
    if pool := pool_name(executor):
        from runs.executors.pool import PoolExecutor

        return PoolExecutor(pool).limit()
    limits: dict[str, int] = settings.RUNS_EXECUTOR_MAX_CONCURRENT
    return limits.get(executor, 1)


@transaction.atomic
def runs_dispatch() -> list[int]:
    """Start every queued run the limits allow; say on the others why they wait.

    Locks the launches with queued runs (in id order), so two dispatchers never both fill
    the same free slot. Jobs are submitted after the transaction commits.
    """
    # Runs offered to a pool already hold their slots: only the others wait for a decision.
    waiting_runs = Run.objects.filter(state=RunState.QUEUED, dispatched_at__isnull=True)
    with_queued = waiting_runs.values("plan_id")
    launches = list(
        PlanLaunch.objects.select_for_update()
        .filter(canceled_at__isnull=True, plan_id__in=with_queued)
        .order_by("pk")
    )
    if not launches:
        return []
    by_plan = {launch.plan_id: launch for launch in launches}
    capacity = _capacity(list(by_plan))
    plans = {p.pk: p for p in Plan.objects.filter(pk__in=by_plan)}
    queued = (
        waiting_runs.filter(plan_id__in=by_plan)
        .order_by("plan_id", "entry__index", "sequence")
        .select_related("entry")
    )
    started: list[int] = []
    unavailable: dict[str, str] = {}  # executor -> why it takes no runs now ("" if it does)
    limits: dict[str, int] = {}
    to_offer: list[Run] = []
    waiting: dict[str, list[int]] = {}  # reason -> runs to say it on, one UPDATE per reason
    for run in queued:
        if run.cancel_requested_at is not None or run.dispatched_at is not None:
            continue  # canceled, or offered to a pool's agents already (it holds its slot)
        launch = by_plan[run.plan_id]
        plan = plans[run.plan_id]
        reason = ""
        plan_limit = launch.max_concurrent_runs or settings.RUNS_PLAN_MAX_CONCURRENT
        budget = plan.budget_accelerator_hours
        spent = capacity.plan_spent.get(run.plan_id, 0.0)
        if run.executor not in unavailable:
            unavailable[run.executor] = executor_unavailable(run.executor)
            limits[run.executor] = executor_limit(run.executor)
        if unavailable[run.executor]:
            reason = f"waiting: {unavailable[run.executor]}"
        elif capacity.executor_running.get(run.executor, 0) >= limits[run.executor]:
            reason = f"waiting: executor '{run.executor}' is at its limit of {limits[run.executor]} concurrent runs"
        elif capacity.plan_running.get(run.plan_id, 0) >= plan_limit:
            reason = f"waiting: the plan is at its limit of {plan_limit} concurrent runs"
        elif budget is not None and spent + run.accelerator_hours > budget + 1e-9:
            reason = (
                f"waiting: would exceed the plan budget ({spent + run.accelerator_hours:.4g} of "
                f"{budget:.4g} accelerator-hours)"
            )
        if reason:
            if run.state_reason != reason:
                waiting.setdefault(reason, []).append(run.pk)
            continue
        if is_pull_executor(run.executor):
            to_offer.append(run)  # offered in bulk below: agents lease them
        elif run_start(run_id=run.pk) is not None:
            started.append(run.pk)
        else:
            continue
        capacity.executor_running[run.executor] = capacity.executor_running.get(run.executor, 0) + 1
        capacity.plan_running[run.plan_id] = capacity.plan_running.get(run.plan_id, 0) + 1
        capacity.plan_spent[run.plan_id] = spent + run.accelerator_hours
    started += _runs_offer(to_offer)
    for reason, run_ids in waiting.items():
        Run.objects.filter(pk__in=run_ids, state=RunState.QUEUED).update(state_reason=reason)
    return started


def _runs_offer(runs: list[Run]) -> list[int]:
    """Offer queued runs to their pools' agents, a few statements per pool however many
    runs (a 256-run plan is offered in one UPDATE, one bulk insert of events and one
    NOTIFY), inside the dispatcher's transaction. A plan whose command template cannot be
    filled goes through ``run_start``, which fails its runs saying why."""
    from runs.pools import wakeup

    broken: set[int] = set()
    for first in {run.plan_id: run for run in runs}.values():
        try:
            run_command(run=first, python=PYTHON_PLACEHOLDER)
        except DomainError:
            broken.add(first.plan_id)
    offered: list[int] = []
    by_executor: dict[str, list[int]] = {}
    for run in runs:
        if run.plan_id in broken:
            run_start(run_id=run.pk)
        else:
            by_executor.setdefault(run.executor, []).append(run.pk)
    now = timezone.now()
    for executor, run_ids in by_executor.items():
        pool = pool_name(executor)
        ids = list(
            Run.objects.select_for_update()
            .filter(
                pk__in=run_ids,
                state=RunState.QUEUED,
                cancel_requested_at__isnull=True,
                dispatched_at__isnull=True,
            )
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        if not ids:
            continue
        Run.objects.filter(pk__in=ids).update(
            dispatched_at=now, state_reason=f"waiting for an agent of pool '{pool}'", updated_at=now
        )
        RunEvent.objects.bulk_create(
            (
                RunEvent(
                    run_id=pk, verb="offered", door=Door.WORKER, message=f"offered to {executor}"
                )
                for pk in ids
            ),
            batch_size=500,
        )
        wakeup.work_offered(pool)
        offered += ids
    return offered


def run_workdir(*, run: Run) -> Path:
    return Path(settings.RUNS_WORK_DIR) / f"run-{run.pk}" / f"attempt-{run.attempt}"


PYTHON_PLACEHOLDER = "{python}"  # in an agent's argv: the agent fills in its own Python


def run_command(
    *, run: Run, python: str = sys.executable, template: str | None = None
) -> list[str]:
    """The run's argv, from its launch's command template (``template``: that template,
    read already)."""
    if template is None:
        template = PlanLaunch.objects.get(plan_id=run.plan_id).command_template
    try:
        command = template.format(python=python, config_path="config.json", run_id=run.pk)
        argv = shlex.split(command)
    except (KeyError, IndexError, ValueError) as exc:
        raise DomainError(f"The recipe's command template cannot be filled: {exc}") from exc
    if not argv:
        raise DomainError("The recipe's command template is empty.")
    return argv


def run_job_env(*, run: Run) -> dict[str, str]:
    """What every job gets, on every executor: who it is, its token, where to report, and
    the code version pinned at approval (``RUN_GIT_SHA``, also as ``RUN_GIT_REF``)."""
    token = run_token(run=run)
    return {
        "RUN_ID": str(run.pk),
        "RUN_TOKEN": token,
        "RUN_API_URL": settings.RUNS_API_URL,
        "RUN_ATTEMPT": str(run.attempt),
        "RUN_GIT_SHA": run.git_sha,
        "RUN_GIT_REF": run.git_sha,
        # A stock MLflow client reports to this run unchanged (runs/mlflow/).
        "MLFLOW_TRACKING_URI": settings.RUNS_MLFLOW_TRACKING_URI,
        "MLFLOW_TRACKING_TOKEN": token,
        "MLFLOW_EXPERIMENT_ID": str(run.plan_id),
    }


def run_config_file(*, run: Run) -> str:
    import json

    return json.dumps(run.config, indent=2, sort_keys=True)


def run_job_spec(*, run: Run) -> JobSpec:
    secrets = {name: value for name in settings.RUNS_SECRET_ENV if (value := _env(name))}
    return JobSpec(
        job_id=f"run-{run.pk}-attempt-{run.attempt}",
        argv=run_command(run=run),
        workdir=run_workdir(run=run),
        env={**run_job_env(run=run), **secrets},
        files={"config.json": run_config_file(run=run)},
        time_limit_seconds=run.time_limit_seconds,
    )


def _env(name: str) -> str:
    import os

    return os.environ.get(name, "")


def run_start(*, run_id: int) -> Run | None:
    """Move a queued run to running and submit its job once the transaction commits."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        if run.state != RunState.QUEUED or run.cancel_requested_at is not None:
            return None
        try:
            command = run_command(run=run)
        except DomainError as exc:
            return run_transition(
                run_id=run_id,
                to_state=RunState.FAILED,
                failure_kind=FailureKind.CONFIG,
                door=Door.WORKER,
                message=exc.message,
            )
        if is_pull_executor(run.executor):
            return _run_offer(run)
        run = run_transition(
            run_id=run_id,
            to_state=RunState.RUNNING,
            door=Door.WORKER,
            message=f"dispatched to {run.executor}",
            changes={
                "command": shlex.join(command),
                "token_hash": token_hash(run_token(run=run)),
                "dispatched_at": timezone.now(),
                "output_path": str(run_workdir(run=run)),
                "secret_env_names": [n for n in settings.RUNS_SECRET_ENV if _env(n)],
            },
        )
        transaction.on_commit(lambda: run_submit(run_id=run_id), robust=True)
        return run


def _run_offer(run: Run) -> Run | None:
    """Offer a queued run to its pool's agents (inside ``run_start``'s transaction): it now
    holds a slot, and the first agent to ask leases it (``runs.pools.leases``)."""
    from runs.pools import wakeup

    if run.dispatched_at is not None:
        return None
    pool = pool_name(run.executor)
    run.dispatched_at = timezone.now()
    run.state_reason = f"waiting for an agent of pool '{pool}'"
    run.save(update_fields=["dispatched_at", "state_reason", "updated_at"])
    run_event_record(
        run=run, verb="offered", door=Door.WORKER, message=f"offered to {run.executor}"
    )
    wakeup.work_offered(pool)
    return run


def run_submit(*, run_id: int) -> str:
    """Hand a running run's job to its executor; submitting twice starts one job."""
    run = Run.objects.filter(pk=run_id, state=RunState.RUNNING).first()
    if run is None or run.cancel_requested_at is not None:
        return ""  # canceled before its job started: the reconciler marks it killed
    executor = get_executor(run.executor)
    try:
        external_id = executor.submit(run_job_spec(run=run))
    except ExecutorError as exc:
        logger.warning("submitting run %s failed: %s", run_id, exc)
        return ""
    if not Run.objects.filter(
        pk=run_id, state=RunState.RUNNING, cancel_requested_at__isnull=True
    ).update(external_id=external_id):
        try:  # canceled (or ended) while its job was being submitted: stop the job
            executor.cancel(external_id)
        except ExecutorError as exc:
            logger.warning("stopping the job of canceled run %s failed: %s", run_id, exc)
        return ""
    return external_id


# --- cancel, rerun, retry ------------------------------------------------------------------


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
            run_event_record(run=run, verb="cancel_requested", door=door, actor=actor)
        if run.state in {RunState.QUEUED, RunState.PREEMPTED}:
            return run_transition(
                run_id=run_id,
                to_state=RunState.KILLED,
                door=door,
                actor=actor,
                message="canceled before it started",
            )
        _nudge("run_reconcile_task", run_id=run_id)
        return run


def _run_again(
    *, run_id: int, actor: Actor, door: str, verb: str, sources: frozenset[str], permission: str
) -> Run:
    with transaction.atomic():
        source = Run.objects.select_for_update().get(pk=run_id)
        permission_require(actor, permission, source, f"{verb} this run")
        if source.state not in sources:
            raise TransitionNotAllowed(
                action=f"{verb} a run", current=source.state, allowed=sources
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
            max_attempts=source.max_attempts,
            heartbeat_timeout_seconds=source.heartbeat_timeout_seconds,
            time_limit_seconds=source.time_limit_seconds,
            state_reason=f"{verb} of run {source.pk}",
        )
        run_event_record(
            run=run,
            verb=verb,
            door=door,
            actor=actor,
            to_state=run.state,
            message=f"{verb} of run {source.pk}",
        )
        run_event_record(
            run=source,
            verb=f"{verb}_requested",
            door=door,
            actor=actor,
            message=f"run {run.pk} queued",
        )
        PlanLaunch.objects.filter(plan_id=source.plan_id).update(finished_at=None, summary=None)
        _nudge("dispatch_task")
        return run


def run_rerun(*, run_id: int, actor: Actor, door: str = Door.WEB) -> Run:
    """Run a terminal run's config again, even when it finished (or was a cached result).
    Needs ``runs.rerun_run``."""
    return _run_again(
        run_id=run_id,
        actor=actor,
        door=door,
        verb="rerun",
        sources=TERMINAL_RUN_STATES,
        permission=RERUN_RUN,
    )


def run_retry(*, run_id: int, actor: Actor, door: str = Door.WEB) -> Run:
    """Give a run that failed, crashed or was killed another go. Needs ``runs.retry_run``."""
    return _run_again(
        run_id=run_id,
        actor=actor,
        door=door,
        verb="retry",
        sources=frozenset({RunState.FAILED, RunState.CRASHED, RunState.KILLED}),
        permission=RETRY_RUN,
    )


# --- the reconciler -----------------------------------------------------------------------


def run_reconcile(*, run_id: int) -> Run | None:
    """Bring one run's state in line with its executor, its heartbeat and its cancel flag."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None or run.is_terminal:
        return run
    if run.state == RunState.PREEMPTED:
        return _reconcile_preempted(run)
    if run.state == RunState.QUEUED:
        if run.cancel_requested_at is not None:
            return run_transition(run_id=run_id, to_state=RunState.KILLED, door=Door.WORKER)
        return run
    if is_pull_executor(run.executor):  # the lease is the truth
        from runs.pools.leases import run_reconcile_leased

        return run_reconcile_leased(run_id=run_id)
    executor = get_executor(run.executor)
    if not run.external_id:
        if run.cancel_requested_at is not None:
            return run_transition(
                run_id=run_id,
                to_state=RunState.KILLED,
                door=Door.WORKER,
                message="canceled before its job was submitted",
            )
        if run_submit(run_id=run_id):
            return Run.objects.get(pk=run_id)
        return _crash_if_stale(run, executor_cancel=None)
    try:
        status = executor.poll(run.external_id)
    except ExecutorError as exc:
        logger.warning("polling run %s failed: %s", run_id, exc)
        return _crash_if_stale(run, executor_cancel=None)
    if status.state in {JobState.PENDING, JobState.RUNNING}:
        if run.cancel_requested_at is not None:
            executor.cancel(run.external_id)
            return run
        if _over_time_limit(run):  # for executors without a limit of their own (Ray)
            executor.cancel(run.external_id)
            return run_transition(
                run_id=run_id,
                to_state=RunState.FAILED,
                failure_kind=FailureKind.TIMEOUT,
                door=Door.WORKER,
                message=f"still running after its time limit of {run.time_limit_seconds} s",
            )
        return _crash_if_stale(run, executor_cancel=executor.cancel)
    return _settle_ended(run, status)


def _over_time_limit(run: Run) -> bool:
    if run.started_at is None:
        return False
    slack = settings.RUNS_LOCAL_GRACE_SECONDS + 30  # the local supervisor stops it first
    return timezone.now() - run.started_at > timedelta(seconds=run.time_limit_seconds + slack)


def _reconcile_preempted(run: Run) -> Run:
    if run.cancel_requested_at is not None:
        return run_transition(run_id=run.pk, to_state=RunState.KILLED, door=Door.WORKER)
    if run.attempt < run.max_attempts:
        return run_transition(
            run_id=run.pk,
            to_state=RunState.QUEUED,
            door=Door.WORKER,
            message=f"preempted; attempt {run.attempt + 1} of {run.max_attempts}",
        )
    return run_transition(
        run_id=run.pk,
        to_state=RunState.FAILED,
        failure_kind=FailureKind.PREEMPTED,
        door=Door.WORKER,
        message=f"preempted on each of its {run.max_attempts} attempts",
    )


def _settle_ended(run: Run, status: JobStatus) -> Run:
    """The state a run ends in, from how its job ended."""
    if status.state == JobState.SUCCEEDED:
        return run_transition(run_id=run.pk, to_state=RunState.FINISHED, door=Door.WORKER)
    if status.state == JobState.FAILED:
        return run_transition(
            run_id=run.pk,
            to_state=RunState.FAILED,
            failure_kind=status.failure_kind or FailureKind.CODE,
            door=Door.WORKER,
            message=status.message,
        )
    if status.state == JobState.PREEMPTED:
        return run_transition(
            run_id=run.pk,
            to_state=RunState.PREEMPTED,
            failure_kind=FailureKind.PREEMPTED,
            door=Door.WORKER,
            message=status.message,
        )
    if status.state == JobState.STOPPED and run.cancel_requested_at is not None:
        return run_transition(
            run_id=run.pk, to_state=RunState.KILLED, door=Door.WORKER, message="stopped on request"
        )
    if status.state == JobState.KILLED:  # a signal from outside, with the evidence in message
        return run_transition(
            run_id=run.pk, to_state=RunState.KILLED, door=Door.WORKER, message=status.message
        )
    message = (
        "the job was stopped outside marin-site"
        if status.state == JobState.STOPPED
        else f"the job vanished from the executor ({status.message})"
    )
    return run_transition(
        run_id=run.pk,
        to_state=RunState.CRASHED,
        failure_kind=FailureKind.INFRA,
        door=Door.WORKER,
        message=message,
    )


def _is_stale(run: Run) -> bool:
    last_sign = run.heartbeat_at or run.dispatched_at or run.updated_at
    return timezone.now() - last_sign > timedelta(seconds=run.heartbeat_timeout_seconds)


def _crash_if_stale(run: Run, *, executor_cancel: Any) -> Run:
    """Crash a running run whose heartbeat stopped. The first look is unlocked; the run is
    then locked and looked at again, so a heartbeat that arrived meanwhile saves it."""
    if not _is_stale(run):
        return run
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run.pk)
        if run.state != RunState.RUNNING or not _is_stale(run):
            return run
        if executor_cancel is not None and run.external_id:
            external_id = run.external_id
            transaction.on_commit(lambda: executor_cancel(external_id), robust=True)
        return run_transition(
            run_id=run.pk,
            to_state=RunState.CRASHED,
            failure_kind=FailureKind.INFRA,
            door=Door.WORKER,
            message=f"no heartbeat for more than {run.heartbeat_timeout_seconds} s",
        )


def plan_stop(*, plan_id: int) -> int:
    """Ask the executors of a canceled plan's running runs to stop them (after the plan's
    cancel commits). The reconciler asks again on every pass until each run has ended."""
    asked = Run.objects.filter(
        plan_id=plan_id, state=RunState.RUNNING, cancel_requested_at__isnull=False
    ).values_list("pk", flat=True)
    stopped = 0
    for run_id in list(asked):
        try:
            run_reconcile(run_id=run_id)
        except Exception:
            logger.exception("stopping run %s of canceled plan %s failed", run_id, plan_id)
            continue
        stopped += 1
    return stopped


def runs_reconcile() -> dict[str, int]:
    """The periodic pass: expand launched plans, settle every live run, dispatch, summarise."""
    from runs.results import plan_check_finished

    # Whoever hands runs/ launches and cancels makes good any that never arrived (a
    # listener's error is logged by send_robust and stops nothing here).
    reconcile_pass.send_robust(sender=PlanLaunch)
    expanded = 0
    for plan_id in PlanLaunch.objects.filter(
        expanded_at__isnull=True, canceled_at__isnull=True
    ).values_list("plan_id", flat=True):
        expanded += plan_expand(plan_id=plan_id)
    live = Run.objects.filter(
        Q(state__in=[RunState.RUNNING, RunState.PREEMPTED])
        | Q(state=RunState.QUEUED, cancel_requested_at__isnull=False)
    ).values_list("pk", flat=True)
    settled = 0
    for run_id in list(live):
        try:
            run = run_reconcile(run_id=run_id)
        except Exception:
            logger.exception("reconciling run %s failed", run_id)
            continue
        settled += int(run is not None and run.is_terminal)
    started = runs_dispatch()
    finished = 0
    for plan_id in PlanLaunch.objects.filter(
        finished_at__isnull=True, expanded_at__isnull=False
    ).values_list("plan_id", flat=True):
        finished += int(plan_check_finished(plan_id=plan_id))
    return {"expanded": expanded, "settled": settled, "started": len(started), "finished": finished}
