"""Scaling ladders: final loss against training FLOPs, a power law per variant, and the
compute multiplier of each variant over the baseline at equal loss (effective speedup).

A power law ``loss = a * flops ** b`` (``b < 0`` when loss falls with compute) is a straight
line in log-log space, ``log loss = log a + b * log flops``, so it is fitted by ordinary least
squares on the logarithms. At equal loss ``L`` the baseline needs ``C_base(L) = (L / a) **
(1 / b)`` FLOPs; a variant's compute multiplier is ``C_base(L) / C_variant(L)``: 2.0 means the
variant reaches the loss with half the compute. When the two exponents differ the multiplier
depends on ``L``; it is stated at the loss the variant's fit reaches at the ladder's largest
compute, where the ladder is most relevant.

Pure functions over numbers, and one builder over runs that were already loaded: no queries.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from runs import presentation
from runs.plans import canonical_json

MIN_POINTS_TO_FIT = 2


@dataclass(frozen=True)
class PowerLaw:
    """``loss = coefficient * flops ** exponent``, fitted in log-log space."""

    coefficient: float
    exponent: float
    r_squared: float
    points: int

    def loss_at(self, flops: float) -> float:
        return self.coefficient * flops**self.exponent

    def flops_at(self, loss: float) -> float | None:
        """The compute at which the fit reaches ``loss``; None for a flat or odd fit."""
        if loss <= 0 or self.exponent == 0:
            return None
        try:
            value = (loss / self.coefficient) ** (1.0 / self.exponent)
        except (OverflowError, ZeroDivisionError):
            return None
        return value if math.isfinite(value) and value > 0 else None


def _usable(x: float, y: float) -> bool:
    return math.isfinite(x) and math.isfinite(y) and x > 0 and y > 0


def power_law_fit(flops: Sequence[float], losses: Sequence[float]) -> PowerLaw | None:
    """Least squares of ``log loss`` on ``log flops``; None without two distinct computes.

    Non-positive and non-finite values cannot be on a log axis and are left out."""
    pairs = [(float(x), float(y)) for x, y in zip(flops, losses, strict=True) if _usable(x, y)]
    if len({x for x, _ in pairs}) < MIN_POINTS_TO_FIT:
        return None
    log_x = np.log([x for x, _ in pairs])
    log_y = np.log([y for _, y in pairs])
    slope, intercept = np.polyfit(log_x, log_y, 1)
    predicted = intercept + slope * log_x
    total = float(np.sum((log_y - log_y.mean()) ** 2))
    residual = float(np.sum((log_y - predicted) ** 2))
    r_squared = 1.0 - residual / total if total > 0 else 1.0
    return PowerLaw(
        coefficient=float(np.exp(intercept)),
        exponent=float(slope),
        r_squared=r_squared,
        points=len(pairs),
    )


def compute_multiplier(*, baseline: PowerLaw, variant: PowerLaw, loss: float) -> float | None:
    """How many times the baseline's compute the variant saves at ``loss`` (>1: it saves)."""
    base_flops = baseline.flops_at(loss)
    variant_flops = variant.flops_at(loss)
    if base_flops is None or variant_flops is None:
        return None
    ratio = base_flops / variant_flops
    return ratio if math.isfinite(ratio) else None


@dataclass(frozen=True)
class LadderPoint:
    flops: float
    loss: float
    run_id: int | None = None
    scale: str = ""
    seed: int | None = None


@dataclass
class LadderVariant:
    key: str
    label: str
    is_baseline: bool
    points: list[LadderPoint] = field(default_factory=list)
    fit: PowerLaw | None = None
    multiplier: float | None = None
    reference_loss: float | None = None
    reference_flops: float | None = None


@dataclass
class Ladder:
    metric: str
    variants: list[LadderVariant]

    @property
    def baseline(self) -> LadderVariant | None:
        return next((v for v in self.variants if v.is_baseline), None)

    @property
    def fitted(self) -> bool:
        return any(v.fit is not None for v in self.variants)

    def chart_data(self) -> dict[str, Any]:
        """uPlot-ready, JSON-safe: one x axis (every point's FLOPs, sorted) and, per
        variant, its points and its fitted line on that axis (None where it has no point)."""
        xs = sorted({p.flops for v in self.variants for p in v.points})
        variants = []
        for variant in self.variants:
            at: dict[float, list[float]] = {}
            for point in variant.points:
                at.setdefault(point.flops, []).append(point.loss)
            variants.append(
                {
                    "label": variant.label,
                    "baseline": variant.is_baseline,
                    "points": [
                        float(np.mean(at[x])) if x in at else None for x in xs
                    ],  # seeds at one scale: their mean, the raw points are in the table
                    "fit": [variant.fit.loss_at(x) for x in xs] if variant.fit else None,
                    "exponent": variant.fit.exponent if variant.fit else None,
                    "multiplier": variant.multiplier,
                }
            )
        return {"metric": self.metric, "x": xs, "variants": variants}


def ladder_build(*, metric: str, variants: Iterable[LadderVariant]) -> Ladder:
    """Fit every variant and state its multiplier over the baseline at equal loss."""
    ladder = Ladder(metric=metric, variants=list(variants))
    all_flops = [p.flops for v in ladder.variants for p in v.points if p.flops > 0]
    top = max(all_flops, default=0.0)
    for variant in ladder.variants:
        variant.fit = power_law_fit(
            [p.flops for p in variant.points], [p.loss for p in variant.points]
        )
    baseline = ladder.baseline
    if baseline is None or baseline.fit is None or top <= 0:
        return ladder
    for variant in ladder.variants:
        if variant.fit is None:
            continue
        variant.reference_flops = top
        variant.reference_loss = variant.fit.loss_at(top)
        variant.multiplier = (
            1.0
            if variant.is_baseline
            else compute_multiplier(
                baseline=baseline.fit, variant=variant.fit, loss=variant.reference_loss
            )
        )
    return ladder


def _variant_label(overrides: Mapping[str, Any]) -> str:
    return presentation.run_label(changes=overrides)


def plan_ladder(
    *, plan: Any, runs: Sequence[Any], values: Mapping[int, Mapping[str, float]], metric: str
) -> Ladder | None:
    """The ladder of a plan with ``scales`` from runs already loaded with their entries.

    ``values`` maps run id to its final metrics. Only finished runs count; a rerun replaces
    the run before it. None when the plan has fewer than two scales."""
    scales = (plan.spec or {}).get("scales") or []
    if len(scales) < MIN_POINTS_TO_FIT:
        return None
    latest: dict[int, Any] = {}
    for run in runs:
        if run.state == "finished":
            latest[run.entry_id] = run
    variants: dict[str, LadderVariant] = {}
    for run in sorted(latest.values(), key=lambda r: r.entry.index):
        entry = run.entry
        key = "baseline" if entry.is_baseline else canonical_json(entry.overrides or entry.diff)
        variant = variants.get(key)
        if variant is None:
            label = "baseline" if entry.is_baseline else _variant_label(entry.overrides)
            variant = variants[key] = LadderVariant(
                key=key, label=label, is_baseline=key == "baseline"
            )
        loss = (values.get(run.pk) or {}).get(metric)
        if loss is None or not _usable(entry.flops, loss):
            continue
        variant.points.append(
            LadderPoint(
                flops=entry.flops, loss=loss, run_id=run.pk, scale=entry.scale, seed=entry.seed
            )
        )
    ordered = sorted(variants.values(), key=lambda v: (not v.is_baseline, v.label))
    return ladder_build(metric=metric, variants=ordered)
