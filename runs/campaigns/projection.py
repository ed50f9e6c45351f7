"""The ladder's projection to a campaign's FLOPs, with an uncertainty band.

The ladder is a plan with scales (``runs.results.ladder``): its baseline's final losses against
FLOPs are fitted with the same law the ladder page states (``ladder_fit``: E + A·C^b from
four scales, A·C^b below) and refused for the same reasons (``fit_problems``): a projection
read off a poor fit is noise with a number on it. The band is a residual bootstrap: the
fit's residuals in log loss (scaled for the parameters fitted) are resampled onto the fitted values, the law refitted, and the
5th and 95th percentiles of the refits' losses taken at each FLOPs. It is cached by the
ladder's points, since refitting a hundred times costs about a second.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
from django.core.cache import cache

from runs.models import Plan
from runs.results import ladder as ladders
from runs.results import summary as results

BOOTSTRAP_SAMPLES = 100
BAND_PERCENTILES = (5.0, 95.0)
GRID_POINTS = 48
CACHE_SECONDS = 3600


def ladder_points(*, plan: Plan) -> tuple[str, list[tuple[float, float]]]:
    """The ladder's metric and its baseline's (FLOPs, final loss) points (the first
    variant's when there is no baseline)."""
    runs = results.latest_runs(plan_id=plan.pk)
    metrics = results.final_metrics(runs=runs)
    criteria = getattr(getattr(plan, "launch", None), "criteria", None) or {}
    found = results.plan_summary_ladder(plan=plan, runs=runs, metrics=metrics, criteria=criteria)
    if found is None:
        return "", []
    variant = found.baseline or (found.variants[0] if found.variants else None)
    points = [(p.flops, p.loss) for p in variant.points] if variant else []
    return found.metric, points


def _refits(
    flops: np.ndarray, log_fitted: np.ndarray, residuals: np.ndarray, grid: np.ndarray
) -> np.ndarray:
    rng = np.random.default_rng(0)  # the same band on every read
    curves = []
    for _ in range(BOOTSTRAP_SAMPLES):
        sample = np.exp(log_fitted + rng.choice(residuals, size=len(residuals), replace=True))
        fit = ladders.ladder_fit(flops.tolist(), sample.tolist())
        if fit is not None:
            curves.append([fit.loss_at(float(x)) for x in grid])
    return np.array(curves, dtype=np.float64)


def projection_compute(
    *, points: Sequence[tuple[float, float]], target_flops: float, metric: str = ""
) -> dict[str, Any]:
    """The fit, its refusals, and the projected curve with its band up to ``target_flops``."""
    flops = np.array([x for x, _ in points], dtype=np.float64)
    losses = np.array([y for _, y in points], dtype=np.float64)
    fit = ladders.ladder_fit(flops.tolist(), losses.tolist())
    refusals = ladders.fit_problems(fit, who="the ladder's baseline")
    out: dict[str, Any] = {
        "metric": metric,
        "points": [[float(x), float(y)] for x, y in points],
        "refusals": refusals,
        "fit": None,
        "curve": None,
    }
    if fit is None:
        return out
    out["fit"] = {
        "law": fit.kind,
        "irreducible": fit.irreducible,
        "coefficient": fit.coefficient,
        "exponent": fit.exponent,
        "exponent_se": fit.exponent_se,
        "r_squared": fit.r_squared,
        "scales": fit.scales,
    }
    if refusals or not target_flops > 0:
        return out
    low_x = math.log10(float(flops.min()))
    high_x = math.log10(max(float(target_flops), float(flops.max())))
    grid = np.logspace(low_x, high_x, GRID_POINTS)
    log_fitted = np.log([fit.loss_at(float(x)) for x in flops])
    # Fitted residuals are smaller than the noise by the parameters the fit spent on them:
    # scaled back up (sqrt(n / (n - p))), as a residual bootstrap does.
    spent = 3 if fit.kind == ladders.IRREDUCIBLE_LAW else 2
    residuals = np.log(losses) - log_fitted
    residuals *= math.sqrt(len(residuals) / max(1, len(residuals) - spent))
    refits = _refits(flops, log_fitted, residuals, grid)
    line = np.array([fit.loss_at(float(x)) for x in grid])
    if len(refits):
        low, high = np.percentile(refits, BAND_PERCENTILES, axis=0)
    else:
        low = high = line
    at_target = fit.loss_at(float(target_flops))
    target_low, target_high = (
        np.percentile(refits[:, -1], BAND_PERCENTILES) if len(refits) else (at_target, at_target)
    )
    out["curve"] = {
        "flops": grid.tolist(),
        "loss": line.tolist(),
        "low": np.minimum(low, line).tolist(),
        "high": np.maximum(high, line).tolist(),
    }
    out["at_target"] = {
        "flops": float(target_flops),
        "loss": at_target,
        "low": float(min(target_low, at_target)),
        "high": float(max(target_high, at_target)),
    }
    return out


def campaign_projection(*, plan: Plan | None, target_flops: float) -> dict[str, Any] | None:
    """The projection of the campaign's ladder plan, cached by its points; None without one."""
    if plan is None:
        return None
    metric, points = ladder_points(plan=plan)
    digest = hashlib.sha256(orjson.dumps([metric, points, target_flops])).hexdigest()[:32]
    key = f"campaigns:projection:{plan.pk}:{digest}"
    found = cache.get(key)
    if found is None:
        found = projection_compute(points=points, target_flops=target_flops, metric=metric)
        found["plan"] = plan.pk
        cache.set(key, found, CACHE_SECONDS)
    return found
