"""Results: when every run of a launched plan is terminal, summarise it against its baseline.

The summary holds a table of final metrics per run (throughput and MFU as their
steady-state medians, marked when a cached run reuses them), each ablation run compared
with the baseline at the same scale and seed, each variant over its seeds (mean ± standard
deviation, the difference from the baseline and its standard error: ``runs.results.seeds``), the
scaling ladder when the plan has scales (``runs.results.ladder``), and a suggested verdict against
the criteria the launcher passed in, which counts a difference inside the seed noise as
no evidence. Nothing is concluded automatically: a maintainer records the outcome.
``plan_finished`` carries the summary to whoever listens (the proposal page, the GitHub
result comment).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from runs.metrics.declarations import MetricDeclaration, declarations_parse
from runs.metrics.flags import flags_open
from runs.metrics.steady import is_steady_state_key
from runs.models import TERMINAL_RUN_STATES, Plan, PlanLaunch, Run, RunState
from runs.results.ladder import Ladder, ladder_markdown, ladder_metric, plan_ladder
from runs.results.presentation import (
    delta_text,
    final_values,
    is_number,
    metric_label,
    metric_text,
    run_label,
    spread_text,
    value_text,
    verdict_text,
)
from runs.results.seeds import seeded, variant_groups, verdict_suggest
from runs.signals import plan_finished
from runs.verdicts.plan import plan_verdicts, verdicts_markdown

TABLE_KEYS = (
    "train/loss",
    "eval/loss",
    "throughput/tokens_per_second",
    "throughput/mfu",
    "moe/drop_fraction",
)


def latest_runs(*, plan_id: int) -> list[Run]:
    """The newest run of each plan entry (reruns and retries replace older ones)."""
    latest: dict[int, Run] = {}
    for run in (
        Run.objects.filter(plan_id=plan_id)
        .select_related("entry")
        .order_by("entry__index", "sequence")
    ):
        latest[run.entry_id] = run
    return list(latest.values())


def final_metrics(*, runs: list[Run]) -> dict[int, dict[str, float]]:
    """Each run's last value per key, throughput keys their steady-state median (a cached
    run reads the run it reuses: ``runs.results.presentation.final_values``). A key with an
    open flag (its values do not fit its declaration: ``runs.metrics.flags``) is left out
    until the flag is resolved, so no verdict rests on a value read in the wrong unit."""
    values = final_values(runs)[0]
    source_of = {run.pk: run.cached_from_id or run.pk for run in runs}
    flagged = flags_open(run_ids=set(source_of.values()))
    if not flagged:
        return values
    return {
        run_id: {
            key: value
            for key, value in metrics.items()
            if key not in flagged.get(source_of[run_id], ())
        }
        for run_id, metrics in values.items()
    }


def compare(
    *, criteria: dict[str, Any], runs: list[Run], metrics: dict[int, dict[str, float]]
) -> list[dict[str, Any]]:
    """Each ablation run against the baseline run at the same scale and seed."""
    metric = str(criteria.get("metric") or "")
    direction = criteria.get("direction") or "lower"
    threshold: Any = criteria.get("threshold")
    if not metric or not is_number(threshold):
        return []
    baselines = {
        (run.entry.scale, run.entry.seed): run
        for run in runs
        if run.entry.is_baseline and run.state == RunState.FINISHED
    }
    rows: list[dict[str, Any]] = []
    for run in runs:
        if run.entry.is_baseline:
            continue
        base = baselines.get((run.entry.scale, run.entry.seed))
        value = metrics[run.pk].get(metric) if run.state == RunState.FINISHED else None
        base_value = metrics[base.pk].get(metric) if base is not None else None
        row: dict[str, Any] = {
            "run": run.pk,
            "baseline_run": base.pk if base is not None else None,
            "overrides": run.entry.diff or run.entry.overrides,
            "value": value,
            "baseline_value": base_value,
            "improvement": None,
            "meets_threshold": None,
        }
        if value is not None and base_value is not None:
            improvement = base_value - value if direction == "lower" else value - base_value
            row["improvement"] = improvement
            row["meets_threshold"] = improvement >= float(threshold)
        rows.append(row)
    return rows


def _declared(summary: dict[str, Any]) -> dict[str, MetricDeclaration]:
    """The recipe's declarations of the summary's keys (``plan_summarize`` keeps them: unit,
    how it is logged, display name), so the markdown writes each value as the pages do
    (``runs.metrics.display``); a summary kept before them has its units alone."""
    declared = summary.get("declared")
    if isinstance(declared, dict):
        return {
            key: MetricDeclaration(
                key=key,
                unit=str(d.get("unit", "")),
                logged_as=str(d.get("logged_as", "")),
                display=str(d.get("display", "")),
            )
            for key, d in declared.items()
            if isinstance(d, dict)
        }
    units = summary.get("units") or {}
    return {key: MetricDeclaration(key=key, unit=str(unit)) for key, unit in units.items()}


def _heading(key: str, declared: dict[str, MetricDeclaration]) -> str:
    """A column heading of the markdown tables: ``MFU (%)``, its pipes escaped."""
    return metric_label(key, declared.get(key)).replace("|", "\\|")


def _delta_cell(group: dict[str, Any], key: str, declaration: MetricDeclaration | None) -> str:
    if group["delta"] is None:
        return "–"
    text = delta_text(group["delta"], group["delta_se"], key, declaration)
    if group["delta_se"] is None:
        return f"{text} (no spread known)"
    noise = "inside the noise" if group["inside_noise"] else "outside the noise"
    return f"{text} ({noise})"


def seeds_markdown(summary: dict[str, Any]) -> str:
    """The variants over their seeds: mean ± sample standard deviation of each key and the
    criterion metric's difference from the baseline with its standard error."""
    keys = summary["keys"]
    declared = _declared(summary)
    metric = summary["criteria"].get("metric") or ""
    lines = [
        "**Across seeds** (mean ± sample standard deviation"
        + (
            f"; Δ `{metric}` against the baseline at the same scale ± its standard error"
            if metric
            else ""
        )
        + ")",
        "",
        "| variant | scale | seeds | "
        + " | ".join(_heading(key, declared) for key in keys)
        + (f" | Δ {metric} |" if metric else " |"),
        "|---|---|---|" + "---|" * len(keys) + ("---|" if metric else ""),
    ]
    for group in summary["groups"]:
        cells = [spread_text(group["stats"].get(key), key, declared.get(key)) for key in keys]
        if metric:
            cells.append(
                "–" if group["is_baseline"] else _delta_cell(group, metric, declared.get(metric))
            )
        lines.append(
            f"| {group['label']} | {group['scale'] or '–'} | {group['seeds']} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


def summary_markdown(summary: dict[str, Any]) -> str:
    keys = summary["keys"]
    declared = _declared(summary)
    lines = [
        "| run | scale | seed | overrides | state | "
        + " | ".join(_heading(key, declared) for key in keys)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(keys),
    ]
    reused = False
    for row in summary["runs"]:
        overrides = run_label(changes=row["overrides"])
        cells = []
        for key in keys:
            cell = metric_text(row["metrics"].get(key), key, declared.get(key))
            if row["cached_from"] and is_steady_state_key(key) and key in row["metrics"]:
                cell += " (reused)"
                reused = True
            cells.append(cell)
        lines.append(
            f"| {row['run']} | {row['scale'] or '–'} | {value_text(row['seed'])} | {overrides} | "
            f"{row['state']} | " + " | ".join(cells) + " |"
        )
    if any(is_steady_state_key(key) for key in keys):
        lines += [
            "",
            "Throughput and MFU: the median over the steady state (after the recipe's warm-up), "
            "not the last step."
            + (
                " *(reused)*: a cached run shows what the run it reuses measured; it did not "
                "run again."
                if reused
                else ""
            ),
        ]
    lines.append("")
    if seeded(summary["groups"]):
        lines.append(seeds_markdown(summary))
    else:
        lines.append(
            "One seed per point: no seed spread is known, so a difference from the baseline "
            "cannot be told from noise."
        )
    if summary.get("ladder"):
        lines += ["", ladder_markdown(summary["ladder"])]
    if summary.get("verdicts"):
        lines += ["", verdicts_markdown(summary["verdicts"])]
    criteria = summary["criteria"]
    if criteria.get("metric"):
        lines.append("")
        lines.append(
            f"Criterion: `{criteria['metric']}` {criteria.get('direction', 'lower')} by at "
            f"least {value_text(criteria.get('threshold'))} against the baseline. "
            f"Suggested verdict: **{verdict_text(summary['suggested_verdict'])}**: "
            f"{summary['verdict_reason']}. A maintainer records the outcome."
        )
    return "\n".join(lines)


def plan_summary_ladder(
    *, plan: Plan, runs: list[Run], metrics: dict[int, dict[str, float]], criteria: dict[str, Any]
) -> Ladder | None:
    """The plan's scaling ladder (a spec with two or more scales), or None."""
    keys = {key for values in metrics.values() for key in values}
    metric = ladder_metric(criterion=str(criteria.get("metric") or ""), keys=keys)
    ladder = plan_ladder(plan=plan, runs=runs, values=metrics, metric=metric)
    return ladder if ladder is not None and any(v.points for v in ladder.variants) else None


def plan_summarize(*, plan_id: int) -> dict[str, Any]:
    launch = PlanLaunch.objects.select_related("plan").get(plan_id=plan_id)
    runs = latest_runs(plan_id=plan_id)
    metrics = final_metrics(runs=runs)
    criteria = launch.criteria or {}
    keys = [k for k in TABLE_KEYS if any(k in m for m in metrics.values())]
    comparisons = compare(criteria=criteria, runs=runs, metrics=metrics)
    groups = variant_groups(runs=runs, metrics=metrics, keys=keys, criteria=criteria)
    metric, threshold = criteria.get("metric"), criteria.get("threshold")
    if metric and is_number(threshold):
        verdict, reason = verdict_suggest(groups)
    else:
        verdict, reason = "not_evaluated", "the launch named no criterion"
    states: dict[str, int] = {}
    for run in runs:
        states[run.state] = states.get(run.state, 0) + 1
    ladder = plan_summary_ladder(plan=launch.plan, runs=runs, metrics=metrics, criteria=criteria)
    declarations = declarations_parse(launch.plan.recipe.metrics)
    summary: dict[str, Any] = {
        "plan": plan_id,
        "criteria": criteria,
        "states": states,
        "keys": keys,
        "units": {k: d.unit for k, d in declarations.items() if d.unit},
        "declared": {
            k: {"unit": d.unit, "logged_as": d.logged_as, "display": d.display}
            for k, d in declarations.items()
        },
        "runs": [
            {
                "run": run.pk,
                "index": run.entry.index,
                "scale": run.entry.scale,
                "seed": run.entry.seed,
                "is_baseline": run.entry.is_baseline,
                "overrides": run.entry.diff or run.entry.overrides,
                "state": run.state,
                "failure_kind": run.failure_kind,
                "cached_from": run.cached_from_id,
                "metrics": metrics[run.pk],
            }
            for run in runs
        ],
        "comparisons": comparisons,
        "groups": groups,
        "suggested_verdict": verdict,
        "verdict_reason": reason,
        "ladder": ladder.as_summary() if ladder is not None else None,
        # The preregistered rule's verdict per variant, from finished runs only.
        "verdicts": (
            plan_verdicts(spec=criteria["rule"], runs=runs, metrics=metrics)
            if criteria.get("rule")
            else None
        ),
    }
    summary["markdown"] = summary_markdown(summary)
    return summary


def plan_check_finished(*, plan_id: int) -> bool:
    """Summarise the plan if every latest run is terminal; tell listeners once."""
    with transaction.atomic():
        launch = PlanLaunch.objects.select_for_update().filter(plan_id=plan_id).first()
        if launch is None or launch.expanded_at is None or launch.finished_at is not None:
            return False
        runs = latest_runs(plan_id=plan_id)
        if not runs or any(run.state not in TERMINAL_RUN_STATES for run in runs):
            return False
        summary = plan_summarize(plan_id=plan_id)
        launch.summary = summary
        launch.finished_at = timezone.now()
        launch.save(update_fields=["summary", "finished_at"])
        transaction.on_commit(
            lambda: plan_finished.send(sender=PlanLaunch, plan_id=plan_id, summary=summary)
        )
        return True
