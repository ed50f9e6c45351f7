"""Marin's Agent MoE gates (``experiments/grug/moe/agent.md`` in the Marin repository).

``effective_speedup`` (gate 1 at the two small scales, the first half of gate 2 at all
four): the law ``loss(C) = L_inf + A * C^(-alpha)`` has a fixed exponent (0.0941) and a
pinned asymptote (1.6). At each scale ``A`` is refit through the baseline's (budget, final
loss) point, ``A = (baseline_loss - L_inf) * budget^alpha``; the compute the baseline would
need to reach the variant's loss is ``C = (A / (variant_loss - L_inf))^(1/alpha)``, so the
stepwise speedup ``C / budget`` is ``((baseline_loss - L_inf) / (variant_loss - L_inf))^(1/alpha)``,
and times ``variant_tps / baseline_tps`` it is the wall-clock speedup (Marin's
``(C / baseline_tps) / (budget / variant_tps)``). A scale passes when the speedup is above 1;
the rule passes when every scale given does.

``pinned_refit`` (gate 2's second half): ``loss(C) = L_inf + A * C^(-alpha)`` fitted by least
squares on the loss with ``L_inf`` pinned, ``A`` and ``alpha`` free, then projected to
budgets (1e21 and 1e23 FLOPs). For a fixed ``alpha`` the best ``A`` is closed-form, so the
fit is a one-dimensional search over ``alpha`` (a grid, then golden-section refinement).
With a baseline law given, it passes when every projection is below the baseline's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from runs.verdicts.base import (
    Param,
    Refusal,
    Rule,
    Verdict,
    g,
    list_at,
    mapping_at,
    name_at,
    number_at,
)

MARIN_ASYMPTOTE = 1.6  # L_inf of the May recipe's drop-1e18 fit (agent.md)
MARIN_ALPHA = 0.0941
MARIN_PROJECTION_BUDGETS = [1e21, 1e23]
LOSS_KEY = "eval/paloma/macro_loss"  # final value, read once the run is finished
THROUGHPUT_KEY = "throughput/tokens_per_second"  # mean of the last 100 steps
THROUGHPUT_WINDOW = 100

EFFECTIVE_SPEEDUP = "effective_speedup"
PINNED_REFIT = "pinned_refit"

_ASYMPTOTE = Param(
    "asymptote",
    MARIN_ASYMPTOTE,
    "the pinned irreducible loss L_inf",
    low=0.0,
    high=100.0,
)
_METRIC = Param(
    "metric",
    LOSS_KEY,
    "the loss read from each finished run (its final value)",
    choices=(LOSS_KEY, "eval/loss", "train/loss"),
)
_ALPHA_GRID = np.linspace(1e-4, 3.0, 3000)  # the refit's exponent is searched in (0, 3]
_GOLDEN = (math.sqrt(5) - 1) / 2


def speedup_at(
    *,
    baseline_loss: float,
    variant_loss: float,
    baseline_tps: float,
    variant_tps: float,
    asymptote: float,
    alpha: float,
) -> tuple[float, float]:
    """(stepwise, wall-clock) speedup of the variant at one scale; the budget cancels."""
    stepwise = ((baseline_loss - asymptote) / (variant_loss - asymptote)) ** (1.0 / alpha)
    return stepwise, stepwise * variant_tps / baseline_tps


def _effective_speedup(params: dict[str, Any], data: Mapping[str, Any]) -> Verdict:
    rule = EFFECTIVE_SPEEDUP
    floor, alpha = params["asymptote"], params["alpha"]
    scales = list_at(data, "scales", rule=rule)
    names: set[str] = set()
    rows: list[dict[str, Any]] = []
    steps: list[str] = []
    inputs: list[str] = []
    passes: list[bool] = []
    for i, scale in enumerate(scales):
        where = f"scales[{i}]"
        name = name_at(scale, rule=rule, where=where, fallback=f"scale {i + 1}")
        if name in names:
            raise Refusal(
                rule=rule,
                field=f"{where}.name",
                problem=f"scale {name!r} is given twice: one baseline and one variant per scale",
            )
        names.add(name)
        budget = number_at(scale, "budget", rule=rule, where=where, positive=True)
        for side in ("baseline", "variant"):
            if side not in scale:
                raise Refusal(
                    rule=rule,
                    field=f"{where}.{side}",
                    problem=f"is missing: scale {name!r} needs both a baseline and a variant",
                )
        sides = {
            side: mapping_at(scale, side, rule=rule, where=where)
            for side in ("baseline", "variant")
        }
        loss = {
            side: number_at(
                sides[side],
                "loss",
                rule=rule,
                where=f"{where}.{side}",
                above=floor,
                above_what="the asymptote",
            )
            for side in sides
        }
        tps = {
            side: number_at(
                sides[side], "tokens_per_second", rule=rule, where=f"{where}.{side}", positive=True
            )
            for side in sides
        }
        for side, figures in sides.items():
            source = figures.get("source")
            if isinstance(source, str) and source:
                inputs.append(f"{name} {side}: {source[:300]}")
        stepwise, speedup = speedup_at(
            baseline_loss=loss["baseline"],
            variant_loss=loss["variant"],
            baseline_tps=tps["baseline"],
            variant_tps=tps["variant"],
            asymptote=floor,
            alpha=alpha,
        )
        if not (math.isfinite(stepwise) and math.isfinite(speedup)):
            raise Refusal(
                rule=rule,
                field=where,
                problem="the speedup overflows: the losses are too far apart",
            )
        passed = speedup > 1.0
        coefficient = (loss["baseline"] - floor) * budget**alpha
        needed = stepwise * budget
        steps += [
            f"{name}: A = ({g(loss['baseline'])} − {g(floor)}) × {g(budget)}^{g(alpha)} = "
            f"{g(coefficient)}; the baseline reaches {g(loss['variant'])} at "
            f"C = (A / ({g(loss['variant'])} − {g(floor)}))^(1/{g(alpha)}) = {g(needed)} FLOPs",
            f"{name}: stepwise = C / budget = {g(stepwise)}; speedup = {g(stepwise)} × "
            f"{g(tps['variant'])} / {g(tps['baseline'])} = {g(speedup)} "
            f"{'> 1: passes' if passed else '≤ 1: does not pass'}",
        ]
        rows.append({"name": name, "stepwise": stepwise, "speedup": speedup, "passed": passed})
        passes.append(passed)
    everything = all(passes)
    steps.append(
        f"passed: speedup above 1 at {'every' if everything else 'not every'} scale "
        f"({sum(passes)} of {len(rows)})"
    )
    return Verdict(
        rule=rule,
        version=1,
        parameters=params,
        result={"scales": rows, "passed": everything},
        steps=steps,
        inputs=inputs,
        passed=everything,
    )


def _fit_for_alpha(alpha: float, budgets: np.ndarray, reducible: np.ndarray) -> tuple[float, float]:
    """The least-squares A for a fixed alpha, and the residual sum of squares."""
    x = budgets ** (-alpha)
    coefficient = float(x @ reducible) / float(x @ x)
    residual = reducible - coefficient * x
    return coefficient, float(residual @ residual)


def pinned_fit(
    budgets: np.ndarray, losses: np.ndarray, asymptote: float
) -> tuple[float, float, float | None]:
    """``(A, alpha, r2)`` of ``loss = asymptote + A * C^(-alpha)`` by least squares on the
    loss; ``r2`` is None when the losses do not vary."""
    reducible = losses - asymptote
    # Every grid exponent at once: x[i, j] = budget_j ** -alpha_i, the best A per row.
    x = np.exp(-_ALPHA_GRID[:, None] * np.log(budgets)[None, :])
    best_a = (x @ reducible) / np.einsum("ij,ij->i", x, x)
    errors = np.sum((reducible[None, :] - best_a[:, None] * x) ** 2, axis=1)
    k = int(np.argmin(errors))
    low = float(_ALPHA_GRID[max(k - 1, 0)])
    high = float(_ALPHA_GRID[min(k + 1, len(_ALPHA_GRID) - 1)])
    # Golden-section search inside the grid's best bracket (the error is smooth in alpha).
    a, b = low, high
    c, d = b - _GOLDEN * (b - a), a + _GOLDEN * (b - a)
    fc, fd = _fit_for_alpha(c, budgets, reducible)[1], _fit_for_alpha(d, budgets, reducible)[1]
    for _ in range(80):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - _GOLDEN * (b - a)
            fc = _fit_for_alpha(c, budgets, reducible)[1]
        else:
            a, c, fc = c, d, fd
            d = a + _GOLDEN * (b - a)
            fd = _fit_for_alpha(d, budgets, reducible)[1]
    alpha = (a + b) / 2
    coefficient, error = _fit_for_alpha(alpha, budgets, reducible)
    total = float(np.sum((losses - losses.mean()) ** 2))
    return coefficient, alpha, (1.0 - error / total) if total > 0 else None


def _pinned_refit(params: dict[str, Any], data: Mapping[str, Any]) -> Verdict:
    rule = PINNED_REFIT
    floor = params["asymptote"]
    points = list_at(data, "points", rule=rule, minimum=2)
    budgets, losses = [], []
    for i, point in enumerate(points):
        where = f"points[{i}]"
        budgets.append(number_at(point, "budget", rule=rule, where=where, positive=True))
        losses.append(
            number_at(
                point, "loss", rule=rule, where=where, above=floor, above_what="the asymptote"
            )
        )
    if len(set(budgets)) < 2:
        raise Refusal(
            rule=rule,
            field="points",
            problem="all points share one budget: a refit needs at least two distinct budgets",
        )
    coefficient, alpha, r2 = pinned_fit(np.array(budgets), np.array(losses), floor)
    if coefficient <= 0 or alpha <= float(_ALPHA_GRID[1]):
        raise Refusal(
            rule=rule,
            field="points",
            problem="the losses do not fall with compute: no positive A and alpha fit them",
        )
    if alpha >= float(_ALPHA_GRID[-2]):
        raise Refusal(
            rule=rule,
            field="points",
            problem=f"the best exponent is at the edge of the search ({_ALPHA_GRID[-1]:g}): "
            "the losses do not follow the law",
        )
    projections = [
        {"budget": budget, "loss": floor + coefficient * budget ** (-alpha)}
        for budget in params["project_to"]
    ]
    steps = [
        f"least squares on the loss of {len(points)} points: "
        f"loss(C) = {g(floor)} + {g(coefficient)} × C^(−{g(alpha)})"
        + (f", R² = {r2:.4f}" if r2 is not None else ", R² undefined (the losses are equal)"),
        *(
            f"at {g(p['budget'])} FLOPs: {g(floor)} + {g(coefficient)} × {g(p['budget'])}^(−{g(alpha)}) "
            f"= {p['loss']:.4f}"
            for p in projections
        ),
    ]
    result: dict[str, Any] = {
        "A": coefficient,
        "alpha": alpha,
        "r2": r2,
        "projections": projections,
    }
    passed: bool | None = None
    if "baseline" in data:
        law = mapping_at(data, "baseline", rule=rule, where="")
        base_a = number_at(law, "A", rule=rule, where="baseline", positive=True)
        base_alpha = number_at(law, "alpha", rule=rule, where="baseline", positive=True)
        base = [
            {"budget": p["budget"], "loss": floor + base_a * p["budget"] ** (-base_alpha)}
            for p in projections
        ]
        passed = all(
            mine["loss"] < theirs["loss"] for mine, theirs in zip(projections, base, strict=True)
        )
        steps += [
            f"at {g(b['budget'])} FLOPs: the baseline's {g(floor)} + {g(base_a)} × "
            f"{g(b['budget'])}^(−{g(base_alpha)}) = {b['loss']:.4f}; the variant's "
            f"{p['loss']:.4f} is {'below' if p['loss'] < b['loss'] else 'not below'} it"
            for p, b in zip(projections, base, strict=True)
        ]
        result["baseline_projections"] = base
        result["passed"] = passed
    return Verdict(
        rule=rule,
        version=1,
        parameters=params,
        result=result,
        steps=steps,
        inputs=[],
        passed=passed,
    )


EFFECTIVE_SPEEDUP_RULE = Rule(
    name=EFFECTIVE_SPEEDUP,
    version=1,
    title="Effective speedup over the baseline at each scale (Agent MoE gate 1)",
    params=(
        _ASYMPTOTE,
        Param(
            "alpha", MARIN_ALPHA, "the fixed exponent of the law", low=0.0, high=3.0, low_open=True
        ),
        _METRIC,
    ),
    inputs=(
        "each scale's budget (training FLOPs)",
        f"the baseline's and the variant's final {LOSS_KEY}",
        f"their {THROUGHPUT_KEY}, the mean of the last {THROUGHPUT_WINDOW} steps",
    ),
    compute=_effective_speedup,
)

PINNED_REFIT_RULE = Rule(
    name=PINNED_REFIT,
    version=1,
    title="Refit with the asymptote pinned, projected to larger budgets (Agent MoE gate 2)",
    params=(
        _ASYMPTOTE,
        Param(
            "project_to",
            MARIN_PROJECTION_BUDGETS,
            "the budgets (FLOPs) to project to",
            low=0.0,
            high=1e30,
            low_open=True,
            many=True,
        ),
        _METRIC,
    ),
    inputs=(
        "the variant's (budget, final loss) points at two or more budgets",
        "optionally the baseline's law (A, alpha) to compare the projections with",
    ),
    compute=_pinned_refit,
)
