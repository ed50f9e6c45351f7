"""Getting runs going: expansion of a launched plan into runs, the capacity they may take
(per executor, per plan, within the plan's budget), dispatch, offers to a pool's agents, and
the job each run is handed (its command, environment, files and working folder).

The database is the truth and a queue message only a nudge: every function here can run
twice, or after a lost message, and leaves the same rows behind.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from marin_site.doors import Door
from marin_site.errors import DomainError
from marin_site.events import Verb
from marin_site.nudges import nudge
from runs.executors import (
    ExecutorError,
    JobSpec,
    executor_unavailable,
    get_executor,
    is_pull_executor,
    pool_name,
)
from runs.executors.pool import PoolExecutor
from runs.models import FailureKind, Plan, PlanLaunch, Run, RunEvent, RunState
from runs.pools import wakeup
from runs.services.runs import run_event_record, run_transition
from runs.tokens import run_token, token_hash

logger = logging.getLogger(__name__)


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
        RunEvent.build(
            run=run,
            verb=Verb.CACHED if run.state == RunState.FINISHED else Verb.QUEUED,
            door=Door.WORKER,
            to_state=run.state,
            created_at=now,
        )
        for run in created
    )
    launch.expanded_at = now
    launch.save(update_fields=["expanded_at"])
    nudge("runs.dispatch")
    if all(run.state == RunState.FINISHED for run in created):
        nudge("runs.plan_check_finished", plan_id=plan_id)
    return len(created)


@dataclass
class Capacity:
    executor_running: dict[str, int]
    plan_running: dict[int, int]
    plan_spent: dict[int, float]


# A run holds a slot while it runs, and, on an executor whose agents pull their work, from
# the moment it is offered to them (queued, with ``dispatched_at`` set) until it is leased.
OFFERED = Q(state=RunState.QUEUED, dispatched_at__isnull=False)
HOLDS_SLOT = Q(state=RunState.RUNNING) | OFFERED


def capacity_of(plan_ids: list[int]) -> Capacity:
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
    return Capacity(executor_running, plan_running, plan_spent)


def executor_limit(executor: str) -> int:
    if pool := pool_name(executor):
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
    capacity = capacity_of(list(by_plan))
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
                RunEvent.build(
                    run_id=pk, verb=Verb.OFFERED, door=Door.WORKER, message=f"offered to {executor}"
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
        resources=dict(run.plan.recipe_snapshot.get("resources") or {}),
    )


def _env(name: str) -> str:
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
    if run.dispatched_at is not None:
        return None
    pool = pool_name(run.executor)
    run.dispatched_at = timezone.now()
    run.state_reason = f"waiting for an agent of pool '{pool}'"
    run.save(update_fields=["dispatched_at", "state_reason", "updated_at"])
    run_event_record(
        run=run, verb=Verb.OFFERED, door=Door.WORKER, message=f"offered to {run.executor}"
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
        run_requeue_unsubmitted(run_id=run_id, reason=str(exc))
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


def run_requeue_unsubmitted(*, run_id: int, reason: str) -> bool:
    """Put a running run whose job its executor did not take (it does not answer, or refused
    it) back in the queue, the same attempt, saying why: the dispatcher tries again once the
    executor is available (Iris backs off), and as the job's name is the same, a submit that
    went through after all is found then, not doubled. False when the run moved meanwhile."""
    with transaction.atomic():
        run = (
            Run.objects.select_for_update()
            .filter(pk=run_id, state=RunState.RUNNING, external_id="")
            .first()
        )
        if run is None or run.cancel_requested_at is not None:
            return False
        run.state = RunState.QUEUED
        run.state_reason = f"waiting: {reason}"[:500]
        run.dispatched_at = run.heartbeat_at = run.started_at = None
        run.token_hash = ""
        run.save(
            update_fields=[
                "state",
                "state_reason",
                "dispatched_at",
                "heartbeat_at",
                "started_at",
                "token_hash",
                "updated_at",
            ]
        )
        run_event_record(
            run=run,
            verb=Verb.QUEUED,
            door=Door.WORKER,
            from_state=RunState.RUNNING,
            to_state=RunState.QUEUED,
            message=f"not submitted, back in the queue: {reason}"[:500],
        )
    return True
