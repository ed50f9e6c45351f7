"""MLflow's tracking calls mapped onto plans and runs.

Who may do what:

- anonymous: read (experiments, runs, metric history), as every run is public;
- a run token (``MLFLOW_TRACKING_TOKEN=$RUN_TOKEN``): write its own run only. ``runs/create``
  with it answers that run (in its plan, or in MLflow's default experiment "0"), so a stock
  ``mlflow.start_run()`` in a job the site launched reports to the job's run;
- a maintainer's API token: ``runs/create`` in a launched plan claims the plan's next queued
  run (or the one tagged ``marin.run_id``) as executed elsewhere (executor ``external``);
  maintainers may write any run and delete (hide from MLflow's searches) runs.

Experiments are plans and are not created through MLflow: ``experiments/create`` answers
RESOURCE_ALREADY_EXISTS for ``plan-<id>`` and refuses other names, saying why.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone
from rest_framework.authtoken.models import Token

from marin_site.doors import Door
from marin_site.errors import DomainError
from marin_site.events import Verb
from marin_site.roles import is_maintainer
from runs import tokens
from runs.alerts.services import alerts_not_finite
from runs.executors.external import PREFIX as EXTERNAL_PREFIX
from runs.metrics import ingest
from runs.metrics import parse as metrics_parse
from runs.mlflow import protocol, selectors
from runs.mlflow.errors import (
    PERMISSION_DENIED,
    REQUEST_LIMIT_EXCEEDED,
    RESOURCE_ALREADY_EXISTS,
    RESOURCE_CONFLICT,
    RESOURCE_DOES_NOT_EXIST,
    UNAUTHENTICATED,
    MlflowError,
    invalid,
)
from runs.models import Plan, PlanLaunch, Run, RunEvent, RunOrigin, RunState
from runs.services import runs as run_writes
from runs.services.dispatch import plan_expand
from runs.trackers import reports as tracker_reports

DOOR = Door.MLFLOW
RUN_TOKEN = re.compile(r"^r(\d{1,19})\.[0-9a-f]{64}$")


@dataclass(frozen=True)
class Caller:
    """Who sent a request: a run's token, a user's API token, or nobody."""

    run_id: int | None = None
    user: User | None = None

    @property
    def label(self) -> str:
        return "runner (MLflow)" if self.run_id is not None else ""


def caller_from_token(token: str) -> Caller:
    """The caller a bearer token names; UNAUTHENTICATED for a token that names nobody."""
    match = RUN_TOKEN.match(token)
    if match:
        run_id = int(match.group(1))
        run = Run.objects.filter(pk=run_id).only("pk", "token_hash").first()
        if run is not None and tokens.run_token_matches(run=run, token=token):
            return Caller(run_id=run_id)
        raise MlflowError(UNAUTHENTICATED, "This run token is not valid (or not any more).")
    found = Token.objects.select_related("user").filter(key=token[:40]).first()
    if found is None or found.key != token or not found.user.is_active:
        raise MlflowError(UNAUTHENTICATED, "This token is not valid.")
    return Caller(user=found.user)


def _writable_run(caller: Caller, run_id: int, *, lock: bool = False) -> Run:
    if caller.run_id is None and caller.user is None:
        raise MlflowError(
            UNAUTHENTICATED,
            "Writes need a token: set MLFLOW_TRACKING_TOKEN to the run's token "
            "(RUN_TOKEN) or to a maintainer's API token.",
        )
    rows = Run.objects.select_for_update() if lock else Run.objects.all()
    run = rows.filter(pk=run_id).first()
    if run is None:
        raise MlflowError(RESOURCE_DOES_NOT_EXIST, f"Run with id={run_id} not found")
    if caller.run_id is not None and caller.run_id != run.pk:
        raise MlflowError(
            PERMISSION_DENIED, f"This run token belongs to run {caller.run_id}, not run {run.pk}."
        )
    if caller.run_id is not None:
        _run_token_may_write(run)
    if caller.user is not None and not is_maintainer(caller.user):
        raise MlflowError(PERMISSION_DENIED, "Only maintainers write runs with an API token.")
    if run.tracker_deleted_at is not None:
        raise invalid(f"The run {run.pk} must be in the 'active' state. Current state is deleted.")
    return run


def _run_token_may_write(run: Run) -> None:
    """The rule of every runner door (``tokens.run_token_refusal``): an ended run's token
    writes nothing more (409), and a token expires with its run's time limit and grace (401)."""
    refusal = tokens.run_token_refusal(run=run, write=True)
    if refusal is not None:
        code = UNAUTHENTICATED if refusal.status_code == 401 else RESOURCE_CONFLICT
        raise MlflowError(code, refusal.message)


# --- experiments ---------------------------------------------------------------------------


def experiment_create(*, caller: Caller, name: str) -> str:
    """Plans are made by approving a proposal, never through MLflow. A job's own token gets
    its run's plan whatever name it asks for, so ``mlflow.set_experiment("any name")`` in
    a launched job keeps working; the name is kept as the run's tag ``marin.experiment_name``."""
    plan_id = selectors.experiment_plan_id(name)
    if plan_id is not None and Plan.objects.filter(pk=plan_id).exists():
        raise MlflowError(RESOURCE_ALREADY_EXISTS, f"Experiment(name={name}) already exists.")
    if caller.run_id is None and caller.user is None:
        raise MlflowError(UNAUTHENTICATED, "Writes need a token (MLFLOW_TRACKING_TOKEN).")
    if caller.run_id is not None:
        run = Run.objects.get(pk=caller.run_id)
        _run_token_may_write(run)
        tracker_reports.run_tracker_report(
            run_id=run.pk, tags={"marin.experiment_name": name[:500]}
        )
        return str(run.plan_id)
    raise invalid(
        f"marin-site cannot create the experiment '{name[:200]}': its experiments are the plans "
        "of approved proposals. Propose the experiment on the site, or log to an existing "
        f"plan with mlflow.set_experiment(NAME), NAME being {selectors.EXPERIMENT_NAMES}."
    )


# --- runs ----------------------------------------------------------------------------------


def run_create(
    *,
    caller: Caller,
    experiment_id: Any,
    tags: list[tuple[str, str]],
    run_name: str,
) -> dict[str, Any]:
    if caller.run_id is None and caller.user is None:
        raise MlflowError(
            UNAUTHENTICATED,
            "Creating a run needs a token: set MLFLOW_TRACKING_TOKEN to the run's token "
            "(RUN_TOKEN) or to a maintainer's API token.",
        )
    plan_id = (
        protocol.experiment_id_parse(experiment_id) if experiment_id not in (None, "") else None
    )
    tag_map = dict(tags)
    if run_name:
        tag_map["mlflow.runName"] = run_name
    if caller.run_id is not None:
        run = Run.objects.get(pk=caller.run_id)
        if plan_id is not None and plan_id != run.plan_id:
            raise MlflowError(
                PERMISSION_DENIED,
                f"This run token belongs to run {run.pk} of experiment {run.plan_id} "
                f"(plan-{run.plan_id}), not experiment {experiment_id}.",
            )
        _run_token_may_write(run)
        if run.state != RunState.RUNNING:
            raise invalid(f"Run {run.pk} is {run.state}; only a running run is reported to.")
    else:
        assert caller.user is not None
        if not is_maintainer(caller.user):
            raise MlflowError(PERMISSION_DENIED, "Only maintainers create runs with an API token.")
        if plan_id is None:
            raise MlflowError(
                RESOURCE_DOES_NOT_EXIST,
                f"No Experiment with id={experiment_id} exists: name a plan's id (plan-<id>).",
            )
        run = _claim(user=caller.user, plan_id=plan_id, wanted=tag_map.pop("marin.run_id", ""))
    if tag_map:
        tracker_reports.run_tracker_report(run_id=run.pk, tags=tag_map)
    ingest.run_sign_of_life(run_id=run.pk)  # MLflow clients send no heartbeats
    return selectors.run_get(run_id=run.pk)


def _claim(*, user: User, plan_id: int, wanted: str) -> Run:
    """A queued run of a launched plan, now running elsewhere (executor ``external``)."""
    launch = PlanLaunch.objects.filter(plan_id=plan_id).first()
    if launch is None:
        if not Plan.objects.filter(pk=plan_id).exists():
            raise MlflowError(RESOURCE_DOES_NOT_EXIST, f"No Experiment with id={plan_id} exists")
        raise invalid(f"Plan {plan_id} is not launched: approve its proposal first.")
    if launch.canceled_at is not None:
        raise invalid(f"Plan {plan_id} was canceled; its runs take no new work.")
    if launch.expanded_at is None:
        # Right after an approval the plan's runs may not exist yet (the expansion is a task
        # after commit): expand it here, once (plan_expand locks the launch and is idempotent).
        plan_expand(plan_id=plan_id)
    with transaction.atomic():
        queued = Run.objects.select_for_update(skip_locked=True).filter(
            plan_id=plan_id, state=RunState.QUEUED, cancel_requested_at__isnull=True
        )
        if wanted:
            if not (wanted.isascii() and wanted.isdecimal()) or len(wanted) > 18:
                raise invalid(f"The tag marin.run_id must be a run id, not {wanted[:40]!r}.")
            queued = queued.filter(pk=int(wanted))
        run = queued.order_by("entry__index", "sequence").first()
        if run is None:
            raise invalid(
                f"Plan {plan_id} has no queued run to claim"
                + (f" with id {wanted}" if wanted else "")
                + ": every run is running or done."
            )
        return run_writes.run_transition(
            run_id=run.pk,
            to_state=RunState.RUNNING,
            door=DOOR,
            actor=user,
            message="claimed through MLflow: executed elsewhere",
            changes={
                "executor": "external",
                "origin": RunOrigin.CLAIMED,
                "external_id": f"{EXTERNAL_PREFIX}run-{run.pk}-attempt-{run.attempt}",
                "token_hash": tokens.token_hash(tokens.run_token(run=run)),
                "dispatched_at": timezone.now(),
            },
        )


TERMINAL_BY_STATUS = {
    "FINISHED": RunState.FINISHED,
    "FAILED": RunState.FAILED,
    "KILLED": RunState.KILLED,
}


def run_update(
    *, caller: Caller, run_id: int, status: str, end_time: int | None, run_name: str
) -> dict[str, Any]:
    run = _writable_run(caller, run_id)
    if status and status not in protocol.STATUSES:
        raise invalid(
            f"Invalid value {status[:40]!r} for parameter 'status': one of "
            f"{', '.join(protocol.STATUSES)}."
        )
    if run_name:
        tracker_reports.run_tracker_report(run_id=run.pk, tags={"mlflow.runName": run_name})
    target = TERMINAL_BY_STATUS.get(status)
    current = protocol.RUN_STATUS.get(RunState(run.state))
    if target is not None and run.state != target:
        changes: dict[str, Any] = {}
        if end_time:
            changes["finished_at"] = _from_millis(end_time) or timezone.now()
        try:
            run_writes.run_transition(
                run_id=run.pk,
                to_state=target,
                door=DOOR,
                actor=caller.user,
                actor_label=caller.label,
                failure_kind="code" if target == RunState.FAILED else "",
                message=f"MLflow status {status}",
                changes=changes,
            )
        except DomainError as exc:
            raise invalid(f"Run {run.pk} cannot become {status}: {exc.message}") from exc
    elif status in {"RUNNING", "SCHEDULED"} and current not in {"RUNNING", "SCHEDULED"}:
        raise invalid(
            f"Run {run.pk} is {run.state}; a run that ended does not run again "
            "(rerun it on the site)."
        )
    else:
        ingest.run_sign_of_life(run_id=run.pk)  # MLflow clients send no heartbeats
    run.refresh_from_db()
    return protocol.run_info(run)


def _from_millis(value: int) -> datetime | None:
    seconds = value / 1000
    if not metrics_parse.EARLIEST <= seconds <= metrics_parse.LATEST:
        return None
    return datetime.fromtimestamp(seconds, tz=UTC)


def run_delete(*, caller: Caller, run_id: int) -> None:
    """Hide a run from MLflow's searches; the site keeps it (every run stays public). A run
    still going is canceled."""
    run = _writable_run(caller, run_id)
    if caller.user is None:
        raise MlflowError(
            PERMISSION_DENIED,
            "A run token cannot delete runs; a maintainer can (the site keeps them).",
        )
    with transaction.atomic():
        Run.objects.filter(pk=run.pk).update(tracker_deleted_at=timezone.now())
        run_writes.run_event_record(
            run=run,
            verb=Verb.MLFLOW_DELETED,
            door=DOOR,
            actor=caller.user,
            message="hidden from MLflow's searches",
        )
        if not run.is_terminal:
            run_writes.run_cancel(run_id=run.pk, actor=caller.user, door=DOOR)


def log_batch(
    *,
    caller: Caller,
    run_id: int,
    metric_items: list[protocol.MetricIn],
    params: list[tuple[str, str]],
    tags: list[tuple[str, str]],
) -> None:
    """Params, tags and metrics of one request, as MLflow would store them: what MLflow
    itself refuses (``protocol``) refuses the request; a metric MLflow stores but the site
    cannot (NaN, infinities, keys with spaces or over 200 characters, negative steps) is left
    out alone and noted once per key on the run's timeline; a key whose values do not fit its
    declaration is stored and flagged. MLflow's answer stays ``{}``."""
    run = _writable_run(caller, run_id)
    keys = [key for key, _ in params]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise invalid(
            f"Duplicate parameter keys have been submitted: {repeated}. Please ensure the "
            "request contains only one param value per param key."
        )
    batch, not_finite, unstorable = _points(metric_items)
    if len(batch) or not_finite or unstorable:
        if run.state != RunState.RUNNING:
            raise invalid(f"The run {run.pk} must be running to take metrics; it is {run.state}.")
        try:
            ingest.metrics_rate_check(run_id=run.pk)
        except ingest.RateLimited as exc:
            raise MlflowError(
                REQUEST_LIMIT_EXCEEDED, exc.message, retry_after=exc.retry_after
            ) from exc
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if params:
            _params_unchanged(locked, params)
        if params or tags:
            tracker_reports.run_tracker_report(
                run_id=run.pk, config=dict(params) or None, tags=dict(tags) or None
            )
        if len(batch):
            try:
                ingest.metrics_ingest_flagged(run=locked, batch=batch, door=DOOR)
            except ingest.NotRunning as exc:
                raise invalid(exc.message) from exc
        if not_finite:
            notes = {
                key: f"was not finite at step {step}: such values are not stored"
                for key, step in not_finite.items()
            }
            _note_once(locked, Verb.NOT_FINITE, notes, caller)
            alerts_not_finite(run=locked, first_steps=not_finite, door=DOOR)
        if unstorable:
            _note_once(locked, Verb.METRIC_REFUSED, unstorable, caller)
    if not len(batch):  # metrics_ingest counted the points as a sign of life already
        ingest.run_sign_of_life(run_id=run.pk, last=locked.heartbeat_at)


def _points(
    items: list[protocol.MetricIn],
) -> tuple[metrics_parse.PointBatch, dict[str, int], dict[str, str]]:
    """The storable points, the first step of each key whose value was not finite, and the
    keys the site cannot store at all (with why, for the timeline)."""
    keys: list[str] = []
    steps: list[int] = []
    values: list[float] = []
    times: list[float | None] = []
    not_finite: dict[str, int] = {}
    unstorable: dict[str, str] = {}
    for item in items:
        shown = item.key[:200]
        if not metrics_parse.METRIC_KEY.match(item.key):
            unstorable.setdefault(
                shown,
                "is not stored: marin-site stores metric keys of at most 200 letters, digits "
                "and _./@:+- (no spaces)",
            )
            continue
        if not 0 <= item.step < metrics_parse.MAX_STEP:
            unstorable.setdefault(
                shown, f"at step {item.step} is not stored: marin-site stores steps from 0"
            )
            continue
        if not math.isfinite(item.value):
            not_finite.setdefault(item.key, item.step)
            continue
        seconds = item.timestamp / 1000
        keys.append(item.key)
        steps.append(item.step)
        values.append(item.value)
        times.append(seconds if metrics_parse.EARLIEST <= seconds <= metrics_parse.LATEST else None)
    seen: dict[tuple[str, int], int] = {}
    for index, pair in enumerate(zip(keys, steps, strict=True)):
        seen[pair] = index  # the last of repeats wins, as in the native API
    if len(seen) != len(keys):
        kept = sorted(seen.values())
        keys, steps = [keys[i] for i in kept], [steps[i] for i in kept]
        values, times = [values[i] for i in kept], [times[i] for i in kept]
    return metrics_parse.PointBatch(keys, steps, values, times), not_finite, unstorable


def _params_unchanged(run: Run, params: list[tuple[str, str]]) -> None:
    """MLflow refuses to change a logged param; so does the site."""
    logged = dict(protocol.flat_params(run.tracker_config or {}))
    for key, value in params:
        if key in logged and logged[key] != value:
            raise invalid(
                "Changing param values is not allowed. Param with key="
                f"'{key}' was already logged with value='{logged[key][:500]}' for run "
                f"ID='{run.pk}'. Attempted logging new value '{value[:500]}'."
            )


def _note_once(run: Run, verb: Verb, messages: dict[str, str], caller: Caller) -> None:
    """A timeline row per key, its message the key then ``messages[key]``, once per run and
    key: a diverging run's page shows where it went, a key that cannot be stored is named."""
    noted = list(
        RunEvent.objects.filter(run_id=run.pk, verb=verb).values_list("message", flat=True)
    )
    for key, rest in messages.items():
        head = (key if metrics_parse.METRIC_KEY.match(key) else repr(key)) + " "
        if not any(message.startswith(head) for message in noted):
            run_writes.run_event_record(
                run=run,
                verb=verb,
                door=DOOR,
                actor=caller.user,
                actor_label=caller.label,
                message=head + rest,
            )


def tag_delete(*, caller: Caller, run_id: int, key: str) -> None:
    run = _writable_run(caller, run_id)
    if key not in (run.tracker_tags or {}):
        raise MlflowError(
            RESOURCE_DOES_NOT_EXIST, f"No tag with name: {key} in run with id {run.pk}"
        )
    tracker_reports.run_tracker_report(run_id=run.pk, untag=[key])
    ingest.run_sign_of_life(run_id=run.pk)  # MLflow clients send no heartbeats
