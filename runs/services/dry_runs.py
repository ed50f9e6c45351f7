"""Dry runs: a recipe's script in its plan-only mode, run as a CPU job before approval
(Marin's rule: review the full experiment's dry run and its cost before running it).

The command is the recipe's, filled as a run's would be, with the recipe's
``launch.dry_run`` arguments (``--dry_run true`` added, ``--run`` left out); it gets no run
token. What the script prints is kept (its tail) and read for what it says it would spend:
a line ``DRY_RUN {"steps": ..., "flops": ..., "cost": ...}`` (JSON), else the first
``steps``, ``FLOPs`` and ``cost`` figures it prints. The job goes to
``RUNS_DRY_RUN_EXECUTOR`` (local; ``iris`` on Marin's scheduler, as a small CPU job:
``DRY_RUN_RESOURCES``); the reconciler settles it. While that executor cannot take it (Iris
down, or backing off after a refusal) the dry run stays queued, saying why, and the
reconciler tries again; a submit cut short is found again by the job's name.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.db import transaction
from django.utils import timezone

from marin_site.errors import DomainError
from marin_site.fragments import versions_bump
from marin_site.nudges import nudge
from runs.executors import ExecutorError, JobSpec, JobState, get_executor
from runs.models import DryRun, DryRunState, Recipe
from runs.signals import dry_run_finished
from runs.specs.commands import CommandError, Launch, RunValues, command_fill
from runs.specs.compute import FormulaError, run_cost

logger = logging.getLogger(__name__)

OUTPUT_BYTES = 64 * 1024
# A scheduler's log lines may carry a prefix (a time, a task) before what the script printed.
MARKER = re.compile(r"(?:^|\s)DRY_RUN\s+(\{.*\})\s*$", re.MULTILINE)
# What a dry run asks of a scheduler (Iris): one CPU, no accelerator.
DRY_RUN_RESOURCES = {"cpu": 1}
NUMBER = r"([0-9][0-9,_]*(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)"
FIGURES = {
    "steps": re.compile(rf"{NUMBER}\s+(?:training\s+)?steps\b|\bsteps?\b\D{{0,20}}?{NUMBER}", re.I),
    "flops": re.compile(rf"\bflops\b\D{{0,20}}?{NUMBER}", re.IGNORECASE),
    "cost": re.compile(rf"\bcost\b[^0-9]{{0,20}}?{NUMBER}", re.IGNORECASE),
}


def dry_run_figures(output: str) -> dict[str, float]:
    """The steps, FLOPs and cost a dry run's output says it would spend (those it says)."""
    found: dict[str, float] = {}
    for match in MARKER.finditer(output):
        try:
            data = json.loads(match.group(1))
        except ValueError:
            continue
        if isinstance(data, dict):
            for key in FIGURES:
                value = data.get(key)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    found[key] = float(value)
    for key, pattern in FIGURES.items():
        if key not in found and (figure := pattern.search(output)):
            try:
                text = next(group for group in figure.groups() if group)
                found[key] = float(text.replace(",", "").replace("_", ""))
            except ValueError:
                continue
    return found


DRY_RUNS_KIND = "dry-runs"  # the fragments' version of a subject's dry runs


def dry_runs_dependency(subject: str) -> tuple[str, int] | None:
    """The version a page's fragment of ``subject``'s dry runs carries (``proposal-12``:
    ``("dry-runs:proposal", 12)``), or None for a subject no page shows."""
    kind, _, number = subject.rpartition("-")
    if not kind or not number.isdigit():
        return None
    return f"{DRY_RUNS_KIND}:{kind}", int(number)


def _changed(subject: str) -> None:
    """A dry run of ``subject`` changed: the pages that show it render it again."""
    if dependency := dry_runs_dependency(subject):
        versions_bump(dependency[0], [dependency[1]])


def _workdir(dry_run: DryRun) -> Path:
    return Path(settings.RUNS_WORK_DIR) / f"dry-run-{dry_run.pk}"


def dry_run_start(
    *,
    recipe: Recipe,
    config: dict[str, Any],
    subject: str,
    actor: User | AnonymousUser | None,
) -> DryRun:
    """Start the recipe's dry run of ``config`` for ``subject``; the job is submitted after
    commit. Refuses (400) a recipe whose command cannot be filled."""
    launch = Launch.from_data(recipe.launch or {})
    try:
        estimate = run_cost(recipe.compute_model, config)
        figures = {"flops": estimate.flops, "accelerator_hours": estimate.accelerator_hours}
    except (FormulaError, KeyError):
        figures = {}
    with transaction.atomic():
        dry_run = DryRun.objects.create(
            recipe=recipe,
            subject=subject[:100],
            config=config,
            executor=settings.RUNS_DRY_RUN_EXECUTOR,
            requested_by=actor if isinstance(actor, User) else None,
            estimate=figures,
        )
        try:
            filled = command_fill(
                template=recipe.command_template,
                launch=launch,
                values=_values(dry_run, recipe, config),
                dry_run=True,
            )
        except CommandError as exc:
            raise DomainError(f"The recipe's dry run cannot be filled: {exc}") from exc
        dry_run.command = shlex.join(filled.shown)
        dry_run.save(update_fields=["command"])
        _changed(dry_run.subject)
        nudge(
            "runs.dry_run_submit", dry_run_id=dry_run.pk
        )  # a worker starts it; else the reconciler
    return dry_run


def _values(dry_run: DryRun, recipe: Recipe, config: dict[str, Any]) -> RunValues:
    env = {
        "RUN_ID": "",
        "RUN_TOKEN": "",  # a dry run reports nothing: it has no token
        "RUN_API_URL": settings.RUNS_API_URL,
        "RUN_ATTEMPT": "1",
        "RUN_GIT_SHA": "",
        "RUN_GIT_REF": "",
        "RUN_NAME": f"{recipe.name}-dry-run{dry_run.pk}",
        "RUN_OUTPUT_ROOT": str(_workdir(dry_run) / "output"),
        "MLFLOW_TRACKING_URI": "",
        "MLFLOW_TRACKING_TOKEN": "",
        "MLFLOW_EXPERIMENT_ID": "",
    }
    return RunValues(
        run_id=0,
        config=config,
        default_config=recipe.default_config,
        python=sys.executable,
        run_name=env["RUN_NAME"],
        version=recipe.version,
        output_root=env["RUN_OUTPUT_ROOT"],
        env=env,
    )


def dry_run_submit(*, dry_run_id: int) -> str:
    dry_run = DryRun.objects.select_related("recipe").filter(pk=dry_run_id).first()
    if dry_run is None or dry_run.state != DryRunState.QUEUED:
        return ""
    recipe = dry_run.recipe
    values = _values(dry_run, recipe, dry_run.config)
    filled = command_fill(
        template=recipe.command_template,
        launch=Launch.from_data(recipe.launch or {}),
        values=values,
        dry_run=True,
    )
    spec = JobSpec(
        job_id=f"dry-run-{dry_run.pk}",
        argv=filled.argv,
        workdir=_workdir(dry_run),
        env={**values.env, **filled.env, "DRY_RUN": "1"},
        files={"config.json": json.dumps(dry_run.config, indent=2, sort_keys=True)},
        time_limit_seconds=settings.RUNS_DRY_RUN_TIME_LIMIT_SECONDS,
        resources=dict(DRY_RUN_RESOURCES),
    )
    executor = get_executor(dry_run.executor)
    try:
        if why := executor.unavailable():
            raise ExecutorError(why)
        external_id = executor.submit(spec)
    except ExecutorError as exc:
        logger.warning("submitting dry run %s failed: %s", dry_run_id, exc)
        DryRun.objects.filter(pk=dry_run_id, state=DryRunState.QUEUED).update(
            reason=f"waiting: {exc}"[:2000]
        )
        _changed(dry_run.subject)
        return ""
    DryRun.objects.filter(pk=dry_run_id, state=DryRunState.QUEUED).update(
        state=DryRunState.RUNNING, external_id=external_id, reason=""
    )
    _changed(dry_run.subject)
    return external_id


def dry_run_settle(*, dry_run_id: int) -> DryRun | None:
    """Bring a dry run in line with its job: its output, figures and end once it ended."""
    dry_run = DryRun.objects.filter(pk=dry_run_id).first()
    if dry_run is None or dry_run.state in (DryRunState.SUCCEEDED, DryRunState.FAILED):
        return dry_run
    if dry_run.state == DryRunState.QUEUED:
        dry_run_submit(dry_run_id=dry_run_id)
        return DryRun.objects.get(pk=dry_run_id)
    executor = get_executor(dry_run.executor)
    try:
        status = executor.poll(dry_run.external_id)
    except ExecutorError as exc:
        logger.warning("polling dry run %s failed: %s", dry_run_id, exc)
        return dry_run
    if not status.is_done:
        return dry_run
    try:
        output = executor.logs(dry_run.external_id, tail_bytes=OUTPUT_BYTES)
    except ExecutorError:
        output = ""
    ok = status.state == JobState.SUCCEEDED
    ended = DryRun.objects.filter(pk=dry_run_id, state=DryRunState.RUNNING).update(
        state=DryRunState.SUCCEEDED if ok else DryRunState.FAILED,
        reason="" if ok else (status.message or status.state)[:2000],
        output=output,
        figures=dry_run_figures(output),
        finished_at=timezone.now(),
    )
    if ended:  # the status comment says how it went (proposals listens)
        _changed(dry_run.subject)
        dry_run_finished.send_robust(sender=DryRun, dry_run_id=dry_run_id, subject=dry_run.subject)
    return DryRun.objects.get(pk=dry_run_id)


def dry_run_line(dry_run: DryRun) -> str:
    """A dry run in words, its figures beside the site's estimate (pages, status comments)."""
    said = []
    figures, estimate = dry_run.figures or {}, dry_run.estimate or {}
    if "steps" in figures:
        said.append(f"{figures['steps']:,.0f} steps")
    if "flops" in figures:
        said.append(f"{figures['flops']:.3g} FLOPs")
    if "cost" in figures:
        said.append(f"cost {figures['cost']:,.2f}")
    text = f"dry run {dry_run.pk}: {dry_run.state}"
    if said:
        text += " (" + ", ".join(said) + ")"
    site = []
    if "flops" in estimate:
        site.append(f"{estimate['flops']:.3g} FLOPs")
    if "accelerator_hours" in estimate:
        site.append(f"{estimate['accelerator_hours']:,.4g} accelerator-hours")
    if site:
        text += "; the site's estimate " + ", ".join(site)
    if dry_run.state in (DryRunState.FAILED, DryRunState.QUEUED) and dry_run.reason:
        text += f"; {dry_run.reason[:200]}"
    return text


def dry_runs_settle() -> int:
    """Settle every open dry run (the reconciler's pass); how many ended."""
    ended = 0
    open_ids = DryRun.objects.filter(state__in=[DryRunState.QUEUED, DryRunState.RUNNING])
    for dry_run_id in list(open_ids.values_list("pk", flat=True)):
        try:
            done = dry_run_settle(dry_run_id=dry_run_id)
        except Exception:
            logger.exception("settling dry run %s failed", dry_run_id)
            continue
        ended += int(done is not None and done.state != DryRunState.RUNNING)
    return ended
