"""Reads behind the results pages: a plan's run table (state, progress, final metrics,
telemetry, the config as a diff against the baseline, links), sorted and grouped by any grid
axis, the chart keys, the scaling ladder, and the runs picked on the compare page.

Every builder costs a fixed number of queries whatever the number of runs: runs with their
entries in one, every run's metric summaries in one, the launch in one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.urls import reverse

from runs.ladder import Ladder, plan_ladder
from runs.metric_declarations import MetricDeclaration, declarations_parse
from runs.models import TERMINAL_RUN_STATES, MetricSummary, Plan, PlanLaunch, Run, RunState
from runs.plans import canonical_json, flatten
from runs.results import TABLE_KEYS

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


@dataclass
class RunRow:
    run: Run
    axes: dict[str, Any]
    diff: list[tuple[str, Any]]
    values: dict[str, float]
    metrics: list[tuple[str, float | None, MetricDeclaration | None]]  # the metric columns
    step: int | None
    total_steps: int | None
    job_url: str = ""

    @property
    def progress_percent(self) -> int | None:
        if self.step is None or not self.total_steps:
            return None
        return max(0, min(100, round(100 * self.step / self.total_steps)))

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

    @property
    def active(self) -> bool:
        """Whether anything can still change: a run not yet terminal, or a launch whose
        runs are not expanded yet."""
        if any(row.run.state not in TERMINAL_RUN_STATES for row in self.rows):
            return True
        launch = self.launch
        return bool(launch and launch.expanded_at is None and launch.canceled_at is None)

    @property
    def other_keys(self) -> list[str]:
        """Keys a chart can be added for: logged as points, not charted yet."""
        return [k for k in self.logged_keys if k not in self.chart_keys]

    @property
    def metric_columns(self) -> list[Column]:
        return [self.columns[key] for key in self.metric_keys if key in self.columns]

    @property
    def sort_options(self) -> list[tuple[str, str]]:
        """(value, label) for the sort select: every column both ways, the axes included."""
        options = [("", "plan order")]
        for column_id in [*FIXED_SORTS, *self.axes, *self.metric_keys]:
            options += [(column_id, f"{column_id} ↑"), (f"-{column_id}", f"{column_id} ↓")]
        return options


def run_label(run: Run) -> str:
    """What tells a run from its siblings: its changes against the baseline, scale, seed."""
    entry = run.entry
    parts = [f"{k}={display(c.get('value'))}" for k, c in (entry.diff or {}).items()]
    parts = parts or ["baseline"]
    if entry.scale:
        parts.append(entry.scale)
    if entry.seed is not None:
        parts.append(f"seed {entry.seed}")
    return " · ".join(parts)


def display(value: Any) -> str:
    """An axis or config value as a short string (strings stay bare)."""
    if value is None:
        return "–"
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def final_values(
    runs: Sequence[Run],
) -> tuple[dict[int, dict[str, float]], dict[int, int], set[str]]:
    """Each run's last value per key and its highest step, in one query. A cached run reads
    the run it reuses; imported tracker summaries fill keys that were never streamed."""
    source_of = {run.pk: run.cached_from_id or run.pk for run in runs}
    by_source: dict[int, dict[str, float]] = {}
    steps: dict[int, int] = {}
    for run_id, key, last, step in MetricSummary.objects.filter(
        run_id__in=set(source_of.values())
    ).values_list("run_id", "key", "last", "step"):
        by_source.setdefault(run_id, {})[key] = last
        steps[run_id] = max(steps.get(run_id, step), step)
    values: dict[int, dict[str, float]] = {}
    progress: dict[int, int] = {}
    for run in runs:
        imported = {
            k: float(v)
            for k, v in (run.final_metrics or {}).items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        }
        values[run.pk] = {**imported, **by_source.get(source_of[run.pk], {})}
        if source_of[run.pk] in steps:
            progress[run.pk] = steps[source_of[run.pk]]
    logged = {key for metrics in by_source.values() for key in metrics}  # keys with points
    return values, progress, logged


def ordered_keys(keys: Iterable[str]) -> list[str]:
    present = set(keys)
    first = [k for k in CHART_KEYS_FIRST if k in present]
    return first + sorted(present - set(first))


def job_url(run: Run) -> str:
    """A link to the executor's own page of the job, where it has one (Ray's dashboard)."""
    if run.executor == "ray" and run.external_id and settings.RAY_ADDRESS:
        return f"{settings.RAY_ADDRESS.rstrip('/')}/#/jobs/{run.external_id}"
    return ""


def metric_columns(plan: Plan | None) -> dict[str, MetricDeclaration | None]:
    """The run table's metric columns: those the plan's recipe declares as columns (with
    their unit and label), else the default keys."""
    declared = declarations_parse(plan.recipe.metrics) if plan is not None else {}
    chosen = {key: d for key, d in declared.items() if d.column}
    return dict(chosen) if chosen else dict.fromkeys(TABLE_KEYS)


def plan_axes(plan: Plan | None) -> list[str]:
    spec = (plan.spec if plan else None) or {}
    axes = [str(name) for name in (spec.get("axes") or {})]
    if spec.get("scales"):
        axes.append("scale")
    if spec.get("seeds"):
        axes.append("seed")
    return axes


def _axis_values(run: Run, axes: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for axis in axes:
        if axis == "scale":
            out[axis] = run.entry.scale
        elif axis == "seed":
            out[axis] = run.entry.seed
        else:
            out[axis] = (run.config or {}).get(axis)
    return out


def _row(
    run: Run,
    axes: Sequence[str],
    values: dict[str, float],
    step: int | None,
    columns: Mapping[str, MetricDeclaration | None],
) -> RunRow:
    total = (run.config or {}).get("steps")
    diff = run.entry.diff or {}
    return RunRow(
        run=run,
        axes=_axis_values(run, axes),
        diff=[(key, change.get("value")) for key, change in diff.items()],
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
            return (1, 0.0, display(raw))
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
        label = f"{group} = {display(row.axes.get(group))}"
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
) -> RunTable:
    """The table of ``runs`` (loaded with their entries), sorted and grouped.

    ``extra_params`` go into every sort link (the compare page keeps its run ids)."""
    runs = list(runs)
    axes = plan_axes(plan)
    values, steps, logged = final_values(runs)
    columns = metric_columns(plan)
    rows = [_row(run, axes, values[run.pk], steps.get(run.pk), columns) for run in runs]
    all_keys = ordered_keys(k for v in values.values() for k in v)
    metric_keys = list(columns)
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
            labels={k: d.label_with_unit for k, d in columns.items() if d is not None},
        ),
        values=values,
    )


def plan_run_table(*, plan: Plan, sort: str = "", group: str = "") -> RunTable:
    # The launch before the runs: each query sees what was committed when it started, so an
    # expansion committing in between must not read as "expanded, and no runs" (not live,
    # and the page would stop polling before its runs appear).
    launch = PlanLaunch.objects.filter(plan_id=plan.pk).first()
    runs = list(
        Run.objects.filter(plan_id=plan.pk)
        .select_related("entry")
        .order_by("entry__index", "sequence")
    )
    return run_table_build(runs=runs, plan=plan, launch=launch, sort=sort, group=group)


def ladder_metric(table: RunTable) -> str:
    """The loss the ladder plots: the launch's criterion if it is a loss, else eval/loss,
    else train/loss."""
    criterion = str(((table.launch.criteria if table.launch else None) or {}).get("metric") or "")
    for key in (criterion, "eval/loss", "train/loss"):
        if key and "loss" in key and key in table.all_keys:
            return key
    return "eval/loss"


def table_ladder(table: RunTable) -> Ladder | None:
    if table.plan is None:
        return None
    ladder = plan_ladder(
        plan=table.plan,
        runs=[row.run for row in table.rows],
        values=table.values,
        metric=ladder_metric(table),
    )
    return ladder if ladder is not None and any(v.points for v in ladder.variants) else None


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


def compare_build(*, run_ids: Sequence[int], sort: str = "", ids_text: str = "") -> Comparison:
    """The picked runs (in the order asked), their metrics, and only the config keys whose
    values differ between them. ``ids_text`` goes into the table's sort links."""
    found = {
        run.pk: run for run in Run.objects.filter(pk__in=run_ids).select_related("entry", "plan")
    }
    runs = [found[pk] for pk in run_ids if pk in found]
    table = run_table_build(
        runs=runs, sort=sort, extra_params={"ids": ids_text} if ids_text else None
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
