"""Leases: how an agent holds one run at a time, and what happens when it stops holding it.

The lease is the truth about who executes a run. An agent leases one offered run at a time
(``SELECT ... FOR UPDATE SKIP LOCKED``, so 200 agents asking at once each get a different
run without waiting for one another), renews the lease while the job runs, and reports how
it ended. A lease that is not renewed in time is lost: its run goes back to ``queued`` as
the same run with the next attempt (and is offered again at once, keeping its slot), and
anything the old lease or its job says afterwards is refused with 409. Each lease and its
run are locked together, so a renewal and an expiry, or a report and a revocation, never
both win.
"""

from __future__ import annotations

import shlex
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from marin_site.errors import ActionForbidden, DomainError
from marin_site.input import InputRefused
from marin_site.input import clean_text as policy_text
from marin_site.invalidation import rows_changed
from runs.models import FailureKind, Run, RunState
from runs.pools import handout, wakeup
from runs.pools.models import Agent, Lease, LeaseEnd, Pool

REPORT_OUTCOMES = ("exited", "preempted", "canceled", "time_limit", "start_failed")


class LeaseGone(DomainError):
    """The lease ended (lost, revoked, reported, settled): its holder may no longer act (409)."""

    status_code = 409


class LeaseNotFound(DomainError):
    status_code = 404


class LogTooLarge(DomainError):
    status_code = 413


def clean_text(value: Any, field: str, *, max_length: int, required: bool = False) -> str:
    if value is None:
        value = ""
    try:
        value = policy_text(value, field=field)
    except InputRefused as exc:
        raise ValidationError({field: [exc.message]}) from None
    if any(ord(c) < 32 and c not in "\t\n\r" for c in value) or "\x7f" in value:
        raise ValidationError({field: ["must not contain control characters"]})
    if required and not value:
        raise ValidationError({field: ["is required"]})
    if len(value) > max_length:
        raise ValidationError({field: [f"is at most {max_length} characters"]})
    return value


def _lease_seconds() -> int:
    return int(settings.RUNS_AGENT_LEASE_SECONDS)


def _run_requeue(*, run_id: int, attempt: int, message: str, actor_label: str = "") -> Run:
    """The attempt held by a lease is over without an ending of its own (lost, revoked,
    abandoned, preempted): the same run goes back to the queue with the next attempt and is
    offered to the pool again at once, keeping its slot; after its last attempt it fails."""
    from marin_site.doors import Door
    from runs.services.runs import run_transition

    run = Run.objects.select_for_update().get(pk=run_id)
    if run.state != RunState.RUNNING or run.attempt != attempt:
        return run  # settled already, by its own report or another door
    if run.cancel_requested_at is not None:
        return run_transition(
            run_id=run_id,
            to_state=RunState.KILLED,
            door=Door.AGENT,
            actor_label=actor_label,
            message=f"stopped on request ({message})",
        )
    run_transition(
        run_id=run_id,
        to_state=RunState.PREEMPTED,
        failure_kind=FailureKind.PREEMPTED,
        door=Door.AGENT,
        actor_label=actor_label,
        message=message,
    )
    if run.attempt >= run.max_attempts:
        return run_transition(
            run_id=run_id,
            to_state=RunState.FAILED,
            failure_kind=FailureKind.PREEMPTED,
            door=Door.WORKER,
            message=f"preempted or lost on each of its {run.max_attempts} attempts",
        )
    pool = Pool.objects.filter(name=run.executor.removeprefix("pool:")).first()
    offer = pool is not None and pool.retired_at is None
    run = run_transition(
        run_id=run_id,
        to_state=RunState.QUEUED,
        door=Door.WORKER,
        message=f"attempt {run.attempt + 1} of {run.max_attempts}"
        + (f"; offered to {run.executor} again" if offer else ""),
        changes={"dispatched_at": timezone.now()} if offer else None,
    )
    if offer and pool is not None:
        wakeup.work_offered(pool.name)
    return run


def _lease_close(lease: Lease, *, reason: str, outcome: dict[str, Any] | None = None) -> None:
    lease.ended_at = timezone.now()
    lease.end_reason = reason
    fields = ["ended_at", "end_reason"]
    if outcome is not None:
        lease.outcome = outcome
        fields.append("outcome")
    lease.save(update_fields=fields)


def lease_end_and_requeue(*, lease_id: int, reason: str, message: str) -> bool:
    """End an open lease and requeue its run (lost, revoked, abandoned); False if it had
    ended already, or (for a lost lease) was renewed meanwhile."""
    with transaction.atomic():
        lease = Lease.objects.select_for_update().select_related("agent").get(pk=lease_id)
        if lease.ended_at is not None:
            return False
        if reason == LeaseEnd.LOST and lease.expires_at > timezone.now():
            return False  # renewed between the look and the lock
        _lease_close(lease, reason=reason)
        _run_requeue(
            run_id=lease.run_id,
            attempt=lease.attempt,
            message=f"{message} (lease {lease.pk}, attempt {lease.attempt})",
            actor_label=lease.agent.label,
        )
    return True


def lease_expire(*, lease_id: int) -> bool:
    """A lease not renewed in time is lost; its run is requeued. True if it was expired now."""
    lease = Lease.objects.select_related("agent").filter(pk=lease_id).first()
    if lease is None:
        return False
    silent = (timezone.now() - lease.renewed_at).total_seconds()
    return lease_end_and_requeue(
        lease_id=lease_id,
        reason=LeaseEnd.LOST,
        message=f"lease lost: {lease.agent.label} silent for {silent:.0f} s",
    )


def leases_expire_stale(*, pool: Pool | None = None) -> int:
    """Expire every open lease past its time (of one pool, or all); the reconciler and each
    agent's poll call this, so a dead agent's run is back in the queue soon after its lease."""
    stale = Lease.objects.filter(ended_at__isnull=True, expires_at__lte=timezone.now())
    if pool is not None:
        stale = stale.filter(agent__pool=pool)
    return sum(lease_expire(lease_id=pk) for pk in list(stale.values_list("pk", flat=True)[:500]))


def _offered_to(pool: Pool) -> Any:
    runs = Run.objects.filter(
        executor=pool.executor,
        state=RunState.QUEUED,
        dispatched_at__isnull=False,
        cancel_requested_at__isnull=True,
    )
    if pool.recipes:
        runs = runs.filter(recipe_name__in=pool.recipes)
    return runs


@dataclass(frozen=True)
class _Launch:
    """What a live launch of the pool's plans says about running one of its runs."""

    template: str
    labels: list[str]  # the labels its runs require
    options: dict[str, Any]
    git_repository: str
    default_config: dict[str, Any]  # the recipe's defaults (a command with flags lists them)


def _launches(pool: Pool) -> dict[int, _Launch]:
    """The pool's live launches, by plan id (one query, their plans' defaults with them)."""
    from runs.models import PlanLaunch

    launches = PlanLaunch.objects.filter(
        executor=pool.executor, canceled_at__isnull=True, finished_at__isnull=True
    ).values_list(
        "plan_id",
        "command_template",
        "requires_labels",
        "launch_options",
        "git_repository",
        "plan__recipe_snapshot",
    )
    return {
        plan_id: _Launch(
            template=template,
            labels=labels or [],
            options=options or {},
            git_repository=repository or "",
            default_config=dict((snapshot or {}).get("default_config") or {}),
        )
        for plan_id, template, labels, options, repository, snapshot in launches
    }


def _by_plans_barred(
    *, pool: Pool, agents: list[Agent], launches: dict[int, _Launch]
) -> dict[frozenset[int], list[Agent]]:
    """The agents grouped by the plans whose runs they may not lease: plans launched with
    ``requires_labels`` that neither the pool's labels nor the agent's own include. Most
    pools make one group, barred from nothing."""
    needs = {plan_id: set(launch.labels) for plan_id, launch in launches.items() if launch.labels}
    groups: dict[frozenset[int], list[Agent]] = {}
    for agent in agents:
        have = set(pool.labels or []) | set(agent.labels or [])
        barred = frozenset(plan_id for plan_id, need in needs.items() if not need <= have)
        groups.setdefault(barred, []).append(agent)
    return groups


def _leases_create(*, pairs: list[tuple[Agent, Run]]) -> list[Lease]:
    """The lease rows of (agent, run) pairs, leaving out the agents that hold an open lease
    already (two polls of one agent at once: its partial unique index refuses the second).
    On PostgreSQL one INSERT ... ON CONFLICT DO NOTHING; elsewhere one INSERT, or, when it
    is refused, one INSERT per pair in a savepoint of its own."""
    now = timezone.now()
    expires = now + timedelta(seconds=_lease_seconds())

    def row(agent: Agent, run: Run) -> Lease:
        return Lease(run=run, agent=agent, attempt=run.attempt, renewed_at=now, expires_at=expires)

    if connection.vendor == "postgresql":
        return _leases_insert(pairs=pairs, row=row)

    try:
        with transaction.atomic():
            return Lease.objects.bulk_create([row(agent, run) for agent, run in pairs])
    except IntegrityError:
        created = []
        for agent, run in pairs:
            try:
                with transaction.atomic():
                    lease = row(agent, run)
                    lease.save(force_insert=True)
                    created.append(lease)
            except IntegrityError:
                continue  # the other poll of this agent won
        return created


def _leases_insert(
    *, pairs: list[tuple[Agent, Run]], row: Callable[[Agent, Run], Lease]
) -> list[Lease]:
    """``_leases_create`` on PostgreSQL: one statement, no savepoint, the rows as arrays."""
    leases = [row(agent, run) for agent, run in pairs]
    first = leases[0]
    first.created_at = first.renewed_at
    table = Lease._meta.db_table
    by_name = {f.name: f for f in Lease._meta.concrete_fields}
    fields = [by_name[name] for name in ("run", "agent", "attempt")]
    same = [
        by_name[name]
        for name in ("created_at", "renewed_at", "expires_at", "end_reason", "outcome", "log_tail")
    ]
    columns = ", ".join(f'"{f.column}"' for f in [*fields, *same])
    arrays = ", ".join(f"%s::{f.db_type(connection)}[]" for f in fields)
    values = ", ".join("%s" for _ in same)
    params: list[Any] = [f.get_db_prep_save(getattr(first, f.attname), connection) for f in same]
    params += [[getattr(lease, f.attname) for lease in leases] for f in fields]
    with connection.cursor() as cursor:
        cursor.execute(
            f'INSERT INTO "{table}" ({columns}) SELECT v.*, {values} '  # noqa: S608
            f"FROM unnest({arrays}) AS v ON CONFLICT DO NOTHING RETURNING id, agent_id",
            params,
        )
        ids = {agent_id: pk for pk, agent_id in cursor.fetchall()}
    created = []
    for lease in leases:
        if lease.agent_id in ids:
            lease.pk, lease.created_at = ids[lease.agent_id], first.created_at
            lease._state.adding = False
            created.append(lease)
    return created


# What a grant reads of an offered run (its move to running and its agent's answer): the
# runs' other columns (config, results, tracker data) are not decoded for it. Its job was
# filled when it was offered; a run whose job is filled now reads its config and entry then.
_GRANT_READS = (
    "plan_id",
    "recipe_name",
    "recipe_version",
    "config_hash",
    "state",
    "git_sha",
    "executor",
    "attempt",
    "max_attempts",
    "time_limit_seconds",
    "started_at",
    "offer",
)


def _job_of(run: Run, launch: _Launch | None) -> tuple[str, str, dict[str, Any]]:
    """The command to record, the token and the job (``dispatch.run_offer_job``) of a run
    being leased: from its offer, prepared when it was offered, with the token put in; or,
    for an attempt or a commit other than the offer's (a requeued run), filled now."""
    from runs.services.dispatch import (
        PYTHON_PLACEHOLDER,
        TOKEN_SLOT_JSON,
        run_command,
        run_job_env,
        run_offer_job,
    )
    from runs.tokens import run_token

    token = run_token(run=run)
    if run.offer:
        prepared = orjson.loads(run.offer.replace(TOKEN_SLOT_JSON, token))
        if (prepared["attempt"], prepared["git_sha"]) == (run.attempt, run.git_sha):
            return prepared["command"], token, prepared["job"]
    env = run_job_env(run=run)
    filled = run_command(
        run=run,
        python=PYTHON_PLACEHOLDER,
        template=launch.template if launch else None,
        options=launch.options if launch else None,
        default_config=launch.default_config if launch else None,
        env=env,
    )
    return shlex.join(filled.shown), token, run_offer_job(run=run, filled=filled, env=env)


def leases_grant(
    *,
    pool: Pool,
    agents: list[Agent],
    on_commit: Callable[[dict[int, Lease]], None] | None = None,
) -> dict[int, Lease]:
    """Lease the oldest runs offered to ``pool``, one to each of ``agents`` (agents of the
    pool, in the order given), in one transaction of a few statements however many agents:
    the pool's launches, ``SELECT ... FOR UPDATE SKIP LOCKED`` (leaders of other processes
    get other runs without waiting; one per group of agents with other labels), one INSERT
    of the lease rows, and the runs' move to running by ``runs_transition`` (the rules of
    ``run_transition``, each with its timeline event). Answers {agent id: lease}; agents
    left without a run are not in it. Each lease carries its agent's answer, built here
    (``Lease.answer``, the JSON of ``lease_offer``), so the poll that gets it writes it
    without a query. ``on_commit`` is called with the same answer once the leases are
    committed, before the transitions' own after-commit work (their signals), so a waiting
    poll gets its lease without waiting for that."""
    from marin_site.doors import Door
    from runs.services.runs import Move, runs_transition
    from runs.tokens import token_hash as run_token_hash

    if not agents:
        return {}
    by_id = {agent.pk: agent for agent in agents}
    with transaction.atomic():
        launches = _launches(pool)
        pairs: list[tuple[Agent, Run]] = []
        taken: list[int] = []  # SKIP LOCKED skips other transactions' locks, not this one's
        for barred, group in _by_plans_barred(pool=pool, agents=agents, launches=launches).items():
            runs = list(
                _offered_to(pool)
                .exclude(plan_id__in=barred)
                .exclude(pk__in=taken)
                .only(*_GRANT_READS)
                .select_for_update(skip_locked=True, of=("self",))
                .order_by("dispatched_at", "pk")[: len(group)]
            )
            pairs += zip(group, runs, strict=False)
            taken += [run.pk for run in runs]
        if not pairs:
            return {}
        granted: dict[int, Lease] = {}
        if on_commit is not None:
            transaction.on_commit(lambda: on_commit(granted))
        created = _leases_create(pairs=pairs)
        moves, jobs = [], []  # the run's part of an answer is made from the locked run
        for lease in created:
            agent, run = by_id[lease.agent_id], lease.run
            command, token, job = _job_of(run, launches.get(run.plan_id))
            jobs.append(job)
            moves.append(
                Move(
                    run.pk,
                    message=f"leased by {agent.label} of pool {pool.name} (lease {lease.pk})",
                    actor_label=agent.label,
                    changes={
                        "external_id": lease.external_id,
                        "command": command,
                        "token_hash": run_token_hash(token),
                        "output_path": "",
                        "secret_env_names": [],
                        "offer": "",  # told to its agent now
                    },
                )
            )
        moved = runs_transition(
            moves=moves,
            to_state=RunState.RUNNING,
            door=Door.AGENT,
            locked={run.pk: run for _agent, run in pairs},
        )
        for lease, run, job in zip(created, moved, jobs, strict=True):
            lease.agent, lease.run = by_id[lease.agent_id], run
            launch = launches.get(run.plan_id)
            repository = launch.git_repository if launch else _git_repository(run.plan_id)
            offer = _offer(lease=lease, run=run, job=job, git_repository=repository)
            lease.answer = orjson.dumps(offer)
            granted[lease.agent_id] = lease
    return granted


def _git_repository(plan_id: int) -> str:
    from runs.models import PlanLaunch

    launch = PlanLaunch.objects.filter(plan_id=plan_id).values_list("git_repository", flat=True)
    return launch.first() or ""


def lease_acquire(*, agent: Agent) -> Lease | None:
    """Lease the oldest run offered to the agent's pool, or None when there is none."""
    return leases_grant(pool=agent.pool, agents=[agent]).get(agent.pk)


def lease_abandon_held(*, agent: Agent) -> int:
    """An agent asks for work only when it runs nothing: a lease it still holds (it restarted,
    or lost its job) is over, and its run goes back to the queue."""
    held = list(agent.leases.filter(ended_at__isnull=True).values_list("pk", flat=True))
    for lease_id in held:
        lease_end_and_requeue(
            lease_id=lease_id,
            reason=LeaseEnd.ABANDONED,
            message=f"{agent.label} asked for new work while holding this run",
        )
    return len(held)


_swept: dict[str, float] = {}  # pool -> when this process last expired its stale leases


def _expire_stale_if_due(pool: Pool) -> None:
    """Expire the pool's stale leases, at most once per re-check interval in this process:
    a dead agent's run is back in the queue within seconds of its lease's end, and a poll
    does not pay for the look every time (the reconciler looks too)."""
    now = time.monotonic()
    if now - _swept.get(pool.name, -1e9) < float(settings.RUNS_AGENT_RECHECK_SECONDS):
        return
    _swept[pool.name] = now
    leases_expire_stale(pool=pool)


def lease_wait(*, agent: Agent, wait_seconds: float) -> Lease | None:
    """The long poll: lease a run now, or wait up to ``wait_seconds`` (capped by
    RUNS_AGENT_POLL_SECONDS) for one to be offered. The first look is for this poll alone;
    then it waits, holding no database connection, at its pool's desk in this process
    (``runs.pools.handout``): a wake-up wakes one waiting poll, which leases runs for the
    waiting polls in batches and hands them out; a poll that hears nothing leads a look for
    the desk at its re-check (every RUNS_AGENT_RECHECK_SECONDS, once per process)."""
    pool = agent.pool.name
    hold = max(0.0, min(float(wait_seconds), float(settings.RUNS_AGENT_POLL_SECONDS)))
    deadline = time.monotonic() + hold
    recheck = float(settings.RUNS_AGENT_RECHECK_SECONDS)
    lease_abandon_held(agent=agent)
    _expire_stale_if_due(agent.pool)
    wakeup.generation(pool)  # listening before the first look: a later offer wakes the desk

    def grant(agents: list[Agent], deliver: Callable[[dict[int, Lease]], None]) -> Any:
        return leases_grant(pool=agent.pool, agents=agents, on_commit=deliver)

    waiter = handout.join(pool, agent)
    try:
        missed = handout.look_alone(pool, waiter, grant)
        first = True
        while waiter.lease is None:
            if (missed or not first) and handout.take_lead(
                pool, waiter, recheck=recheck, asked=missed
            ):
                handout.lead(pool, waiter, grant)
            first = missed = False
            remaining = deadline - time.monotonic()
            if waiter.lease is not None or remaining <= 0:
                break
            wakeup.slot_release()  # 200 waiting agents hold no database connection
            waiter.event.wait(min(remaining, recheck))
            if waiter.lease is None:  # it leads, looks again or answers 204: a slot again
                wakeup.slot_take()
            # A lease handed over comes with its answer built: the poll writes it and is
            # done, with no query, so it takes no slot (a hundred woken polls would queue
            # for the process's few slots only to write their answers).
    finally:
        lease: Lease | None = handout.leave(pool, waiter)  # a lease handed out is never dropped
    return lease


def lease_offer(*, lease: Lease) -> dict[str, Any]:
    """What the agent needs to execute the leased run. Only this run's token; never the
    site's own secrets (the job inherits the agent's environment for its own)."""
    from runs.models import PlanLaunch
    from runs.services.dispatch import (
        PYTHON_PLACEHOLDER,
        run_command,
        run_job_env,
        run_offer_job,
    )

    run = lease.run
    launch = PlanLaunch.objects.only("command_template", "launch_options", "git_repository").get(
        plan_id=run.plan_id
    )
    env = run_job_env(run=run)
    filled = run_command(
        run=run,
        python=PYTHON_PLACEHOLDER,
        template=launch.command_template,
        options=launch.launch_options,
        env=env,
    )
    job = run_offer_job(run=run, filled=filled, env=env)
    return _offer(lease=lease, run=run, job=job, git_repository=launch.git_repository)


def lease_answer(*, lease: Lease) -> bytes:
    """The JSON answer of the poll that got ``lease``: built by ``leases_grant`` when it
    leased it, else here (``lease_offer``)."""
    if lease.answer is not None:
        return lease.answer
    return orjson.dumps(lease_offer(lease=lease))


def _offer(*, lease: Lease, run: Run, job: dict[str, Any], git_repository: str) -> dict[str, Any]:
    """The whole answer: the lease, the run, and its job (``dispatch.run_offer_job``) with
    the lease's own part (the archive of the pinned code)."""
    from runs.executors.code import import_paths

    code = {}
    if git_repository and run.git_sha:  # the agent runs the pinned commit's source
        code = {
            "ref": run.git_sha,
            "archive": f"/api/v1/agent/leases/{lease.pk}/code/",
            "paths": import_paths(git_repository),  # what goes on PYTHONPATH
        }
    return {
        "lease": {
            "id": lease.pk,
            "expires_at": lease.expires_at.isoformat(),
            "seconds": _lease_seconds(),
            "renew_every": max(1.0, _lease_seconds() / 4),
        },
        "run": {
            "id": run.pk,
            "attempt": run.attempt,
            "max_attempts": run.max_attempts,
            "plan": run.plan_id,
            "recipe": run.recipe_name,
            "recipe_version": run.recipe_version,
            "config_hash": run.config_hash,
            "git_sha": run.git_sha,
            "time_limit_seconds": run.time_limit_seconds,
            "url": f"{settings.SITE_URL}{run.get_absolute_url()}",
        },
        "job": {
            **job,
            "grace_seconds": settings.RUNS_AGENT_GRACE_SECONDS,
            "code": code,
        },
    }


def lease_code(*, agent: Agent, lease_id: int) -> Path:
    """The source archive of the leased run's pinned commit, for the agent holding the
    lease (``git archive`` of the site's mirror, made once per commit). The run records the
    full SHA and that its tree is clean (an archive of a commit is). A commit that does not
    exist fails the run, and the agent is told its lease is over."""
    from runs.executors.code import CodeError, archive_path, commit_resolve
    from runs.models import PlanLaunch
    from runs.services.runs import run_transition

    with transaction.atomic():
        lease = _lease_for(agent=agent, lease_id=lease_id)
        run = lease.run
    repository = (
        PlanLaunch.objects.filter(plan_id=run.plan_id)
        .values_list("git_repository", flat=True)
        .first()
    )
    if not repository or not run.git_sha:
        raise LeaseNotFound(f"The run of lease {lease_id} pins no commit: it runs no archive.")
    try:
        sha = commit_resolve(repository=repository, ref=run.git_sha)
    except CodeError as exc:
        if "does not exist" not in str(exc) and "is not a git ref" not in str(exc):
            raise DomainError(f"The pinned code cannot be had now: {exc}") from exc
        from marin_site.doors import Door

        with transaction.atomic():
            Lease.objects.filter(pk=lease_id, ended_at__isnull=True).update(
                ended_at=timezone.now(), end_reason=LeaseEnd.SETTLED
            )
            run_transition(
                run_id=run.pk,
                to_state=RunState.FAILED,
                failure_kind=FailureKind.CONFIG,
                door=Door.AGENT,
                message=f"{exc}; nothing was started",
            )
        raise LeaseGone(f"{exc}: the run failed and lease {lease_id} is over.") from exc
    Run.objects.filter(pk=run.pk).update(git_sha=sha, git_clean=True)
    rows_changed(Run, [run.pk])  # the commit shows on the run's page
    return archive_path(repository=repository, sha=sha)


def _lease_for(*, agent: Agent, lease_id: int) -> Lease:
    """The agent's own lease, locked; 404, 403 (another agent's) or 409 (over) otherwise.
    An open lease past its time is expired here (committed) before the 409."""
    lease = Lease.objects.select_for_update().filter(pk=lease_id).first()
    if lease is None:
        raise LeaseNotFound(f"No lease {lease_id}.")
    if lease.agent_id != agent.pk:
        raise ActionForbidden("This lease belongs to another agent.")
    if lease.ended_at is not None:
        raise LeaseGone(f"Lease {lease.pk} ended ({lease.end_reason}); its run is no longer yours.")
    return lease


def _refuse_if_expired(*, agent: Agent, lease_id: int) -> None:
    with transaction.atomic():
        lease = _lease_for(agent=agent, lease_id=lease_id)
        expired = lease.expires_at <= timezone.now()
    if expired:
        lease_expire(lease_id=lease_id)
        raise LeaseGone(f"Lease {lease_id} expired before it was renewed; its run was requeued.")


def lease_renew(*, agent: Agent, lease_id: int, log_tail: str | None = None) -> dict[str, Any]:
    """The agent's heartbeat: the lease runs ``RUNS_AGENT_LEASE_SECONDS`` more, the run's
    heartbeat is now, and the answer says whether the run should stop."""
    if log_tail is not None:
        log_tail = log_tail_check(log_tail)
    _refuse_if_expired(agent=agent, lease_id=lease_id)
    with transaction.atomic():
        lease = _lease_for(agent=agent, lease_id=lease_id)
        if lease.expires_at <= timezone.now():  # expired between the two looks
            raise LeaseGone(f"Lease {lease_id} expired before it was renewed.")
        now = timezone.now()
        lease.renewed_at = now
        lease.expires_at = now + timedelta(seconds=_lease_seconds())
        fields = ["renewed_at", "expires_at"]
        if log_tail is not None:
            lease.log_tail = log_tail
            fields.append("log_tail")
        lease.save(update_fields=fields)
        # A heartbeat is shown nowhere: no page to tell (marin_site.invalidation).
        Run.objects.filter(pk=lease.run_id, state=RunState.RUNNING).update(heartbeat_at=now)
        run = Run.objects.only("state", "cancel_requested_at").get(pk=lease.run_id)
    return {
        "lease": lease.pk,
        "expires_at": lease.expires_at.isoformat(),
        "run_state": run.state,
        "cancel_requested": run.cancel_requested_at is not None,
    }


def log_tail_check(text: Any, field: str = "log_tail") -> str:
    if not isinstance(text, str):
        raise ValidationError({field: ["must be a string"]})
    size = len(text.encode("utf-8", errors="replace"))
    cap = int(settings.RUNS_AGENT_LOG_TAIL_BYTES)
    if size > cap:
        raise LogTooLarge(f"{field} is {size} bytes; send at most the last {cap} bytes.")
    return text.replace("\x00", "\ufffd")


@dataclass(frozen=True)
class LeaseReport:
    """How an agent says its job ended: the evidence, not a guess."""

    outcome: str
    exit_code: int | None = None
    signal: int | None = None
    oom_kills: int | None = None  # the cgroup's oom_kill counter's increase; None: unreadable
    cgroup: str = ""
    message: str = ""
    log_tail: str | None = None


def lease_report_parse(*, data: Any) -> LeaseReport:
    """Check a report body; 400 naming the field, 413 for an oversized log tail."""
    if not isinstance(data, dict):
        raise ValidationError({"non_field_errors": ["send a JSON object"]})
    unknown = sorted(set(data) - set(LeaseReport.__dataclass_fields__))
    if unknown:
        raise ValidationError({unknown[0][:64]: ["unknown field"]})
    outcome = data.get("outcome")
    if outcome not in REPORT_OUTCOMES:
        raise ValidationError({"outcome": [f"must be one of {', '.join(REPORT_OUTCOMES)}"]})

    def small_int(field: str, low: int, high: int) -> int | None:
        value = data.get(field)
        if value is None:
            return None
        if type(value) is not int or not low <= value <= high:
            raise ValidationError({field: [f"must be an integer from {low} to {high}, or null"]})
        return value

    exit_code = small_int("exit_code", -255, 255)
    sig = small_int("signal", 1, 64)
    oom_kills = small_int("oom_kills", 0, 2**31)
    if outcome == "exited" and exit_code is None and sig is None:
        raise ValidationError({"exit_code": ["an exited job needs its exit_code or signal"]})
    if exit_code is not None and exit_code < 0:  # Popen's spelling of "died of a signal"
        sig, exit_code = sig or -exit_code, None
    log_tail = data.get("log_tail")
    return LeaseReport(
        outcome=outcome,
        exit_code=exit_code,
        signal=sig,
        oom_kills=oom_kills,
        cgroup=clean_text(data.get("cgroup"), "cgroup", max_length=300),
        message=clean_text(data.get("message"), "message", max_length=2_000),
        log_tail=None if log_tail is None else log_tail_check(log_tail),
    )


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def lease_report_classify(report: LeaseReport) -> tuple[str, str, str]:
    """The run's next state, failure kind and message, from the evidence in the report.

    A SIGKILL is put down to the OOM killer only when the cgroup's oom_kill counter rose
    during the job; otherwise it is what it is: killed from outside. A SIGTERM that the
    agent did not send is a preemption (the machine is going away), as is the agent's own
    stop when it was told to stop (SIGTERM to the agent)."""
    extra = f": {report.message}" if report.message else ""
    if report.outcome == "preempted":
        return RunState.PREEMPTED, FailureKind.PREEMPTED, f"the agent was stopped{extra}"
    if report.outcome == "canceled":
        return RunState.KILLED, FailureKind.NONE, f"stopped on request{extra}"
    if report.outcome == "time_limit":
        return RunState.FAILED, FailureKind.TIMEOUT, f"the time limit was reached{extra}"
    if report.outcome == "start_failed":
        return RunState.FAILED, FailureKind.INFRA, f"the agent could not start the job{extra}"
    if report.signal is not None:
        name = _signal_name(report.signal)
        where = f" in {report.cgroup}" if report.cgroup else ""
        if report.signal == signal.SIGKILL:
            if report.oom_kills:
                return (
                    RunState.FAILED,
                    FailureKind.OOM,
                    f"killed by the kernel's OOM killer (oom_kill +{report.oom_kills}{where}){extra}",
                )
            evidence = (
                "no OOM kill was counted" + where
                if report.oom_kills == 0
                else "the agent could read no OOM counter"
            )
            return (
                RunState.KILLED,
                FailureKind.NONE,
                f"killed by SIGKILL from outside ({evidence}){extra}",
            )
        if report.signal == signal.SIGTERM:
            return (
                RunState.PREEMPTED,
                FailureKind.PREEMPTED,
                f"ended by SIGTERM from outside{extra}",
            )
        if report.signal in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
            return RunState.KILLED, FailureKind.NONE, f"ended by {name} from outside{extra}"
        return RunState.FAILED, FailureKind.CODE, f"the job died of {name}{extra}"
    if report.exit_code == 0:
        return RunState.FINISHED, FailureKind.NONE, report.message
    if report.exit_code == 2:
        return RunState.FAILED, FailureKind.CONFIG, f"the job refused its config (exit 2){extra}"
    return RunState.FAILED, FailureKind.CODE, f"the job exited with {report.exit_code}{extra}"


def lease_report(*, agent: Agent, lease_id: int, report: LeaseReport) -> Run:
    """The agent's last word on a lease: end it and settle the run from the evidence. A
    run that already ended by its own report keeps that ending. A lease that expired or
    ended is refused (409): its run belongs to someone else now."""
    from marin_site.doors import Door
    from runs.services.runs import run_transition

    _refuse_if_expired(agent=agent, lease_id=lease_id)
    to_state, failure_kind, message = lease_report_classify(report)
    with transaction.atomic():
        lease = _lease_for(agent=agent, lease_id=lease_id)
        run = Run.objects.select_for_update().get(pk=lease.run_id)
        outcome = {
            "outcome": report.outcome,
            "exit_code": report.exit_code,
            "signal": report.signal,
            "oom_kills": report.oom_kills,
            "cgroup": report.cgroup,
            "message": report.message,
            "classified_as": to_state,
        }
        if report.log_tail is not None:
            lease.log_tail = report.log_tail
            lease.save(update_fields=["log_tail"])
        ended_here = run.state == RunState.RUNNING and run.attempt == lease.attempt
        _lease_close(
            lease,
            reason=LeaseEnd.PREEMPTED if to_state == RunState.PREEMPTED else LeaseEnd.EXITED,
            outcome=outcome,
        )
        if not ended_here:
            return run
        if to_state == RunState.PREEMPTED:
            return _run_requeue(
                run_id=run.pk, attempt=lease.attempt, message=message, actor_label=agent.label
            )
        return run_transition(
            run_id=run.pk,
            to_state=to_state,
            failure_kind=failure_kind,
            door=Door.AGENT,
            actor_label=agent.label,
            message=message,
        )


def run_reconcile_leased(*, run_id: int) -> Run:
    """The reconciler's look at a running run of a pool: an expired lease is lost (the run is
    requeued); a run past its time limit fails (its agent, told 409, stops the job); a run
    with no open lease (its lease ended but did not settle it) is requeued."""
    from marin_site.doors import Door
    from runs.services.runs import run_transition

    run = Run.objects.get(pk=run_id)
    if run.state != RunState.RUNNING:
        return run
    lease = Lease.objects.filter(run_id=run_id, ended_at__isnull=True).first()
    if lease is None:
        with transaction.atomic():
            return _run_requeue(
                run_id=run_id, attempt=run.attempt, message="no agent holds its lease"
            )
    if lease.expires_at <= timezone.now():
        lease_expire(lease_id=lease.pk)
        return Run.objects.get(pk=run_id)
    slack = settings.RUNS_AGENT_GRACE_SECONDS + 60  # the agent stops it first
    if timezone.now() - lease.created_at > timedelta(seconds=run.time_limit_seconds + slack):
        with transaction.atomic():
            locked = Lease.objects.select_for_update().get(pk=lease.pk)
            if locked.ended_at is None:
                _lease_close(locked, reason=LeaseEnd.SETTLED)
            return run_transition(
                run_id=run_id,
                to_state=RunState.FAILED,
                failure_kind=FailureKind.TIMEOUT,
                door=Door.WORKER,
                message=f"still running after its time limit of {run.time_limit_seconds} s",
            )
    return run
