"""Marin speedrun tracks (``experiments/speedrun`` in the Marin repository): C4-EN bits per
byte (``eval/paloma/c4_en/bpb``) against training FLOPs.

``speedrun_threshold``: "fastest to at most X C4-EN BPB": entries whose final BPB is at most
the threshold qualify, ranked by their training FLOPs (fewest first; equal FLOPs by BPB).

``speedrun_scaling``: a family of sizes fitted log-log, ``log10 bpb = intercept + slope *
log10 flops`` by least squares, ranked by the BPB it projects at a reference budget, with the
fit's R² (in log space) beside it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from runs.verdicts.base import Param, Refusal, Rule, Verdict, g, list_at, name_at, number_at

BPB_KEY = "eval/paloma/c4_en/bpb"
SPEEDRUN_THRESHOLD = "speedrun_threshold"
SPEEDRUN_SCALING = "speedrun_scaling"


def _entries(data: Mapping[str, Any], *, rule: str, key: str, minimum: int) -> list[dict[str, Any]]:
    rows = []
    for i, item in enumerate(list_at(data, key, rule=rule, minimum=minimum)):
        where = f"{key}[{i}]"
        rows.append(
            {
                "name": name_at(item, rule=rule, where=where, fallback=f"entry {i + 1}"),
                "bpb": number_at(item, "bpb", rule=rule, where=where, positive=True),
                "flops": number_at(item, "flops", rule=rule, where=where, positive=True),
            }
        )
    return rows


def _threshold(params: dict[str, Any], data: Mapping[str, Any]) -> Verdict:
    threshold = params["threshold"]
    rows = _entries(data, rule=SPEEDRUN_THRESHOLD, key="entries", minimum=1)
    qualifying = sorted(
        (r for r in rows if r["bpb"] <= threshold), key=lambda r: (r["flops"], r["bpb"], r["name"])
    )
    ranks = {id(r): i + 1 for i, r in enumerate(qualifying)}
    entries = [{**r, "qualifies": r["bpb"] <= threshold, "rank": ranks.get(id(r))} for r in rows]
    steps = [
        f"{r['name']}: {g(r['bpb'])} BPB "
        + (
            f"≤ {g(threshold)}: qualifies with {g(r['flops'])} FLOPs, rank {ranks[id(r)]}"
            if r["bpb"] <= threshold
            else f"> {g(threshold)}: does not qualify"
        )
        for r in rows
    ]
    winner = qualifying[0]["name"] if qualifying else None
    return Verdict(
        rule=SPEEDRUN_THRESHOLD,
        version=1,
        parameters=params,
        result={"entries": entries, "winner": winner},
        steps=steps,
        passed=winner is not None,
    )


def loglog_fit(flops: np.ndarray, bpb: np.ndarray) -> tuple[float, float, float | None]:
    """``(slope, intercept, r2)`` of ``log10 bpb`` on ``log10 flops``; r2 None without spread."""
    x, y = np.log10(flops), np.log10(bpb)
    slope, intercept = np.polyfit(x, y, 1)
    residual = float(np.sum((y - (intercept + slope * x)) ** 2))
    total = float(np.sum((y - y.mean()) ** 2))
    return float(slope), float(intercept), (1.0 - residual / total) if total > 0 else None


def _scaling(params: dict[str, Any], data: Mapping[str, Any]) -> Verdict:
    rule = SPEEDRUN_SCALING
    minimum = int(params["min_points"])
    rows = _entries(data, rule=rule, key="points", minimum=minimum)
    if len({r["flops"] for r in rows}) < 2:
        raise Refusal(
            rule=rule,
            field="points",
            problem="all points share one budget: a fit needs at least two distinct budgets",
        )
    slope, intercept, r2 = loglog_fit(
        np.array([r["flops"] for r in rows]), np.array([r["bpb"] for r in rows])
    )
    reference = params["reference_budget"]
    projected = 10 ** (intercept + slope * math.log10(reference))
    steps = [
        f"least squares on {len(rows)} points: log10 bpb = {g(intercept)} + {g(slope)} × "
        "log10 FLOPs" + (f", R² = {r2:.4f}" if r2 is not None else ", R² undefined"),
        f"at {g(reference)} FLOPs: 10^({g(intercept)} + {g(slope)} × {g(math.log10(reference))}) "
        f"= {projected:.4f} BPB",
    ]
    return Verdict(
        rule=rule,
        version=1,
        parameters=params,
        result={
            "slope": slope,
            "intercept": intercept,
            "r2": r2,
            "reference_budget": reference,
            "projected_bpb": projected,
        },
        steps=steps,
    )


THRESHOLD_RULE = Rule(
    name=SPEEDRUN_THRESHOLD,
    version=1,
    title="Fastest to at most a C4-EN BPB (speedrun threshold track)",
    params=(
        Param("threshold", 1.3, "the BPB an entry must reach", low=0.0, high=10.0, low_open=True),
    ),
    inputs=(f"each entry's final {BPB_KEY}", "its training FLOPs"),
    compute=_threshold,
)

SCALING_RULE = Rule(
    name=SPEEDRUN_SCALING,
    version=1,
    title="Projected C4-EN BPB at a reference budget (speedrun scaling track)",
    params=(
        Param(
            "reference_budget",
            1e21,
            "the budget (FLOPs) the fit is projected to",
            low=0.0,
            high=1e30,
            low_open=True,
        ),
        Param(
            "min_points", 3, "the fewest sizes a fit is made from", low=2, high=100, integer=True
        ),
    ),
    inputs=(f"each size's final {BPB_KEY}", "its training FLOPs"),
    compute=_scaling,
)
