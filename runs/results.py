"""Results: when every run of a launched plan is terminal, summarise it against its baseline.

The summary holds a table of final metrics per run, each ablation point compared with the
baseline at the same scale and seed against the criteria the launcher passed in, and a
suggested verdict. Nothing is concluded automatically: a maintainer records the outcome.
``plan_finished`` carries the summary to whoever listens (the proposal page, the GitHub
result comment).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from runs.models import TERMINAL_RUN_STATES, PlanLaunch, Run, RunState
from runs.presentation import final_values, is_number, metric_text, run_label, value_text
from runs.signals import plan_finished

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
    """Each run's last value per key (``runs.presentation.final_values``)."""
    return final_values(runs)[0]


def compare(
    *, criteria: dict[str, Any], runs: list[Run], metrics: dict[int, dict[str, float]]
) -> tuple[list[dict[str, Any]], str]:
    """Each ablation point against its baseline; returns the rows and a suggested verdict."""
    metric = str(criteria.get("metric") or "")
    direction = criteria.get("direction") or "lower"
    threshold: Any = criteria.get("threshold")
    if not metric or not is_number(threshold):
        return [], "not_evaluated"
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
    judged = [row for row in rows if row["meets_threshold"] is not None]
    if not judged or len(judged) < len(rows) / 2:
        verdict = "inconclusive"
    elif all(row["meets_threshold"] for row in judged):
        verdict = "worked"
    elif any(row["meets_threshold"] for row in judged):
        verdict = "mixed"
    elif any(row["improvement"] > 0 for row in judged):
        verdict = "promising"
    else:
        verdict = "did_not_work"
    return rows, verdict


def summary_markdown(summary: dict[str, Any]) -> str:
    keys = summary["keys"]
    lines = [
        "| run | scale | seed | overrides | state | " + " | ".join(keys) + " |",
        "|---|---|---|---|---|" + "---|" * len(keys),
    ]
    for row in summary["runs"]:
        overrides = run_label(changes=row["overrides"])
        cells = [metric_text(row["metrics"].get(key), key) for key in keys]
        lines.append(
            f"| {row['run']} | {row['scale'] or '–'} | {value_text(row['seed'])} | {overrides} | "
            f"{row['state']} | " + " | ".join(cells) + " |"
        )
    criteria = summary["criteria"]
    if criteria.get("metric"):
        lines.append("")
        lines.append(
            f"Criterion: `{criteria['metric']}` {criteria.get('direction', 'lower')} by at "
            f"least {criteria.get('threshold')} against the baseline. "
            f"Suggested verdict: **{summary['suggested_verdict']}** (a maintainer records the outcome)."
        )
    return "\n".join(lines)


def plan_summarize(*, plan_id: int) -> dict[str, Any]:
    launch = PlanLaunch.objects.get(plan_id=plan_id)
    runs = latest_runs(plan_id=plan_id)
    metrics = final_metrics(runs=runs)
    comparisons, verdict = compare(criteria=launch.criteria, runs=runs, metrics=metrics)
    states: dict[str, int] = {}
    for run in runs:
        states[run.state] = states.get(run.state, 0) + 1
    summary: dict[str, Any] = {
        "plan": plan_id,
        "criteria": launch.criteria,
        "states": states,
        "keys": [k for k in TABLE_KEYS if any(k in m for m in metrics.values())],
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
        "suggested_verdict": verdict,
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
