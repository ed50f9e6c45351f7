"""External runs: a queued run claimed by a person to execute by hand, elsewhere.

The author of the approved proposal (or a maintainer) claims a queued run of its plan; the
run moves to ``running`` on the ``external`` executor, marked with who claimed it and where
they say it runs, and the claimant gets the exact command, the resolved config and the run's
token (shown once; only its hash is kept). The run then reports through the same API as any
other, with the same limits. A config it reports whose hash differs from the plan's resolved
config is recorded and flagged on the run, never silently taken for the planned one. A
claim that cannot be finished is given back: the same run returns to the queue, on its next
attempt, for the plan's own executor.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from marin_site.doors import Door
from marin_site.errors import ActionForbidden, TransitionNotAllowed
from marin_site.events import Verb
from runs import permissions as run_perms
from runs.executors.external import EXTERNAL
from runs.executors.external import PREFIX as EXTERNAL_PREFIX
from runs.models import FailureKind, PlanLaunch, Run, RunOrigin, RunState
from runs.services.dispatch import run_command, run_config_file, run_job_env
from runs.services.runs import run_event_record, run_transition
from runs.specs.ablation import config_hash
from runs.tokens import run_token, token_hash

Actor = User | AnonymousUser | None


@dataclass(frozen=True)
class Claim:
    """What the claimant needs, once: the token is never shown again."""

    run: Run
    token: str
    command: str
    env: dict[str, str]
    config_file: str


def _require(actor: Actor, run: Run, what: str) -> User:
    if not isinstance(actor, User) or not actor.has_perm(run_perms.CLAIM_RUN, run):
        raise ActionForbidden(
            f"You may not {what} (permission '{run_perms.CLAIM_RUN}': a maintainer, or the "
            "author of the approved proposal whose plan this run belongs to)."
        )
    return actor


def _where(text: Any) -> str:
    if not isinstance(text, str):
        raise ValidationError({"where": ["must be a string"]})
    text = text.strip()
    if any(ord(c) < 32 for c in text):
        raise ValidationError({"where": ["must be one line, without control characters"]})
    if not text:
        raise ValidationError({"where": ["say where it will run (e.g. 'our lab, 8×A100')"]})
    if len(text) > 200:
        raise ValidationError({"where": ["is at most 200 characters"]})
    return text


def run_claim(*, run_id: int, actor: Actor, where: Any, door: str = Door.WEB) -> Claim:
    """Claim a queued run to execute it by hand; refuses a run that is not queued (409)."""
    clean_where = _where(where)
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        user = _require(actor, run, "claim this run")
        launch = PlanLaunch.objects.filter(plan_id=run.plan_id).first()
        if run.state != RunState.QUEUED or run.cancel_requested_at is not None:
            raise TransitionNotAllowed(
                action="claim a run", current=run.state, allowed=[RunState.QUEUED]
            )
        if launch is None or launch.canceled_at is not None:
            raise TransitionNotAllowed(
                action="claim a run of a canceled plan", current="canceled", allowed=[]
            )
        filled = run_command(run=run, python="python3")
        argv = filled.shown
        token = run_token(run=run)
        run = run_transition(
            run_id=run_id,
            to_state=RunState.RUNNING,
            door=door,
            actor=user,
            message=f"claimed by {user.get_username()} to run elsewhere: {clean_where}",
            changes={
                "executor": EXTERNAL,
                "origin": RunOrigin.CLAIMED,
                "external_id": f"{EXTERNAL_PREFIX}claim-{run.pk}-by-{user.pk}-attempt-{run.attempt}",
                "command": shlex.join(argv),
                "token_hash": token_hash(token),
                "dispatched_at": timezone.now(),
                "output_path": "",
                "secret_env_names": [],
                "claimed_by": user,
                "claimed_at": timezone.now(),
                "claim_where": clean_where,
                "heartbeat_timeout_seconds": max(
                    run.heartbeat_timeout_seconds, settings.RUNS_CLAIM_HEARTBEAT_TIMEOUT_SECONDS
                ),
            },
        )
    env = {**run_job_env(run=run), **filled.env}
    exports = " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items() if value)
    return Claim(
        run=run,
        token=token,
        command=f"{exports} {shlex.join(argv)}",
        env=env,
        config_file=run_config_file(run=run),
    )


def run_claim_release(*, run_id: int, actor: Actor, door: str = Door.WEB) -> Run:
    """Give a claimed run back: the same run returns to the queue, on its next attempt,
    for the plan's own executor. Its token stops working (409 for anything it sends)."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        user = _require(actor, run, "give this run back")
        if run.executor != EXTERNAL or run.state != RunState.RUNNING:
            raise TransitionNotAllowed(
                action="give back a run", current=run.state, allowed=[RunState.RUNNING]
            )
        if run.claimed_by_id != user.pk and not user.has_perm(run_perms.CANCEL_RUN, run):
            raise ActionForbidden("Only whoever claimed the run, or a maintainer, gives it back.")
        launch = PlanLaunch.objects.get(plan_id=run.plan_id)
        run_transition(
            run_id=run_id,
            to_state=RunState.PREEMPTED,
            failure_kind=FailureKind.PREEMPTED,
            door=door,
            actor=user,
            message=f"given back by {user.get_username()}",
        )
        return run_transition(
            run_id=run_id,
            to_state=RunState.QUEUED,
            door=door,
            actor=user,
            message=f"attempt {run.attempt + 1} of {run.max_attempts}, for {launch.executor}",
            changes={"executor": launch.executor, "claimed_by": None, "claim_where": ""},
        )


def run_report_config(*, run: Run, config: Any) -> Run:
    """The config a running run says it used: its hash is kept, and a difference from the
    plan's resolved config is flagged on the run's timeline and page."""
    if not isinstance(config, dict):
        raise ValidationError({"config": ["must be a JSON object"]})
    reported = config_hash(config)
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.state != RunState.RUNNING:
            raise TransitionNotAllowed(
                action="report a config", current=locked.state, allowed=[RunState.RUNNING]
            )
        if locked.reported_config_hash == reported:
            return locked
        locked.reported_config_hash = reported
        locked.save(update_fields=["reported_config_hash", "updated_at"])
        if reported != locked.config_hash:
            run_event_record(
                run=locked,
                verb=Verb.CONFIG_MISMATCH,
                door=Door.RUNNER,
                actor_label="runner",
                message=(
                    f"the run reports config {reported[:12]}, not the plan's {locked.config_hash[:12]}"
                ),
            )
        return locked
