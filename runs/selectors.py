"""Reads of runs/: recipes, a plan's entries and runs (public, failed ones included), the run a
runner's token opens, a run's tracker imports and declared metrics, and the dry runs asked
for a subject (a proposal) as its page shows them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db import connection
from django.db.models import Count, QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from marin_site.db import server_binding_cursor
from runs.metrics.declarations import MetricDeclaration, declarations_parse
from runs.models import (
    TERMINAL_RUN_STATES,
    DryRun,
    Plan,
    PlanEntry,
    Recipe,
    Run,
    TrackerImport,
)


def recipe_list(*, include_inactive: bool = False) -> QuerySet[Recipe]:
    recipes = Recipe.objects.annotate(plan_count=Count("plans"))
    return recipes if include_inactive else recipes.filter(is_active=True)


def plan_entries(*, plan: Plan) -> QuerySet[PlanEntry]:
    return plan.entries.order_by("index")


def run_list() -> QuerySet[Run]:
    """Every run, public: failed and killed ones included."""
    return Run.objects.select_related("entry").order_by("-pk")


def runner_run(*, run_id: int) -> Run | None:
    """The run a runner's request names, with just what its token check and the metrics
    door read (state, token hash, when it started, its time limit and last sign of life),
    the other fields deferred as ``.only()`` leaves them. Every metrics batch asks, so this
    is one plain query: Django builds the same SELECT through the ORM for 1.5 ms of CPU,
    this for 0.2 ms."""
    if not 0 < run_id < 2**63:  # a URL's digits can outgrow bigint
        return None
    with server_binding_cursor() as cursor:  # bound (and prepared) by PostgreSQL
        cursor.execute(_RUNNER_SELECT, [run_id])
        row = cursor.fetchone()
    if row is None:
        return None
    values = list(row)
    for at in _RUNNER_DATETIMES:
        values[at] = _aware(values[at])
    # The ORM's own constructor for a row (positional, in the model's field order): several
    # times cheaper than ``Run(**fields)``, which fills every other field with its default.
    return Run.from_db(connection.alias, _RUNNER_COLUMNS, values)


def runner_run_of(fields: dict[str, Any]) -> Run:
    """A run as ``runner_run`` loads it, from the same fields kept elsewhere."""
    return Run.from_db(connection.alias, _RUNNER_COLUMNS, [fields[c] for c in _RUNNER_COLUMNS])


_RUNNER_READS = {
    "id",
    "state",
    "token_hash",
    "attempt",
    "started_at",
    "time_limit_seconds",
    "heartbeat_at",
}
_RUNNER_COLUMNS = [f.attname for f in Run._meta.concrete_fields if f.attname in _RUNNER_READS]
_RUNNER_DATETIMES = [
    i for i, name in enumerate(_RUNNER_COLUMNS) if name in {"started_at", "heartbeat_at"}
]
_RUNNER_SELECT = f"SELECT {', '.join(_RUNNER_COLUMNS)} FROM {Run._meta.db_table} WHERE id = %s"  # noqa: S608


def _aware(value: datetime | str | None) -> datetime | None:
    """A datetime column of a raw query, as the ORM would give it."""
    if isinstance(value, str):  # SQLite hands back text for a raw query
        value = parse_datetime(value)
    if value is not None and timezone.is_naive(value):
        value = timezone.make_aware(value, UTC)
    return value


def run_detail(*, run_id: int) -> Run | None:
    return (
        Run.objects.select_related("entry", "plan")
        .prefetch_related("summaries", "events")
        .filter(pk=run_id)
        .first()
    )


def plan_runs(*, plan_id: int) -> QuerySet[Run]:
    return (
        Run.objects.filter(plan_id=plan_id)
        .select_related("entry")
        .order_by("entry__index", "sequence")
    )


def plan_in_flight(*, plan_id: int) -> bool:
    """Whether any run of the plan is still queued, running or preempted."""
    return Run.objects.filter(plan_id=plan_id).exclude(state__in=TERMINAL_RUN_STATES).exists()


def plan_results_pending(*, plan_id: int) -> str:
    """Why a plan's results are not in yet ("2 of 6 runs are not terminal"), or "" when
    every run has ended. A launch whose runs are not expanded yet is pending too."""
    from runs.models import PlanLaunch

    states = list(Run.objects.filter(plan_id=plan_id).values_list("state", flat=True))
    if not states:
        launch = PlanLaunch.objects.filter(plan_id=plan_id).first()
        if launch is not None and launch.expanded_at is None and launch.canceled_at is None:
            return "the plan's runs are not created yet"
        return ""
    open_runs = sum(1 for state in states if state not in TERMINAL_RUN_STATES)
    if not open_runs:
        return ""
    return f"{open_runs} of {len(states)} run{'s' if len(states) != 1 else ''} not terminal yet"


def run_tracker_imports(*, run_id: int) -> QuerySet[TrackerImport]:
    return TrackerImport.objects.filter(run_id=run_id).order_by("-created_at", "-pk")


def run_metric_declarations(*, run: Run) -> dict[str, MetricDeclaration]:
    """The declarations of the recipe (name and version) the run was made from."""
    recipe = Recipe.objects.filter(name=run.recipe_name, version=run.recipe_version).first()
    return declarations_parse(recipe.metrics if recipe else [])


DRY_RUN_OUTPUT_SHOWN = 4000  # characters of a dry run's output a page shows (its tail)


def subject_dry_runs(*, subject: str, limit: int = 3) -> list[dict[str, Any]]:
    """The latest dry runs asked for ``subject`` (``proposal-12``), newest first, as a page
    shows them: state, command, why it waits or failed, the output's tail, and each figure
    the script printed beside the site's own estimate of it."""
    shown = []
    for dry_run in DryRun.objects.filter(subject=subject).order_by("-pk")[:limit]:
        figures, estimate = dry_run.figures or {}, dry_run.estimate or {}
        rows = [
            ("Steps", _figure(figures.get("steps"), ",.0f"), ""),
            ("FLOPs", _figure(figures.get("flops"), ".3g"), _figure(estimate.get("flops"), ".3g")),
            ("Cost", _figure(figures.get("cost"), ",.2f"), ""),
            (
                "Accelerator-hours",
                "",
                _figure(estimate.get("accelerator_hours"), ",.4g"),
            ),
        ]
        shown.append(
            {
                "dry_run": dry_run,
                "figures": [row for row in rows if row[1] or row[2]],
                "output_tail": dry_run.output[-DRY_RUN_OUTPUT_SHOWN:],
            }
        )
    return shown


def _figure(value: Any, spec: str) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return ""
    return format(value, spec)


def recipe_author_dry_runs_allowed(*, recipe_id: int | None) -> bool:
    """Whether the author of a proposal of this recipe may start its dry run: the recipe
    runs (its executor, else ``RUNS_DEFAULT_EXECUTOR``, when its ``launch.executors`` allows
    it) on a pool that is not retired, may run the recipe and allows it
    (``Pool.author_dry_runs``). Elsewhere only a maintainer may."""
    from django.conf import settings

    from runs.pools.models import Pool
    from runs.validators import allowed_executors, pool_name

    row = (
        Recipe.objects.filter(pk=recipe_id).values_list("name", "executor", "launch").first()
        if recipe_id is not None
        else None
    )
    if row is None:
        return False
    name, executor, launch = row
    executor = executor or settings.RUNS_DEFAULT_EXECUTOR
    pool = pool_name(executor)
    allowed = allowed_executors(launch)
    if not pool or (allowed and executor not in allowed):
        return False
    found = Pool.objects.filter(name=pool, retired_at__isnull=True, author_dry_runs=True).first()
    return found is not None and found.may_run(name)
