"""The ladder's projection to a campaign's FLOPs, with an uncertainty band.

The ladder is a plan with scales (``runs.results.ladder``): its baseline's final losses against
FLOPs are fitted with the same law the ladder page states (``ladder_fit``: E + A·C^b from
four scales, A·C^b below) and refused for the same reasons (``fit_problems``): a projection
read off a poor fit is noise with a number on it.

The band is the fit's own uncertainty, from its parameters' covariance (the delta method):
the fit is least squares on log loss, so the covariance of its parameters is
``s² (JᵀJ)⁻¹`` (``J`` the Jacobian of log loss in the parameters, ``s²`` the residual sum of
squares over ``n - p`` degrees of freedom), the standard error of the fitted log loss at a
budget is ``sqrt(gᵀ Cov g)`` (``g`` the gradient there), and the band is the fitted value
± the Student t quantile (95%, one-sided: a 5-95% interval) times that error, back in loss.
It is centred on the line by construction, never clamped to it; it is not drawn (``band``
None, and the page says why) when the fit has no degrees of freedom left or its
covariance is singular. Cached by the ladder's points.
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

BAND_LEVEL = "5–95%"
BAND_METHOD = (
    "the fit's parameter covariance (delta method on log loss, Student t with n − p degrees "
    "of freedom)"
)
GRID_POINTS = 48
CACHE_SECONDS = 3600
# One-sided 95% quantiles of Student's t by degrees of freedom (a 5-95% interval); past 30
# the normal's 1.645. Between two rows the smaller degrees of freedom (the wider) is used.
T_95 = {
    1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860,
    9: 1.833, 10: 1.812, 12: 1.782, 15: 1.753, 20: 1.725, 30: 1.697,
}  # fmt: skip
NORMAL_95 = 1.645


def t_quantile(dof: int) -> float:
    """The one-sided 95% quantile of Student's t with ``dof`` degrees of freedom."""
    if dof > max(T_95):
        return NORMAL_95
    return T_95[max(k for k in T_95 if k <= dof)]


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


def _log_law(theta: np.ndarray, log_flops: np.ndarray, kind: str) -> np.ndarray:
    """log loss under the law: ``log(E + exp(a + b x))`` or, plain, ``a + b x``."""
    if kind == ladders.IRREDUCIBLE_LAW:
        return np.log(theta[0] + np.exp(theta[1] + theta[2] * log_flops))
    return theta[0] + theta[1] * log_flops


def _gradient(theta: np.ndarray, log_flops: np.ndarray, kind: str) -> np.ndarray:
    """d(log loss)/d(parameters), one row per budget."""
    if kind == ladders.IRREDUCIBLE_LAW:
        reducible = np.exp(theta[1] + theta[2] * log_flops)
        total = theta[0] + reducible
        return np.column_stack([1.0 / total, reducible / total, reducible * log_flops / total])
    return np.column_stack([np.ones_like(log_flops), log_flops])


def band_compute(
    *, fit: ladders.PowerLaw, flops: np.ndarray, losses: np.ndarray, grid: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """(low, high) of the 5-95% band at each ``grid`` budget from the fit's parameter
    covariance; None when it cannot be stated (no degrees of freedom, a singular fit)."""
    # The law as the fit states it, in centred log-flops (well conditioned):
    # loss = E + exp(a + b (ln C - centre)), with a = ln A + b centre.
    centre = float(np.log(flops).mean())
    a = math.log(fit.coefficient) + fit.exponent * centre
    if fit.kind == ladders.IRREDUCIBLE_LAW:
        theta = np.array([fit.irreducible, a, fit.exponent])
    else:
        theta = np.array([a, fit.exponent])
    x = np.log(flops) - centre
    dof = len(x) - len(theta)
    if dof < 1:
        return None
    residual = np.log(losses) - _log_law(theta, x, fit.kind)
    variance = float(residual @ residual) / dof
    jac = _gradient(theta, x, fit.kind)
    try:
        covariance = variance * np.linalg.inv(jac.T @ jac)
    except np.linalg.LinAlgError:
        return None
    at = _gradient(theta, np.log(grid) - centre, fit.kind)
    spread = np.einsum("ij,jk,ik->i", at, covariance, at)
    if not np.all(np.isfinite(spread)) or np.any(spread < -1e-12):
        return None
    half = t_quantile(dof) * np.sqrt(np.maximum(spread, 0.0))
    fitted = _log_law(theta, np.log(grid) - centre, fit.kind)
    return np.exp(fitted - half), np.exp(fitted + half)


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
        "band": None,
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
    line = np.array([fit.loss_at(float(x)) for x in grid])
    band = band_compute(fit=fit, flops=flops, losses=losses, grid=np.append(grid, target_flops))
    at_target = fit.loss_at(float(target_flops))
    out["curve"] = {"flops": grid.tolist(), "loss": line.tolist(), "low": None, "high": None}
    out["at_target"] = {"flops": float(target_flops), "loss": at_target, "low": None, "high": None}
    if band is None:
        out["band"] = None
        out["band_missing"] = (
            f"no band: the fit has no degrees of freedom left ({len(flops)} points for "
            f"{3 if fit.kind == ladders.IRREDUCIBLE_LAW else 2} parameters) or a singular covariance"
        )
        return out
    low, high = band
    out["band"] = {"level": BAND_LEVEL, "method": BAND_METHOD}
    out["curve"]["low"], out["curve"]["high"] = low[:-1].tolist(), high[:-1].tolist()
    out["at_target"]["low"], out["at_target"]["high"] = float(low[-1]), float(high[-1])
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
