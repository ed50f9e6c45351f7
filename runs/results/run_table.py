"""Reads behind the results pages: a plan's run table (state, progress, final metrics,
telemetry, the config as a diff against the baseline, links), sorted and grouped by any grid
axis, the chart keys, the scaling ladder, and the runs picked on the compare page.

Every builder costs a fixed number of queries whatever the number of runs: runs with their
entries in one, every run's metric summaries in one, the launch in one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cached_property
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from runs.metrics import display
from runs.metrics.declarations import MetricDeclaration, declarations_parse
from runs.metrics.declarations import logged_unit as declarations_logged
from runs.models import TERMINAL_RUN_STATES, Plan, PlanLaunch, Run, RunState
from runs.results import ladder, presentation, seeds
from runs.results.ladder import Ladder
from runs.results.summary import TABLE_KEYS
from runs.specs.ablation import canonical_json, flatten

# Charts drawn by default, in this order, when a run has reported them; others can be added.
CHART_KEYS_FIRST = (
    "train/loss",
    "eval/loss",
    "eval/paloma/macro_loss",
    "throughput/mfu",
    "throughput/tokens_per_second",
    "moe/drop_fraction",
)
DEFAULT_CHARTS = 8
SERIES_POINTS = 500
POLL_MILLISECONDS = 3000  # how often a page with active runs refreshes its table and charts
SUMMARY_WAIT_SECONDS = 600  # how long after its last run ended a page waits for the results
COMPARE_MAX_RUNS = 100
STATE_ORDER = {
    RunState.RUNNING: 0,
    RunState.PREEMPTED: 1,
    RunState.QUEUED: 2,
    RunState.FINISHED: 3,
    RunState.FAILED: 4,
    RunState.CRASHED: 5,
    RunState.KILLED: 6,
}
FIXED_SORTS = ("run", "state", "progress", "attempt")
# Columns shown only when asked for (``?columns=attempt,executor,run_seconds``): the default
# columns are the run, its config, state, progress and the recipe's declared metric columns,
# so the table fits a 1366-pixel screen; any other key with a value is offered too.
OPTIONAL_FIXED = ("attempt", "executor")
MAX_EXTRA_COLUMNS = 20


@dataclass
class RunRow:
    run: Run
    axes: dict[str, Any]
    changes: list[str]  # "key=value" against the baseline (runs.results.presentation)
    values: dict[str, float]
    metrics: list[tuple[str, float | None, MetricDeclaration]]  # the metric columns
    step: int | None
    total_steps: int | None
    job_url: str = ""

    @property
    def progress_percent(self) -> int | None:
        if self.step is None or not self.total_steps:
            return None
        return max(0, min(100, round(100 * self.step / self.total_steps)))

    @property
    def label(self) -> str:
        """The run's label, as the charts and the PNG show it."""
        entry = self.run.entry
        return presentation.run_label(
            changes=entry.diff or {}, scale=entry.scale, seed=entry.seed, sequence=self.run.sequence
        )

    @property
    def log_url(self) -> str:
        return reverse("run-logs", kwargs={"pk": self.run.pk})


@dataclass
class RunGroup:
    label: str
    rows: list[RunRow]


@dataclass
class Column:
    id: str
    label: str
    query: str
    aria_sort: str


@dataclass
class RunTable:
    rows: list[RunRow]
    axes: list[str]
    metric_keys: list[str]
    chart_keys: list[str]
    all_keys: list[str]
    sort: str = ""
    group: str = ""
    plan: Plan | None = None
    launch: PlanLaunch | None = None
    groups: list[RunGroup] = field(default_factory=list)
    columns: dict[str, Column] = field(default_factory=dict)
    values: dict[int, dict[str, float]] = field(default_factory=dict)
    logged_keys: list[str] = field(default_factory=list)  # keys with points: what charts draw
    declarations: dict[str, MetricDeclaration] = field(default_factory=dict)  # the recipe's
    shown: list[str] = field(default_factory=list)  # optional columns asked for, in order
    optional: list[tuple[str, str]] = field(default_factory=list)  # (id, label) on offer

    @property
    def shows_attempt(self) -> bool:
        return "attempt" in self.shown

    @property
    def shows_executor(self) -> bool:
        return "executor" in self.shown

    @property
    def column_count(self) -> int:
        """Every column the table draws (a group row spans them)."""
        return 5 + len(self.metric_keys) + self.shows_attempt + self.shows_executor

    @property
    def columns_param(self) -> str:
        return ",".join(self.shown)

    @property
    def active(self) -> bool:
        """Whether anything can still change: a run not yet terminal, or a launch whose
        runs are not expanded yet."""
        if any(row.run.state not in TERMINAL_RUN_STATES for row in self.rows):
            return True
        launch = self.launch
        return bool(launch and launch.expanded_at is None and launch.canceled_at is None)

    @property
    def chart_captions(self) -> list[tuple[str, str]]:
        """(key, caption) of the charts drawn first: the declared display name, or the key."""
        return [(key, self.display(key).label) for key in self.chart_keys]

    def display(self, key: str) -> display.MetricDisplay:
        """How the table, its charts and its seed rows show ``key`` (``runs.metrics.display``)."""
        return display.MetricDisplay.of(key, self.declarations.get(key))

    @property
    def awaiting_summary(self) -> bool:
        """Whether every run has ended and the plan's results are still being summarised
        (``runs.results.summary``): the page keeps following it until they arrive, for at
        most ``SUMMARY_WAIT_SECONDS`` after the last run ended."""
        launch = self.launch
        if (
            launch is None
            or launch.expanded_at is None
            or launch.finished_at is not None
            or launch.canceled_at is not None
            or not self.rows
            or self.active
        ):
            return False
        ended = [row.run.finished_at for row in self.rows if row.run.finished_at is not None]
        last = max(ended, default=None)
        return last is None or timezone.now() - last < timedelta(seconds=SUMMARY_WAIT_SECONDS)

    @property
    def live(self) -> bool:
        """Whether a page showing the table polls it: something can still change."""
        return self.active or self.awaiting_summary

    @property
    def other_keys(self) -> list[str]:
        """Keys a chart can be added for: logged as points, not charted yet."""
        return [k for k in self.logged_keys if k not in self.chart_keys]

    @cached_property
    def seed_groups(self) -> list[dict[str, Any]]:
        """Each variant at each scale over its seeds (``runs.results.seeds``), for the seed table."""
        criteria = (self.launch.criteria if self.launch else None) or {}
        present = [key for key in self.metric_keys if any(key in v for v in self.values.values())]
        return seeds.variant_groups(
            runs=[row.run for row in self.rows],
            metrics=self.values,
            keys=present,
            criteria=criteria,
        )

    @property
    def seeded(self) -> bool:
        """Whether the table has a variant with several seeds at one scale."""
        return self.plan is not None and seeds.seeded(self.seed_groups)

    @property
    def metric_columns(self) -> list[Column]:
        return [self.columns[key] for key in self.metric_keys if key in self.columns]

    def declaration(self, key: str) -> MetricDeclaration:
        """A key as the recipe declares it (a bare declaration when it does not)."""
        return self.declarations.get(key) or MetricDeclaration(key=key)

    @property
    def metric_declarations(self) -> list[MetricDeclaration]:
        """The metric columns' declarations, in order: the seed table writes their units."""
        return [self.declaration(key) for key in self.metric_keys]

    @property
    def has_scales(self) -> bool:
        """Whether the plan's grid has a scale axis (the seed table's Scale column)."""
        return "scale" in self.axes

    @property
    def seed_declarations(self) -> list[MetricDeclaration]:
        """The seed table's columns: the metric columns some run has a value of (a column
        of dashes only widens the table)."""
        present = {key for values in self.values.values() for key in values}
        return [self.declaration(key) for key in self.metric_keys if key in present]

    @property
    def criterion(self) -> MetricDeclaration | None:
        """The launch's criterion metric, as the recipe declares it."""
        key = ((self.launch.criteria if self.launch else None) or {}).get("metric")
        return self.declaration(str(key)) if key else None

    @property
    def sort_options(self) -> list[tuple[str, str]]:
        """(value, label) for the sort select: every column both ways, the axes included."""
        options = [("", "plan order")]
        for column_id in [*FIXED_SORTS, *self.axes, *self.metric_keys]:
            options += [(column_id, f"{column_id} ↑"), (f"-{column_id}", f"{column_id} ↓")]
        return options


def ordered_keys(keys: Iterable[str]) -> list[str]:
    present = set(keys)
    first = [k for k in CHART_KEYS_FIRST if k in present]
    return first + sorted(present - set(first))


def job_url(run: Run) -> str:
    """A link to the executor's own page of the job, where it has one (Ray's dashboard)."""
    if run.executor == "ray" and run.external_id and settings.RAY_ADDRESS:
        return f"{settings.RAY_ADDRESS.rstrip('/')}/#/jobs/{run.external_id}"
    return ""


def plan_declarations(plan: Plan | None) -> dict[str, MetricDeclaration]:
    """What the plan's recipe declares about its metrics (``runs.metrics.declarations``)."""
    return declarations_parse(plan.recipe.metrics) if plan is not None else {}


def metric_columns(declared: Mapping[str, MetricDeclaration]) -> dict[str, MetricDeclaration]:
    """The run table's metric columns: those the recipe declares as columns (with their
    unit and label), else the default keys (as declared, when they are)."""
    chosen = {key: d for key, d in declared.items() if d.column}
    if chosen:
        return chosen
    return {key: declared.get(key) or MetricDeclaration(key=key) for key in TABLE_KEYS}


def columns_parse(values: Iterable[str]) -> list[str]:
    """Optional column ids from ``?columns=a,b`` (or repeated ``columns``), without repeats;
    which of them exist is the table's to say."""
    chosen: list[str] = []
    for value in values:
        for raw in str(value).split(","):
            part = raw.strip()[:200]
            if part and part not in chosen:
                chosen.append(part)
    return chosen[:MAX_EXTRA_COLUMNS]


def plan_axes(plan: Plan | None) -> list[str]:
    return presentation.axis_names(plan.spec if plan else None)


def _row(
    run: Run,
    axes: Sequence[str],
    values: dict[str, float],
    step: int | None,
    columns: Mapping[str, MetricDeclaration],
) -> RunRow:
    total = (run.config or {}).get("steps")
    entry = run.entry
    return RunRow(
        run=run,
        axes=presentation.axis_values(
            axes, config=run.config or {}, scale=entry.scale, seed=entry.seed
        ),
        changes=presentation.change_parts(entry.diff or {}),
        values=values,
        metrics=[(key, values.get(key), declared) for key, declared in columns.items()],
        step=step,
        total_steps=total if isinstance(total, int) and not isinstance(total, bool) else None,
        job_url=job_url(run),
    )


def _sort_key(sort: str, axes: Sequence[str], metric_keys: Sequence[str]) -> Any:
    name = sort.lstrip("-")

    def key(row: RunRow) -> Any:
        run = row.run
        if name == "state":
            value: Any = STATE_ORDER.get(RunState(run.state), 9)
        elif name == "progress":
            value = row.progress_percent
        elif name == "attempt":
            value = run.attempt
        elif name in metric_keys:
            value = row.values.get(name)
        elif name in axes:
            raw = row.axes.get(name)
            if raw is None:
                return None
            if isinstance(raw, int | float) and not isinstance(raw, bool):
                return (0, float(raw), "")
            return (1, 0.0, presentation.value_text(raw))
        else:
            value = run.pk
        return value

    return key


def rows_sort(
    rows: list[RunRow], *, sort: str, axes: Sequence[str], metric_keys: Sequence[str]
) -> list[RunRow]:
    """Sort by a column id (``-`` first for descending); rows without a value go last."""
    if not sort:
        return rows
    key = _sort_key(sort, axes, metric_keys)
    present = [row for row in rows if key(row) is not None]
    missing = [row for row in rows if key(row) is None]
    present.sort(key=key, reverse=sort.startswith("-"))
    return present + missing


def rows_group(rows: list[RunRow], *, group: str) -> list[RunGroup]:
    if not group:
        return [RunGroup(label="", rows=rows)]
    groups: dict[str, RunGroup] = {}
    for row in rows:
        label = f"{group} = {presentation.value_text(row.axes.get(group))}"
        groups.setdefault(label, RunGroup(label=label, rows=[])).rows.append(row)
    return list(groups.values())


def _columns(
    *,
    sort: str,
    group: str,
    axes: Sequence[str],
    metric_keys: Sequence[str],
    extra: Mapping[str, str],
    labels: Mapping[str, str] | None = None,
) -> dict[str, Column]:
    """Each sortable column with the query its header links to (a second click reverses)."""
    columns: dict[str, Column] = {}
    for column_id in [*FIXED_SORTS, *metric_keys, *axes]:
        current = sort.lstrip("-") == column_id
        descending = sort.startswith("-")
        next_sort = f"-{column_id}" if current and not descending else column_id
        params = {**extra, "sort": next_sort, **({"group": group} if group else {})}
        aria = ("descending" if descending else "ascending") if current else "none"
        columns[column_id] = Column(
            id=column_id,
            label=(labels or {}).get(column_id, column_id),
            query=urlencode(params, safe="/,"),
            aria_sort=aria,
        )
    return columns


def run_table_build(
    *,
    runs: Sequence[Run],
    plan: Plan | None = None,
    launch: PlanLaunch | None = None,
    sort: str = "",
    group: str = "",
    extra_params: Mapping[str, str] | None = None,
    columns: Sequence[str] = (),
    across_recipes: bool = False,
) -> RunTable:
    """The table of ``runs`` (loaded with their entries), sorted and grouped.

    ``extra_params`` go into every sort link (the compare page keeps its run ids);
    ``columns`` names optional columns to show besides the default ones (unknown ids are
    ignored). A table ``across_recipes`` (the compare page) shows each key as the first of
    the runs' recipes that declares it, the others' values converted into its unit."""
    runs = list(runs)
    axes = plan_axes(plan)
    values, steps, logged = presentation.final_values(runs)
    declarations = _shared_declarations(runs, values) if across_recipes else plan_declarations(plan)
    default_columns = metric_columns(declarations)
    all_keys = ordered_keys(k for v in values.values() for k in v)
    other_metrics = [k for k in all_keys if k not in default_columns]
    optional = [
        *((c, c) for c in OPTIONAL_FIXED),
        *(
            (k, presentation.metric_label(k, declarations.get(k) or MetricDeclaration(key=k)))
            for k in other_metrics
        ),
    ]
    offered = {c for c, _ in optional}
    shown = [c for c in columns if c in offered]
    chosen = {
        **default_columns,
        **{k: declarations.get(k) or MetricDeclaration(key=k) for k in shown if k in all_keys},
    }
    rows = [_row(run, axes, values[run.pk], steps.get(run.pk), chosen) for run in runs]
    metric_keys = list(chosen)
    if shown:
        extra_params = {**(extra_params or {}), "columns": ",".join(shown)}
    sort = sort if sort.lstrip("-") in {*FIXED_SORTS, *metric_keys, *axes} else ""
    group = group if group in axes else ""
    rows = rows_sort(rows, sort=sort, axes=axes, metric_keys=metric_keys)
    return RunTable(
        rows=rows,
        axes=axes,
        metric_keys=metric_keys,
        chart_keys=[k for k in all_keys if k in logged][:DEFAULT_CHARTS],
        logged_keys=[k for k in all_keys if k in logged],
        all_keys=all_keys,
        sort=sort,
        group=group,
        plan=plan,
        launch=launch,
        groups=rows_group(rows, group=group),
        columns=_columns(
            sort=sort,
            group=group,
            axes=axes,
            metric_keys=metric_keys,
            extra=extra_params or {},
            labels={k: presentation.metric_label(k, d) for k, d in chosen.items()},
        ),
        values=values,
        declarations=declarations,
        shown=shown,
        optional=optional,
    )


def _shared_declarations(
    runs: Sequence[Run], values: dict[int, dict[str, float]]
) -> dict[str, MetricDeclaration]:
    """The declarations of runs of several recipes: for each key the first recipe's (in the
    runs' order) that declares it; each run's values of the key are put in the unit that
    declaration stores (``values`` is changed in place), so one rule writes them all."""
    recipes = [(run.recipe_name, run.recipe_version) for run in runs]
    by_recipe = display.recipe_declarations(recipes)
    chosen: dict[str, MetricDeclaration] = {}
    for recipe in recipes:
        for key, declared in by_recipe.get(recipe, {}).items():
            chosen.setdefault(key, declared)
    for run, recipe in zip(runs, recipes, strict=True):
        own = by_recipe.get(recipe, {})
        for key, value in values[run.pk].items():
            if key in own and key in chosen:
                factor = display.factor_between(
                    declarations_logged(own[key]), declarations_logged(chosen[key])
                )
                values[run.pk][key] = value * factor
    return chosen


def plan_run_table(
    *, plan: Plan, sort: str = "", group: str = "", columns: Sequence[str] = ()
) -> RunTable:
    # The launch before the runs: each query sees what was committed when it started, so an
    # expansion committing in between must not read as "expanded, and no runs" (not live,
    # and the page would stop polling before its runs appear).
    launch = PlanLaunch.objects.filter(plan_id=plan.pk).first()
    runs = list(
        Run.objects.filter(plan_id=plan.pk)
        .select_related("entry")
        .order_by("entry__index", "sequence")
    )
    return run_table_build(
        runs=runs, plan=plan, launch=launch, sort=sort, group=group, columns=columns
    )


def ladder_metric(table: RunTable) -> str:
    """The loss the ladder plots: the launch's criterion if it is a loss, else eval/loss,
    else train/loss."""
    criterion = str(((table.launch.criteria if table.launch else None) or {}).get("metric") or "")
    return ladder.ladder_metric(criterion=criterion, keys=table.all_keys)


def table_ladder(table: RunTable) -> Ladder | None:
    if table.plan is None:
        return None
    found = ladder.plan_ladder(
        plan=table.plan,
        runs=[row.run for row in table.rows],
        values=table.values,
        metric=ladder_metric(table),
    )
    return found if found is not None and any(v.points for v in found.variants) else None


# --- compare: runs picked across plans -----------------------------------------------------


def parse_run_ids(values: Iterable[str], *, limit: int = COMPARE_MAX_RUNS) -> tuple[list[int], int]:
    """Run ids from ``?ids=1,2,3`` (or repeated ``ids``), in order, without repeats; the
    first ``limit`` of them, and how many distinct ids were asked for."""
    ids: list[int] = []
    for value in values:
        for part in value.replace(" ", ",").split(","):
            if part.strip().isdigit():
                number = int(part)
                if 0 < number < 2**63 and number not in ids:
                    ids.append(number)
    return ids[:limit], len(ids)


@dataclass
class Comparison:
    table: RunTable
    config_keys: list[str]
    config_rows: list[tuple[RunRow, list[Any]]]
    run_axes: dict[int, dict[str, Any]]


def compare_build(
    *, run_ids: Sequence[int], sort: str = "", ids_text: str = "", columns: Sequence[str] = ()
) -> Comparison:
    """The picked runs (in the order asked), their metrics, and only the config keys whose
    values differ between them. ``ids_text`` goes into the table's sort links."""
    found = {
        run.pk: run for run in Run.objects.filter(pk__in=run_ids).select_related("entry", "plan")
    }
    runs = [found[pk] for pk in run_ids if pk in found]
    table = run_table_build(
        runs=runs,
        sort=sort,
        extra_params={"ids": ids_text} if ids_text else None,
        columns=columns,
        across_recipes=True,
    )
    flat = {run.pk: flatten(run.config or {}) for run in runs}
    keys = sorted({k for config in flat.values() for k in config})
    differing = [
        k for k in keys if len({canonical_json(config.get(k)) for config in flat.values()}) > 1
    ]
    rows = [(row, [flat[row.run.pk].get(k) for k in differing]) for row in table.rows]
    run_axes = {run.pk: {k: flat[run.pk].get(k) for k in differing} for run in runs}
    return Comparison(table=table, config_keys=differing, config_rows=rows, run_axes=run_axes)


def series_query(keys: Sequence[str], extra: Mapping[str, str] | None = None) -> str:
    params = {**(extra or {}), "keys": ",".join(keys), "points": str(SERIES_POINTS)}
    return urlencode(params, safe="/,")
