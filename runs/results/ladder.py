"""Scaling ladders: final loss against training FLOPs, a fitted law per variant, and the
effective speedup of each variant over the baseline, or the plain reason why none is stated.

The law. With four or more scales (distinct computes) a variant is fitted with an
irreducible-loss term, ``loss = E + A * flops ** b``, as Marin's ladder analyses do: the
loss a model family would reach with unlimited compute is ``E``, and only the reducible part
falls as a power of compute. With two or three scales ``E`` cannot be fitted honestly (three
parameters through three points always fit), so the plain power law ``loss = A * flops ** b``
(``E = 0``), a straight line in log-log space, is fitted by least squares on the logarithms.
Both are fitted on ``log loss`` (relative errors), and ``R²`` is stated in that space.

The multiplier. At equal loss ``L`` the baseline needs ``C_base(L) = ((L - E) / A) ** (1 / b)``
FLOPs; a variant's compute multiplier is ``C_base(L) / C_variant(L)``: 2.0 means it reaches
the loss with half the compute. ``L`` is the target loss: the one the variant's fit reaches
at the ladder's largest compute, where the ladder matters most. When the variant changes
tokens per second, the same FLOPs take a different time: the throughput ratio is the
variant's steady-state tokens/s over the baseline's at the largest scale both ran, and the
effective speedup (in wall-clock time) is multiplier x throughput ratio.

The refusal. A multiplier read off a poor fit is noise with a number on it. None is stated
unless both the baseline's and the variant's fits have at least ``MIN_SCALES_FOR_MULTIPLIER``
scales, ``R²`` of at least ``MIN_R_SQUARED``, and an exponent at least
``EXPONENT_STANDARD_ERRORS`` standard errors below zero; otherwise the ladder says which test
failed, in words. With three scales the R² test carries most of the weight (a negative slope
with R² >= 0.9 through three points is already three standard errors from zero); the
exponent test catches flat and rising fits, and it is the binding one for four or more.

Pure functions over numbers, and one builder over runs that were already loaded: no queries.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from runs.results import presentation
from runs.specs.ablation import canonical_json

MIN_POINTS_TO_FIT = 2  # a line can be drawn through two scales (it fits them exactly)
MIN_SCALES_FOR_MULTIPLIER = 3
MIN_SCALES_FOR_IRREDUCIBLE = 4  # fewer: E, A and b would fit any three points exactly
# Below 0.9 the law leaves more than a tenth of the spread of log loss across the scales
# unexplained: the points do not follow it, and a compute ratio read off it is not a result.
MIN_R_SQUARED = 0.9
# The exponent must lie at least this many standard errors below zero (about a 95% interval
# under a normal approximation): the loss must clearly fall with compute.
EXPONENT_STANDARD_ERRORS = 2.0
THROUGHPUT_KEY = "throughput/tokens_per_second"

PLAIN_LAW = "plain power law"
IRREDUCIBLE_LAW = "power law with irreducible loss"

_FLOOR_GRID = 128  # candidate irreducible losses per round; each round narrows around the best
_REFINE_ROUNDS = 4


@dataclass(frozen=True)
class PowerLaw:
    """``loss = irreducible + coefficient * flops ** exponent``, fitted on log loss.

    ``irreducible`` is 0 for the plain power law. ``scales`` counts distinct computes,
    ``points`` every point fitted (seeds at one scale are separate points)."""

    coefficient: float
    exponent: float
    r_squared: float
    points: int
    irreducible: float = 0.0
    exponent_se: float | None = None
    scales: int = 0
    kind: str = PLAIN_LAW

    def loss_at(self, flops: float) -> float:
        return self.irreducible + self.coefficient * flops**self.exponent

    def flops_at(self, loss: float) -> float | None:
        """The compute at which the fit reaches ``loss``; None for a flat fit or a loss at
        or below its irreducible loss (never reached)."""
        reducible = loss - self.irreducible
        if reducible <= 0 or self.exponent == 0 or self.coefficient <= 0:
            return None
        try:
            value = (reducible / self.coefficient) ** (1.0 / self.exponent)
        except (OverflowError, ZeroDivisionError):
            return None
        return value if math.isfinite(value) and value > 0 else None

    @property
    def clearly_falling(self) -> bool:
        """The exponent lies EXPONENT_STANDARD_ERRORS standard errors below zero."""
        if self.exponent_se is None or not math.isfinite(self.exponent_se):
            return False
        return self.exponent + EXPONENT_STANDARD_ERRORS * self.exponent_se < 0


def _usable(x: float, y: float) -> bool:
    return math.isfinite(x) and math.isfinite(y) and x > 0 and y > 0


def _pairs(flops: Sequence[float], losses: Sequence[float]) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in zip(flops, losses, strict=True) if _usable(x, y)]


def _r_squared(log_y: np.ndarray, residual: float) -> float:
    total = float(np.sum((log_y - log_y.mean()) ** 2))
    return 1.0 - residual / total if total > 0 else 1.0


def power_law_fit(flops: Sequence[float], losses: Sequence[float]) -> PowerLaw | None:
    """Least squares of ``log loss`` on ``log flops``; None without two distinct computes.

    Non-positive and non-finite values cannot be on a log axis and are left out. The
    exponent's standard error is the slope's, from the residuals (none with two points)."""
    pairs = _pairs(flops, losses)
    scales = len({x for x, _ in pairs})
    if scales < MIN_POINTS_TO_FIT:
        return None
    log_x = np.log([x for x, _ in pairs])
    log_y = np.log([y for _, y in pairs])
    slope, intercept = np.polyfit(log_x, log_y, 1)
    residual = float(np.sum((log_y - (intercept + slope * log_x)) ** 2))
    spread = float(np.sum((log_x - log_x.mean()) ** 2))
    se = math.sqrt(residual / (len(pairs) - 2) / spread) if len(pairs) > 2 else None
    return PowerLaw(
        coefficient=float(np.exp(intercept)),
        exponent=float(slope),
        r_squared=_r_squared(log_y, residual),
        points=len(pairs),
        exponent_se=se,
        scales=scales,
        kind=PLAIN_LAW,
    )


def _floor_residuals(
    floors: np.ndarray, x: np.ndarray, y: np.ndarray, loss: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each candidate irreducible loss E (one per row): the line through
    ``log(loss - E)`` against centred ``log flops``, and the residual sum of squares of
    ``log loss`` under it. Returns (intercepts, slopes, residual sums)."""
    z = np.log(loss[None, :] - floors[:, None])
    slopes = (z @ x) / float(x @ x)  # x is centred: the least-squares slope and intercept
    intercepts = z.mean(axis=1)
    with np.errstate(over="ignore"):
        predicted = np.log(floors[:, None] + np.exp(intercepts[:, None] + slopes[:, None] * x))
    return intercepts, slopes, np.sum((y[None, :] - predicted) ** 2, axis=1)


def _polish(
    theta: np.ndarray, x: np.ndarray, y: np.ndarray, ceiling: float
) -> tuple[np.ndarray, float, np.ndarray]:
    """Gauss-Newton steps (halved until they help) on (E, a, b) of
    ``log loss = log(E + exp(a + b x))``, E kept in [0, ceiling). Returns the parameters,
    the residual sum of squares and the Jacobian at the end."""

    def residuals(t: np.ndarray) -> np.ndarray:
        return y - np.log(t[0] + np.exp(t[1] + t[2] * x))

    def jacobian(t: np.ndarray) -> np.ndarray:
        g = np.exp(t[1] + t[2] * x)
        m = t[0] + g
        return np.column_stack([1.0 / m, g / m, g * x / m])

    best = float(np.sum(residuals(theta) ** 2))
    for _ in range(50):
        jac = jacobian(theta)
        step, *_ = np.linalg.lstsq(jac, residuals(theta), rcond=None)
        scale = 1.0
        while scale > 1e-6:
            trial = theta + scale * step
            trial[0] = min(max(trial[0], 0.0), ceiling)
            value = float(np.sum(residuals(trial) ** 2))
            if math.isfinite(value) and value < best:
                break
            scale /= 2
        else:
            break
        gain = best - value
        theta, best = trial, value
        if gain < 1e-14 * max(best, 1e-30):
            break
    return theta, best, jacobian(theta)


def irreducible_power_law_fit(flops: Sequence[float], losses: Sequence[float]) -> PowerLaw | None:
    """``loss = E + A * flops ** b`` fitted on ``log loss``; None with fewer than
    MIN_SCALES_FOR_IRREDUCIBLE distinct computes.

    For each candidate E in [0, the lowest loss) the best line through ``log(loss - E)`` is
    closed-form; the E whose line leaves the least error in log loss is found on a grid,
    narrowed in finer grids around the best, then all three parameters are refined by
    Gauss-Newton. The exponent's standard error comes
    from the Jacobian there (``s² (JᵀJ)⁻¹`` with ``n - 3`` degrees of freedom)."""
    pairs = _pairs(flops, losses)
    scales = len({x for x, _ in pairs})
    if scales < MIN_SCALES_FOR_IRREDUCIBLE:
        return None
    log_flops = np.log([x for x, _ in pairs])
    centre = float(log_flops.mean())
    x = log_flops - centre
    loss = np.array([y for _, y in pairs])
    y = np.log(loss)
    ceiling = float(loss.min()) * (1 - 1e-9)
    low, high = 0.0, ceiling
    plain_error = math.inf
    for _ in range(_REFINE_ROUNDS):  # a grid over [low, high], then a finer one around its best
        floors = np.linspace(low, high, _FLOOR_GRID, endpoint=False)
        _, _, errors = _floor_residuals(floors, x, y, loss)
        errors = np.where(np.isfinite(errors), errors, np.inf)
        if low == 0.0:
            plain_error = min(plain_error, float(errors[0]))
        k = int(np.argmin(errors))
        floor, best_error = float(floors[k]), float(errors[k])
        step = floors[1] - floors[0]
        low, high = max(floor - step, 0.0), min(floor + step, ceiling)
    if plain_error <= best_error:  # a plain power law (E = 0) is as good: keep it exact
        floor = 0.0
    intercept, slope, _ = _floor_residuals(np.array([floor]), x, y, loss)
    theta, residual, jac = _polish(
        np.array([floor, float(intercept[0]), float(slope[0])]), x, y, ceiling
    )
    se: float | None = None
    dof = len(pairs) - 3
    if dof > 0:
        try:
            covariance = residual / dof * np.linalg.inv(jac.T @ jac)
            variance = float(covariance[2, 2])
            se = math.sqrt(variance) if variance >= 0 else None
        except np.linalg.LinAlgError:
            se = None
    irreducible, a, b = (float(v) for v in theta)
    return PowerLaw(
        coefficient=math.exp(a - b * centre),
        exponent=b,
        r_squared=_r_squared(y, residual),
        points=len(pairs),
        irreducible=irreducible,
        exponent_se=se,
        scales=scales,
        kind=IRREDUCIBLE_LAW,
    )


def ladder_fit(flops: Sequence[float], losses: Sequence[float]) -> PowerLaw | None:
    """The law a ladder fits: with an irreducible loss from MIN_SCALES_FOR_IRREDUCIBLE
    scales on, the plain power law below that."""
    scales = len({x for x, _ in _pairs(flops, losses)})
    if scales >= MIN_SCALES_FOR_IRREDUCIBLE:
        return irreducible_power_law_fit(flops, losses)
    return power_law_fit(flops, losses)


def compute_multiplier(*, baseline: PowerLaw, variant: PowerLaw, loss: float) -> float | None:
    """How many times the baseline's compute the variant saves at ``loss`` (>1: it saves)."""
    base_flops = baseline.flops_at(loss)
    variant_flops = variant.flops_at(loss)
    if base_flops is None or variant_flops is None:
        return None
    ratio = base_flops / variant_flops
    return ratio if math.isfinite(ratio) else None


def fit_problems(fit: PowerLaw | None, *, who: str) -> list[str]:
    """Why ``fit`` cannot carry a multiplier, in words (empty when it can)."""
    if fit is None:
        return [f"{who} has fewer than {MIN_POINTS_TO_FIT} scales with a result: nothing to fit"]
    problems = []
    if fit.scales < MIN_SCALES_FOR_MULTIPLIER:
        problems.append(
            f"{who} has {fit.scales} scales; a multiplier needs at least "
            f"{MIN_SCALES_FOR_MULTIPLIER} (a line through two points always fits them)"
        )
    if fit.r_squared < MIN_R_SQUARED:
        problems.append(
            f"{who}'s fit has R² {presentation.r_squared_text(fit.r_squared)}, below "
            f"{MIN_R_SQUARED}: "
            "its losses do not follow a power law in compute"
        )
    if fit.scales >= MIN_SCALES_FOR_MULTIPLIER and not fit.clearly_falling:
        exponent = presentation.exponent_text(fit.exponent, fit.exponent_se)
        problems.append(
            f"{who}'s exponent ({exponent}) is not clearly below zero: "
            "its loss does not clearly fall with compute"
        )
    return problems


@dataclass(frozen=True)
class LadderPoint:
    flops: float
    loss: float
    run_id: int | None = None
    scale: str = ""
    seed: int | None = None
    tokens_per_second: float | None = None


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
    refusals: list[str] = field(default_factory=list)
    throughput_ratio: float | None = None
    throughput_scale: str = ""
    effective_speedup: float | None = None

    def as_summary(self) -> dict[str, Any]:
        """JSON-safe, for the plan summary and the result comment."""
        fit = self.fit
        return {
            "label": self.label,
            "baseline": self.is_baseline,
            "scales": fit.scales if fit else len({p.flops for p in self.points}),
            "law": fit.kind if fit else None,
            "exponent": fit.exponent if fit else None,
            "exponent_se": fit.exponent_se if fit else None,
            "irreducible": fit.irreducible if fit and fit.kind == IRREDUCIBLE_LAW else None,
            "r_squared": fit.r_squared if fit else None,
            "target_loss": self.reference_loss,
            "multiplier": self.multiplier,
            "throughput_ratio": self.throughput_ratio,
            "throughput_scale": self.throughput_scale,
            "effective_speedup": self.effective_speedup,
            "refusals": list(self.refusals),
        }


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

    @property
    def refused(self) -> list[LadderVariant]:
        """The variants with no multiplier, and reasons for it."""
        return [v for v in self.variants if v.refusals]

    @property
    def top_flops(self) -> float | None:
        return next((v.reference_flops for v in self.variants if v.reference_flops), None)

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

    def as_summary(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "target_flops": self.top_flops,
            "variants": [v.as_summary() for v in self.variants],
        }


def _mean_throughput(points: Iterable[LadderPoint]) -> float | None:
    values = [p.tokens_per_second for p in points if p.tokens_per_second]
    return float(np.mean(values)) if values else None


def _throughput_ratio(baseline: LadderVariant, variant: LadderVariant) -> tuple[float | None, str]:
    """The variant's tokens/s over the baseline's (means over seeds) at the largest scale
    where both have it; and that scale's name."""
    common = sorted(
        {p.flops for p in baseline.points if p.tokens_per_second}
        & {p.flops for p in variant.points if p.tokens_per_second},
        reverse=True,
    )
    if not common:
        return None, ""
    flops = common[0]
    base = _mean_throughput(p for p in baseline.points if p.flops == flops)
    mine = _mean_throughput(p for p in variant.points if p.flops == flops)
    if not base or mine is None:
        return None, ""
    scale = next((p.scale for p in variant.points if p.flops == flops), "")
    return mine / base, scale


def ladder_build(*, metric: str, variants: Iterable[LadderVariant]) -> Ladder:
    """Fit every variant; state its multiplier over the baseline at the target loss, its
    throughput ratio and effective speedup, or why there is no multiplier."""
    ladder = Ladder(metric=metric, variants=list(variants))
    all_flops = [p.flops for v in ladder.variants for p in v.points if p.flops > 0]
    top = max(all_flops, default=0.0)
    for variant in ladder.variants:
        variant.fit = ladder_fit(
            [p.flops for p in variant.points], [p.loss for p in variant.points]
        )
        if variant.fit is not None and top > 0:
            variant.reference_flops = top
            variant.reference_loss = variant.fit.loss_at(top)
    baseline = ladder.baseline
    if baseline is None:
        for variant in ladder.variants:
            variant.refusals = ["the ladder has no finished baseline to compare with"]
        return ladder
    base_problems = fit_problems(baseline.fit, who="the baseline")
    for variant in ladder.variants:
        if variant.is_baseline:
            variant.refusals = base_problems
            variant.multiplier = None if base_problems else 1.0
            if _mean_throughput(variant.points) is not None:
                variant.throughput_ratio = 1.0
                variant.effective_speedup = variant.multiplier
            continue
        problems = base_problems + fit_problems(variant.fit, who="this variant")
        variant.throughput_ratio, variant.throughput_scale = _throughput_ratio(baseline, variant)
        if not problems and baseline.fit and variant.fit and variant.reference_loss is not None:
            variant.multiplier = compute_multiplier(
                baseline=baseline.fit, variant=variant.fit, loss=variant.reference_loss
            )
            if variant.multiplier is None:
                problems.append(
                    f"the baseline's fit never reaches this variant's loss "
                    f"{presentation.metric_text(variant.reference_loss, 'loss')} (its "
                    f"irreducible loss is {presentation.metric_text(baseline.fit.irreducible, 'loss')})"
                )
        variant.refusals = problems
        if variant.multiplier is not None and variant.throughput_ratio is not None:
            variant.effective_speedup = variant.multiplier * variant.throughput_ratio
    return ladder


def variant_key(entry: Any) -> str:
    """Which variant of a plan an entry belongs to: ``baseline`` or its grid point."""
    return "baseline" if entry.is_baseline else canonical_json(entry.overrides or entry.diff)


def variant_label(entry: Any) -> str:
    """A variant's label: its overrides as ``runs.results.presentation`` writes them."""
    if entry.is_baseline:
        return presentation.BASELINE_LABEL
    return presentation.run_label(changes=entry.overrides or {})


def ladder_metric(*, criterion: str, keys: Iterable[str]) -> str:
    """The loss a ladder plots: the criterion's metric if it is a loss the runs report,
    else eval/loss, else train/loss."""
    present = set(keys)
    for key in (criterion, "eval/loss", "train/loss"):
        if key and "loss" in key and key in present:
            return key
    return "eval/loss"


def plan_ladder(
    *, plan: Any, runs: Sequence[Any], values: Mapping[int, Mapping[str, float]], metric: str
) -> Ladder | None:
    """The ladder of a plan with ``scales`` from runs already loaded with their entries.

    ``values`` maps run id to its final metrics (throughput: its steady-state median).
    Only finished runs count; a rerun replaces the run before it. None when the plan has
    fewer than two scales."""
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
        key = variant_key(entry)
        variant = variants.get(key)
        if variant is None:
            variant = variants[key] = LadderVariant(
                key=key, label=variant_label(entry), is_baseline=key == "baseline"
            )
        found = values.get(run.pk) or {}
        loss = found.get(metric)
        if loss is None or not _usable(entry.flops, loss):
            continue
        speed = found.get(THROUGHPUT_KEY)
        variant.points.append(
            LadderPoint(
                flops=entry.flops,
                loss=loss,
                run_id=run.pk,
                scale=entry.scale,
                seed=entry.seed,
                tokens_per_second=speed if speed is not None and speed > 0 else None,
            )
        )
    ordered = sorted(variants.values(), key=lambda v: (not v.is_baseline, v.label))
    return ladder_build(metric=metric, variants=ordered)


def ladder_markdown(summary: Mapping[str, Any]) -> str:
    """The ladder of a plan summary (``Ladder.as_summary``) as markdown for the result
    comment: one row per variant, then each refusal in words."""
    target = summary.get("target_flops")
    lines = [
        f"**Scaling ladder** (`{summary['metric']}` against training FLOPs; the multiplier is "
        f"read at the loss each variant's fit reaches at {presentation.flops_text(target)} FLOPs)",
        "",
        "| variant | scales | law | exponent | R² | multiplier | throughput ratio | "
        "effective speedup |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v in summary["variants"]:
        exponent = presentation.exponent_text(v["exponent"], v["exponent_se"])
        law = v["law"] or "–"
        if v["irreducible"] is not None:
            law += f" (E = {presentation.metric_text(v['irreducible'], 'loss')})"
        lines.append(
            f"| {v['label']} | {v['scales']} | {law} | {exponent} | "
            f"{presentation.r_squared_text(v['r_squared'])} | "
            f"{presentation.multiplier_text(v['multiplier'])} | "
            f"{presentation.multiplier_text(v['throughput_ratio'])} | "
            f"{presentation.multiplier_text(v['effective_speedup'])} |"
        )
    reasons = [
        f"- {v['label']}: no multiplier, because " + "; ".join(v["refusals"]) + "."
        for v in summary["variants"]
        if v["refusals"]
    ]
    if reasons:
        lines += ["", *reasons]
    lines += [
        "",
        f"Fits: a plain power law for fewer than {MIN_SCALES_FOR_IRREDUCIBLE} scales, with an "
        f"irreducible loss E from {MIN_SCALES_FOR_IRREDUCIBLE} on; a multiplier needs "
        f"{MIN_SCALES_FOR_MULTIPLIER}+ scales, R² ≥ {MIN_R_SQUARED} and an exponent "
        f"{EXPONENT_STANDARD_ERRORS:g} standard errors below zero. Effective speedup = "
        "multiplier × throughput ratio (steady-state tokens/s over the baseline's).",
    ]
    return "\n".join(lines)
