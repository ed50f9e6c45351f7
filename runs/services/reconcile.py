"""The reconciler: keeps every live run's state true to its executor, its heartbeat and its
cancel flag (settling the runs whose jobs ended, crashing the silent ones), stops a canceled
plan's running runs, and makes the periodic pass that also expands, dispatches and sums up.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from marin_site.doors import Door
from runs.executors import ExecutorError, JobState, JobStatus, get_executor, is_pull_executor
from runs.models import FailureKind, PlanLaunch, Run, RunState
from runs.pools.leases import run_reconcile_leased
from runs.results.summary import plan_check_finished
from runs.services.dispatch import plan_expand, run_submit, runs_dispatch
from runs.services.dry_runs import dry_runs_settle
from runs.services.runs import run_transition
from runs.signals import reconcile_pass

logger = logging.getLogger(__name__)


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
        return run_reconcile_leased(run_id=run_id)
    try:
        executor = get_executor(run.executor)
    except ExecutorError as exc:  # nothing this site knows runs it: it cannot be followed
        if run.cancel_requested_at is not None:
            return run_transition(
                run_id=run_id,
                to_state=RunState.KILLED,
                door=Door.WORKER,
                message="canceled; no executor of this site ran it",
            )
        return run_transition(
            run_id=run_id,
            to_state=RunState.CRASHED,
            failure_kind=FailureKind.INFRA,
            door=Door.WORKER,
            message=f"no executor of this site runs it: {exc}",
        )
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
        # For executors without a limit of their own (Ray); Iris ends the job itself, counting
        # from its start, so a job still waiting for its accelerator is not timed out here.
        if not getattr(executor, "ends_at_time_limit", False) and _over_time_limit(run):
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
    dry_runs_settle()
    finished = 0
    for plan_id in PlanLaunch.objects.filter(
        finished_at__isnull=True, expanded_at__isnull=False
    ).values_list("plan_id", flat=True):
        finished += int(plan_check_finished(plan_id=plan_id))
    return {"expanded": expanded, "settled": settled, "started": len(started), "finished": finished}
