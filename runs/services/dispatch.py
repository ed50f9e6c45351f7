"""Getting runs going: expansion of a launched plan into runs, the capacity they may take
(per executor, per plan, within the plan's budget), dispatch, offers to a pool's agents, and
the job each run is handed (its command, environment, files and working folder).

The database is the truth and a queue message only a nudge: every function here can run
twice, or after a lost message, and leaves the same rows behind.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from marin_site.doors import Door
from marin_site.errors import DomainError
from marin_site.events import Verb
from marin_site.invalidation import rows_changed
from marin_site.nudges import nudge
from runs.executors import (
    ExecutorError,
    JobSpec,
    executor_unavailable,
    get_executor,
    is_pull_executor,
    pool_name,
)
from runs.executors.code import Checkout, CodeError, checkout_materialize
from runs.executors.pool import PoolExecutor
from runs.models import FailureKind, Plan, PlanLaunch, Run, RunEvent, RunState
from runs.pools import wakeup
from runs.services.runs import run_event_record, run_transition, runs_save
from runs.specs.commands import (
    SECRET_JOB_ENV,
    CommandError,
    Filled,
    Launch,
    RunValues,
    command_fill,
)
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
    events = RunEvent.objects.bulk_create(
        RunEvent.build(
            run=run,
            verb=Verb.CACHED if run.state == RunState.FINISHED else Verb.QUEUED,
            door=Door.WORKER,
            to_state=run.state,
            created_at=now,
        )
        for run in created
    )
    rows_changed(Run, created)  # bulk writes: the pages showing them are told here
    rows_changed(RunEvent, events)
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
        begun, held, hours = _run_begin(run, launch, to_offer)
        if not held:
            continue
        started += begun  # a plan's runs trained by one job all began: the others find none
        capacity.executor_running[run.executor] = (
            capacity.executor_running.get(run.executor, 0) + held
        )
        capacity.plan_running[run.plan_id] = capacity.plan_running.get(run.plan_id, 0) + held
        capacity.plan_spent[run.plan_id] = spent + hours
    started += _runs_offer(to_offer)
    for reason, run_ids in waiting.items():
        changed = (
            Run.objects.filter(pk__in=run_ids, state=RunState.QUEUED)
            .exclude(state_reason=reason)
            .update(state_reason=reason)
        )
        if changed:  # the reason shows on the run's page; a tick that changes none bumps none
            rows_changed(Run, run_ids)
    return started


def _run_begin(run: Run, launch: PlanLaunch, to_offer: list[Run]) -> tuple[list[int], int, float]:
    """Start a run the limits let start (or, for a pool, put it in ``to_offer``); with
    ``launch.trainings: plan``, every queued run of its plan as one job. Says which runs
    started, how many slots they hold and their accelerator-hours (0 slots: none began)."""
    together = (launch.launch_options or {}).get("trainings") == "plan"
    if together and not is_pull_executor(run.executor):
        group = runs_start_together(plan_id=run.plan_id)
        hours = sum(Run.objects.filter(pk__in=group).values_list("accelerator_hours", flat=True))
        return group, len(group), float(hours)
    if is_pull_executor(run.executor):
        to_offer.append(run)  # offered in bulk by the caller: agents lease them
        return [], 1, run.accelerator_hours
    if run_start(run_id=run.pk) is not None:
        return [run.pk], 1, run.accelerator_hours
    return [], 0, 0.0


def _runs_offer(runs: list[Run]) -> list[int]:
    """Offer queued runs to their pools' agents, a few statements per pool however many
    runs (a 256-run plan is offered in one UPDATE, one bulk insert of events and one
    NOTIFY), inside the dispatcher's transaction, each with what an agent leasing it will
    be told filled in already (``run_offer_prepare``). A plan whose command template cannot
    be filled goes through ``run_start``, which fails its runs saying why."""
    broken: set[int] = set()
    launches: dict[int, tuple[str, dict[str, Any], dict[str, Any]]] = {}
    for plan_id, template, options, snapshot in PlanLaunch.objects.filter(
        plan_id__in={run.plan_id for run in runs}
    ).values_list("plan_id", "command_template", "launch_options", "plan__recipe_snapshot"):
        launches[plan_id] = (template, options or {}, (snapshot or {}).get("default_config") or {})
    for first in {run.plan_id: run for run in runs}.values():
        template, options, defaults = launches[first.plan_id]
        try:
            run_command(
                run=first,
                python=PYTHON_PLACEHOLDER,
                template=template,
                options=options,
                default_config=defaults,
            )
        except DomainError:
            broken.add(first.plan_id)
    offered: list[int] = []
    by_executor: dict[str, list[Run]] = {}
    for run in runs:
        if run.plan_id in broken:
            run_start(run_id=run.pk)
        else:
            by_executor.setdefault(run.executor, []).append(run)
    now = timezone.now()
    for executor, group in by_executor.items():
        pool = pool_name(executor)
        run_ids = [run.pk for run in group]
        ids = set(
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
        chosen = [run for run in group if run.pk in ids]
        for run in chosen:
            run.dispatched_at = run.updated_at = now
            run.state_reason = f"waiting for an agent of pool '{pool}'"
            run.offer = run_offer_prepare(run=run, launch=launches[run.plan_id])
        runs_save(chosen, {"dispatched_at", "state_reason", "updated_at", "offer"})
        events = RunEvent.objects.bulk_create(
            (
                RunEvent.build(
                    run_id=pk, verb=Verb.OFFERED, door=Door.WORKER, message=f"offered to {executor}"
                )
                for pk in ids
            ),
            batch_size=500,
        )
        rows_changed(RunEvent, events)  # runs_save told the runs' pages
        wakeup.work_offered(pool)
        offered += sorted(ids)
    return offered


# Where a prepared offer holds the run's token: only its hash is ever stored (``runs.tokens``),
# so the token goes in when the run is leased.
TOKEN_SLOT = "\x00run token\x00"  # noqa: S105  (a placeholder, not a secret)
TOKEN_SLOT_JSON = orjson.dumps(TOKEN_SLOT)[1:-1].decode()


def run_offer_job(*, run: Run, filled: Filled, env: dict[str, str]) -> dict[str, Any]:
    """What an agent leasing the run's current attempt is told of its job, the same
    whichever agent leases it (``leases._offer`` adds the run's and the lease's parts)."""
    return {
        "argv": filled.argv,
        "python_placeholder": PYTHON_PLACEHOLDER,
        "env": {**env, **filled.env},
        "files": {"config.json": run_config_file(run=run)},
    }


def run_offer_prepare(*, run: Run, launch: tuple[str, dict[str, Any], dict[str, Any]]) -> str:
    """The run's ``offer``: the command to record and ``run_offer_job``, with the attempt and
    commit they were filled for, as JSON text with ``TOKEN_SLOT`` where the token goes; ""
    if the command cannot be filled (the lease fills it, and says why)."""
    template, options, defaults = launch
    env = {
        name: TOKEN_SLOT if name in SECRET_JOB_ENV else value
        for name, value in run_job_env(run=run).items()
    }
    try:
        filled = run_command(
            run=run,
            python=PYTHON_PLACEHOLDER,
            template=template,
            options=options,
            default_config=defaults,
            env=env,
        )
    except DomainError:
        return ""
    command = shlex.join(filled.shown)
    if TOKEN_SLOT in command:
        return ""  # never recorded: the lease fills it with the token shown as $RUN_TOKEN
    job = run_offer_job(run=run, filled=filled, env=env)
    prepared = {"attempt": run.attempt, "git_sha": run.git_sha, "command": command, "job": job}
    return orjson.dumps(prepared).decode()


def run_workdir(*, run: Run) -> Path:
    return Path(settings.RUNS_WORK_DIR) / f"run-{run.pk}" / f"attempt-{run.attempt}"


PYTHON_PLACEHOLDER = "{python}"  # in an agent's argv: the agent fills in its own Python


def run_name(*, run: Run, scale: str = "") -> str:
    """The name of the run's tracker run (W&B): the recipe, the scale, the run's id."""
    return "-".join(part for part in (run.recipe_name, scale, f"run{run.pk}") if part)


def run_output_root(*, run: Run) -> str:
    """Where the run writes its outputs (checkpoints): the same on every attempt, so a
    preempted run's next attempt resumes. Under ``RUNS_OUTPUT_ROOT`` when set (e.g. a
    bucket), else beside the run's local working folders."""
    if root := settings.RUNS_OUTPUT_ROOT:
        return f"{root.rstrip('/')}/{run.recipe_name}/run-{run.pk}"
    return os.path.join(settings.RUNS_WORK_DIR, f"run-{run.pk}", "output")  # a lease batch: cheap


def run_values(
    *, run: Run, python: str, env: dict[str, str], default_config: dict[str, Any] | None = None
) -> RunValues:
    entry = run.entry
    return RunValues(
        run_id=run.pk,
        config=run.config,
        default_config=default_config or {},
        python=python,
        config_path="config.json",
        run_name=run_name(run=run, scale=entry.scale),
        scale=entry.scale,
        seed=entry.seed,
        version=run.recipe_version,
        attempt=run.attempt,
        git_sha=run.git_sha,
        output_root=run_output_root(run=run),
        env=env,
    )


def run_command(
    *,
    run: Run,
    python: str = sys.executable,
    template: str | None = None,
    options: dict[str, Any] | None = None,
    default_config: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    dry_run: bool = False,
) -> Filled:
    """The run's command filled (``runs.specs.commands``), from its launch's command and
    launch options (``template`` and ``options``: those, read already), its recipe's
    ``default_config`` (read from its plan when not given) and the job's ``env``
    (``run_job_env``, when not given): the argv to execute, the argv to show and record
    (secrets as ``$NAME``), and the environment it adds."""
    if template is None or options is None:
        launch = PlanLaunch.objects.get(plan_id=run.plan_id)
        template, options = launch.command_template, launch.launch_options
    try:
        launch_options = Launch.from_data(options or {})
        defaults: dict[str, Any] = {}
        if launch_options.overrides != "config_file":
            if default_config is None:
                snapshot = Plan.objects.values_list("recipe_snapshot", flat=True).get(
                    pk=run.plan_id
                )
                default_config = snapshot.get("default_config") or {}
            defaults = dict(default_config)
        values = run_values(
            run=run,
            python=python,
            env=run_job_env(run=run) if env is None else env,
            default_config=defaults,
        )
        return command_fill(
            template=template, launch=launch_options, values=values, dry_run=dry_run
        )
    except CommandError as exc:
        raise DomainError(f"The recipe's command template cannot be filled: {exc}") from exc


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
        "RUN_NAME": run_name(run=run, scale=run.entry.scale),
        "RUN_OUTPUT_ROOT": run_output_root(run=run),
        # A stock MLflow client reports to this run unchanged (runs/mlflow/).
        "MLFLOW_TRACKING_URI": settings.RUNS_MLFLOW_TRACKING_URI,
        "MLFLOW_TRACKING_TOKEN": token,
        "MLFLOW_EXPERIMENT_ID": str(run.plan_id),
    }


def run_config_file(*, run: Run) -> str:
    return json.dumps(run.config, indent=2, sort_keys=True)


def run_job_spec(*, run: Run, code_dir: Path | None = None) -> JobSpec:
    secrets = {name: value for name in settings.RUNS_SECRET_ENV if (value := _env(name))}
    filled = run_command(run=run)
    return JobSpec(
        job_id=f"run-{run.pk}-attempt-{run.attempt}",
        argv=filled.argv,
        workdir=run_workdir(run=run),
        env={**run_job_env(run=run), **filled.env, **secrets},
        files={"config.json": run_config_file(run=run)},
        time_limit_seconds=run.time_limit_seconds,
        code_dir=code_dir,
        resources=dict(run.plan.recipe_snapshot.get("resources") or {}),
    )


def run_checkout(*, run: Run) -> Checkout | None:
    """The clean checkout of the run's pinned commit, made (or found) before its job is
    submitted, with the full SHA and the tree's cleanness recorded on the run; None when the
    launch pinned no commit of a repository. A commit that does not exist fails the run with
    that reason (CodeError raised); any other problem (the repository unreachable) is
    raised as an ExecutorError, so the reconciler tries again."""
    repository = (
        PlanLaunch.objects.filter(plan_id=run.plan_id)
        .values_list("git_repository", flat=True)
        .first()
    )
    if not repository or not run.git_sha:
        return None
    try:
        checkout = checkout_materialize(repository=repository, ref=run.git_sha)
    except CodeError as exc:
        if "does not exist" in str(exc) or "is not a git ref" in str(exc):
            run_transition(
                run_id=run.pk,
                to_state=RunState.FAILED,
                failure_kind=FailureKind.CONFIG,
                door=Door.WORKER,
                message=f"{exc}; nothing was submitted",
            )
            raise
        raise ExecutorError(str(exc)) from exc
    Run.objects.filter(pk=run.pk).update(git_sha=checkout.sha, git_clean=checkout.clean)
    run.git_sha, run.git_clean = checkout.sha, checkout.clean
    rows_changed(Run, [run])  # the commit shows on the run's page
    return checkout


def _env(name: str) -> str:
    return os.environ.get(name, "")


def run_start(*, run_id: int, submit: bool = True) -> Run | None:
    """Move a queued run to running and submit its job once the transaction commits
    (``submit=False``: the caller submits it, with the others of its job)."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        if run.state != RunState.QUEUED or run.cancel_requested_at is not None:
            return None
        try:
            command = run_command(run=run).shown
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
        if submit:
            transaction.on_commit(lambda: run_submit(run_id=run_id), robust=True)
        return run


MANIFEST_FILE = "trainings.json"


def runs_start_together(*, plan_id: int) -> list[int]:
    """Start every queued run of a plan whose recipe trains them in one job
    (``launch.trainings: plan``): each moves to running, and the first (the job's leader)
    submits the one job after commit, with a manifest of them all (``run_manifest``)."""
    ids = list(
        Run.objects.select_for_update()
        .filter(
            plan_id=plan_id,
            state=RunState.QUEUED,
            cancel_requested_at__isnull=True,
            dispatched_at__isnull=True,
        )
        .order_by("entry__index", "sequence")
        .values_list("pk", flat=True)
    )
    started = []
    for run_id in ids:
        run = run_start(run_id=run_id, submit=False)
        if run is not None and run.state == RunState.RUNNING:
            started.append(run_id)
    if started:
        leader, members = started[0], started
        transaction.on_commit(lambda: run_submit(run_id=leader, members=members), robust=True)
    return started


def run_manifest(*, runs: list[Run]) -> dict[str, Any]:
    """The manifest of a job that trains several planned runs: for each, its own id, token
    and tracker run name, so each training reports into its own run; and how a training
    reports its end (a run that reports none takes the job's end)."""
    return {
        "version": 1,
        "api_url": settings.RUNS_API_URL,
        "report_end": (
            "each training reports its own end: POST {api_url}runs/{run_id}/status/ with "
            'Authorization: Bearer {token} and {"state": "finished"} (or "failed" with a '
            "failure_kind); a run that reported none takes the job's end"
        ),
        "trainings": [
            {
                "run_id": run.pk,
                "token": run_token(run=run),
                "attempt": run.attempt,
                "run_name": run_name(run=run, scale=run.entry.scale),
                "scale": run.entry.scale,
                "seed": run.entry.seed,
                "output_root": run_output_root(run=run),
                "config": run.config,
            }
            for run in runs
        ],
    }


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


def run_submit(*, run_id: int, members: list[int] | None = None) -> str:
    """Hand a running run's job to its executor; submitting twice starts one job. A job
    that trains several runs (``members``, the run first among them) gets their manifest,
    and each of them gets the job's external id, so each is settled from the job."""
    run = Run.objects.filter(pk=run_id, state=RunState.RUNNING).select_related("entry").first()
    if run is None or run.cancel_requested_at is not None:
        return ""  # canceled before its job started: the reconciler marks it killed
    executor = get_executor(run.executor)
    if members is None and (
        PlanLaunch.objects.filter(plan_id=run.plan_id, launch_options__trainings="plan").exists()
    ):  # resubmitted by the reconciler: the job still trains the runs it started with
        members = list(
            Run.objects.filter(
                plan_id=run.plan_id, state=RunState.RUNNING, external_id=""
            ).values_list("pk", flat=True)
        )
    together = list(
        Run.objects.filter(pk__in=members or [run_id], state=RunState.RUNNING)
        .select_related("entry")
        .order_by("entry__index", "sequence")
    )
    try:
        checkout = run_checkout(run=run)
        spec = run_job_spec(run=run, code_dir=checkout.path if checkout else None)
        if members:
            manifest = json.dumps(run_manifest(runs=together), indent=2, sort_keys=True)
            spec = dataclasses.replace(
                spec,
                files={**spec.files, MANIFEST_FILE: manifest},
                secret_files=frozenset({MANIFEST_FILE}),  # it holds every run's token
                env={**spec.env, "RUN_MANIFEST": MANIFEST_FILE},
            )
        external_id = executor.submit(spec)
    except CodeError:
        return ""  # the run failed, saying which commit does not exist
    except ExecutorError as exc:
        logger.warning("submitting run %s failed: %s", run_id, exc)
        # The job was not taken for any run it trains: they wait together, saying why.
        for waiting_id in [r.pk for r in together] if members else [run_id]:
            run_requeue_unsubmitted(run_id=waiting_id, reason=str(exc))
        return ""
    ids = [r.pk for r in together] if members else [run_id]
    updated = Run.objects.filter(
        pk__in=ids, state=RunState.RUNNING, cancel_requested_at__isnull=True
    ).update(external_id=external_id)
    if members and checkout is not None:
        Run.objects.filter(pk__in=ids).update(git_sha=checkout.sha, git_clean=checkout.clean)
    rows_changed(Run, ids)  # the job and the commit show on the runs' pages
    if not updated:
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
