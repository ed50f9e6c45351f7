"""A plan's preregistered verdict, computed from its finished runs.

The launch's criteria carry the rule the proposal preregistered (``criteria["rule"]``,
frozen at approval). Per variant, the inputs are gathered from the latest run of each entry:
only finished runs count (a failed or canceled attempt is no input), seeds at one scale are
averaged, the loss is the run's final value of the rule's metric, the throughput the mean
of its last ``THROUGHPUT_WINDOW`` logged steps, the budget the entry's training FLOPs. An
input that is not there is named ("d768: the variant has no finished run") and that
variant gets no verdict, never one from the inputs that remain.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from django.db.models import F, Window
from django.db.models.functions import RowNumber

from runs.models import MetricPoint, Run, RunState
from runs.results.ladder import variant_key, variant_label
from runs.results.presentation import BASELINE_LABEL, metric_text
from runs.verdicts.base import Refusal
from runs.verdicts.gates import (
    EFFECTIVE_SPEEDUP,
    PINNED_REFIT,
    THROUGHPUT_KEY,
    THROUGHPUT_WINDOW,
    pinned_fit,
)
from runs.verdicts.rules import rule_parameters, verdict_run

PLAN_RULES = (EFFECTIVE_SPEEDUP, PINNED_REFIT)


def tail_means(
    *, run_ids: Sequence[int], key: str = THROUGHPUT_KEY, window: int = THROUGHPUT_WINDOW
) -> dict[int, float]:
    """Each run's mean of its last ``window`` logged values of ``key`` (by step), in one
    query (a window function numbers each run's points from its last step)."""
    if not run_ids:
        return {}
    ranked = (
        MetricPoint.objects.filter(run_id__in=list(run_ids), key=key)
        .annotate(rank=Window(RowNumber(), partition_by=[F("run_id")], order_by=F("step").desc()))
        .filter(rank__lte=window)
        .values_list("run_id", "value")
    )
    found: dict[int, list[float]] = {}
    for run_id, value in ranked:
        found.setdefault(run_id, []).append(value)
    return {run_id: float(np.mean(values)) for run_id, values in found.items()}


class _Cell:
    """One variant at one scale: its finished runs' losses and tail throughputs."""

    def __init__(self) -> None:
        self.runs: list[int] = []
        self.seeds: list[Any] = []
        self.losses: list[float] = []
        self.speeds: list[float] = []
        self.budget: float | None = None
        self.unfinished: list[str] = []
        self.label = ""

    def source(self, metric: str) -> str:
        return (
            f"runs {', '.join(map(str, self.runs))} (seeds "
            f"{', '.join('–' if s is None else str(s) for s in self.seeds)}): final {metric}, "
            f"{THROUGHPUT_KEY} mean of the last {THROUGHPUT_WINDOW} steps"
        )


def _cells(
    *,
    runs: Sequence[Run],
    metrics: Mapping[int, Mapping[str, float]],
    metric: str,
    want_speed: bool,
) -> dict[tuple[str, str], _Cell]:
    cells: dict[tuple[str, str], _Cell] = {}
    labels: dict[str, str] = {}
    speeds = (
        tail_means(run_ids=[r.pk for r in runs if r.state == RunState.FINISHED])
        if want_speed
        else {}
    )
    for run in runs:
        entry = run.entry
        key = variant_key(entry)
        labels[key] = variant_label(entry)
        cell = cells.setdefault((key, entry.scale or ""), _Cell())
        if run.state != RunState.FINISHED:
            cell.unfinished.append(f"run {run.pk} is {run.state}")
            continue
        loss = (metrics.get(run.pk) or {}).get(metric)
        if loss is None:
            cell.unfinished.append(f"run {run.pk} logged no {metric}")
            continue
        speed = speeds.get(run.pk) if want_speed else None
        if want_speed and speed is None:
            cell.unfinished.append(f"run {run.pk} logged no {THROUGHPUT_KEY}")
            continue
        cell.runs.append(run.pk)
        cell.seeds.append(entry.seed)
        cell.losses.append(float(loss))
        if speed is not None:
            cell.speeds.append(speed)
        cell.budget = float(entry.flops)
    for (key, _scale), cell in cells.items():
        cell.label = labels[key]
    return cells


def _missing(cell: _Cell | None, *, who: str, scale: str) -> str | None:
    if cell is not None and cell.runs:
        return None
    why = "; ".join(cell.unfinished) if cell is not None and cell.unfinished else "no run"
    return f"{scale or 'the plan'}: the {who} has no finished run ({why})"


def plan_verdicts(
    *, spec: Any, runs: Sequence[Run], metrics: Mapping[int, Mapping[str, float]]
) -> dict[str, Any]:
    """``{"rule", "parameters", "variants": [{"label", "missing", "verdict"}], "refused"}``:
    the preregistered rule's verdict for each variant of the plan."""
    try:
        rule, params = rule_parameters(spec)
    except Refusal as refusal:
        return {"rule": None, "parameters": None, "variants": [], "refused": str(refusal)}
    out: dict[str, Any] = {"rule": rule.name, "version": rule.version, "parameters": params}
    out["variants"] = []
    out["refused"] = None
    if rule.name not in PLAN_RULES:
        out["refused"] = (
            f"the rule {rule.name} ranks entries on the board; it gives no verdict on one plan"
        )
        return out
    metric = params["metric"]
    cells = _cells(
        runs=runs, metrics=metrics, metric=metric, want_speed=rule.name == EFFECTIVE_SPEEDUP
    )
    scales = sorted(
        {scale for _key, scale in cells},
        key=lambda s: min((c.budget or 0.0) for (k, sc), c in cells.items() if sc == s),
    )
    variant_keys = sorted({key for key, _scale in cells if key != "baseline"})
    for key in variant_keys:
        label = next(c.label for (k, _s), c in cells.items() if k == key)
        missing = []
        for scale in scales:
            if (key, scale) not in cells and ("baseline", scale) in cells:
                continue  # the variant was not planned at this scale
            for who, cell_key in ((BASELINE_LABEL, "baseline"), ("variant", key)):
                problem = _missing(cells.get((cell_key, scale)), who=who, scale=scale)
                if problem:
                    missing.append(problem)
        row: dict[str, Any] = {
            "label": label,
            "missing": missing,
            "verdict": None,
            "refused": None,
            "figures": None,
        }
        out["variants"].append(row)
        if missing:
            continue
        planned = [s for s in scales if (key, s) in cells]
        payload = _payload(rule.name, params, cells, key, planned, metric)
        row["figures"] = payload  # what ``manage.py verdict_check`` would be given
        try:
            row["verdict"] = verdict_run(rule=rule, params=params, data=payload).as_dict()
        except Refusal as refusal:
            row["refused"] = str(refusal)
    return out


def _payload(  # noqa: PLR0917 (one private helper, called once)
    rule: str,
    params: Mapping[str, Any],
    cells: Mapping[tuple[str, str], _Cell],
    key: str,
    scales: Sequence[str],
    metric: str,
) -> dict[str, Any]:
    if rule == EFFECTIVE_SPEEDUP:
        rows = []
        for scale in scales:
            base, mine = cells[("baseline", scale)], cells[(key, scale)]
            rows.append(
                {
                    "name": scale or "the plan",
                    "budget": base.budget,
                    "baseline": {
                        "loss": float(np.mean(base.losses)),
                        "tokens_per_second": float(np.mean(base.speeds)),
                        "source": base.source(metric),
                    },
                    "variant": {
                        "loss": float(np.mean(mine.losses)),
                        "tokens_per_second": float(np.mean(mine.speeds)),
                        "source": mine.source(metric),
                    },
                }
            )
        return {"scales": rows}
    points = [
        {"budget": cells[(key, s)].budget, "loss": float(np.mean(cells[(key, s)].losses))}
        for s in scales
    ]
    base_points = [
        (cells[("baseline", s)].budget, float(np.mean(cells[("baseline", s)].losses)))
        for s in scales
        if ("baseline", s) in cells
    ]
    payload: dict[str, Any] = {"points": points}
    if len({b for b, _ in base_points}) >= 2:
        a, alpha, _r2 = pinned_fit(
            np.array([b for b, _ in base_points]),
            np.array([y for _, y in base_points]),
            float(params["asymptote"]),
        )
        if a > 0:
            payload["baseline"] = {"A": a, "alpha": alpha}
    return payload


def verdicts_markdown(verdicts: Mapping[str, Any]) -> str:
    """The preregistered rule's verdicts for the result comment and the page."""
    if verdicts.get("refused") and not verdicts.get("variants"):
        return f"**Preregistered rule**: no verdict, because {verdicts['refused']}."
    params = ", ".join(f"{k} = {v}" for k, v in (verdicts.get("parameters") or {}).items())
    lines = [
        f"**Preregistered rule**: `{verdicts['rule']}` v{verdicts.get('version', 1)} ({params})"
    ]
    for row in verdicts.get("variants") or []:
        lines.append("")
        if row["missing"]:
            lines.append(
                f"- {row['label']}: no verdict, an input is missing: " + "; ".join(row["missing"])
            )
            continue
        if row["refused"]:
            lines.append(f"- {row['label']}: no verdict, because {row['refused']}")
            continue
        verdict = row["verdict"]
        outcome = {True: "passes", False: "does not pass", None: "decides nothing"}[
            verdict["passed"]
        ]
        lines.append(f"- {row['label']}: **{outcome}**")
        lines += [f"  - input: {text}" for text in verdict["inputs"]]
        lines += [f"  - {step}" for step in verdict["steps"]]
        if verdict["rule"] == EFFECTIVE_SPEEDUP:
            speeds = ", ".join(
                f"{s['name']} {metric_text(s['speedup'], 'speedup')}"
                for s in verdict["result"]["scales"]
            )
            lines.append(f"  - speedups: {speeds}")
    return "\n".join(lines)
