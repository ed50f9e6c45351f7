"""Seeds: each variant's results over its seeds (mean ± standard deviation), its difference
from the baseline at the same scale with that difference's standard error, and whether the
difference is inside the seed noise.

The rule for "inside the noise" is Welch's t-test at 95%, two-sided: the difference of the
means is inside the noise when ``|Δ| < t(0.975, dof) * SE``, where ``SE = √(s_v²/n_v +
s_b²/n_b)`` (sample standard deviations, ``n - 1`` in the denominator) and ``dof`` is the
Welch-Satterthwaite degrees of freedom, rounded down (so the test errs towards "inside").
Welch's test does not assume the two spreads are equal, and with the two to five seeds
ablations usually have, the t quantile is much wider than the normal 1.96 (4.3 with two
seeds a side): a normal-approximation rule would call noise a result. A variant or a
baseline with a single seed has no known spread: the difference is reported without an
uncertainty, and no noise test is made. The test is unpaired: it does not use that a variant
and the baseline share a seed (the same initialisation and data order), which a paired test
could exploit for more power; unpaired, it also holds when seeds do not line up.

Pure functions over runs already loaded with their entries and their final metrics.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runs.results.ladder import variant_key, variant_label

NOISE_CONFIDENCE = 0.95
# Student's t quantiles at 0.975 (two-sided 95%) by degrees of freedom; above 30 the value
# at the next tabulated degrees of freedom below is used, down to the normal 1.960.
_T_975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    11: 2.201,
    12: 2.179,
    13: 2.160,
    14: 2.145,
    15: 2.131,
    16: 2.120,
    17: 2.110,
    18: 2.101,
    19: 2.093,
    20: 2.086,
    21: 2.080,
    22: 2.074,
    23: 2.069,
    24: 2.064,
    25: 2.060,
    26: 2.056,
    27: 2.052,
    28: 2.048,
    29: 2.045,
    30: 2.042,
    40: 2.021,
    60: 2.000,
    120: 1.980,
}
_NORMAL_975 = 1.960


def t_critical(dof: float) -> float:
    """The two-sided 95% quantile of Student's t with ``dof`` degrees of freedom, taken at
    the tabulated degrees of freedom at or below ``dof`` (never narrower than the truth)."""
    if not math.isfinite(dof):
        return _NORMAL_975
    whole = max(1, math.floor(dof))
    if whole > max(_T_975):
        return _NORMAL_975
    return _T_975[max(k for k in _T_975 if k <= whole)]


@dataclass(frozen=True)
class Spread:
    n: int
    mean: float
    std: float | None  # the sample standard deviation; None with one value

    def as_dict(self) -> dict[str, Any]:
        return {"n": self.n, "mean": self.mean, "std": self.std}


def spread(values: Sequence[float]) -> Spread | None:
    if not values:
        return None
    std = statistics.stdev(values) if len(values) > 1 else None
    return Spread(n=len(values), mean=statistics.fmean(values), std=std)


@dataclass(frozen=True)
class Difference:
    """``variant - baseline`` of the means; with its standard error, Welch's degrees of
    freedom and the noise test when both sides have two or more values."""

    delta: float
    se: float | None = None
    dof: float | None = None
    inside_noise: bool | None = None


def difference(*, variant: Spread, baseline: Spread) -> Difference:
    delta = variant.mean - baseline.mean
    if variant.std is None or baseline.std is None:
        return Difference(delta=delta)
    var_v = variant.std**2 / variant.n
    var_b = baseline.std**2 / baseline.n
    se = math.sqrt(var_v + var_b)
    if se == 0:  # every seed gave the same value on both sides: no noise to be inside of
        return Difference(delta=delta, se=0.0, dof=math.inf, inside_noise=delta == 0)
    denominator = var_v**2 / (variant.n - 1) + var_b**2 / (baseline.n - 1)
    dof = (var_v + var_b) ** 2 / denominator if denominator > 0 else math.inf
    return Difference(delta=delta, se=se, dof=dof, inside_noise=abs(delta) < t_critical(dof) * se)


def _latest(runs: Iterable[Any]) -> list[Any]:
    """The newest run of each plan entry (a rerun replaces the run before it)."""
    latest: dict[int, Any] = {}
    for run in runs:
        known = latest.get(run.entry_id)
        if known is None or getattr(run, "sequence", 0) >= getattr(known, "sequence", 0):
            latest[run.entry_id] = run
    return sorted(latest.values(), key=lambda run: run.entry.index)


def variant_groups(
    *,
    runs: Iterable[Any],
    metrics: Mapping[int, Mapping[str, float]],
    keys: Sequence[str],
    criteria: Mapping[str, Any] | None,
) -> list[dict[str, Any]]:
    """One group per variant and scale, in plan order: its runs, the spread of each of
    ``keys`` over its finished seeds, and, for an ablation point when the criteria name a
    metric, the difference from the baseline at the same scale.

    ``improvement`` is that difference signed so that positive is better (the criterion's
    direction); ``meets_threshold`` is whether it reaches the criterion's threshold outside
    the seed noise."""
    criteria = criteria or {}
    metric = str(criteria.get("metric") or "")
    lower = (criteria.get("direction") or "lower") == "lower"
    threshold = criteria.get("threshold")
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    values: dict[tuple[str, str], dict[str, list[float]]] = {}
    for run in _latest(runs):
        entry = run.entry
        group_key = (variant_key(entry), entry.scale or "")
        group = groups.get(group_key)
        if group is None:
            group = groups[group_key] = {
                "variant": group_key[0],
                "label": variant_label(entry),
                "scale": entry.scale or "",
                "is_baseline": bool(entry.is_baseline),
                "runs": [],
                "seeds": 0,
            }
            values[group_key] = {}
        group["runs"].append(run.pk)
        group["seeds"] += 1
        if run.state != "finished":
            continue
        found = metrics.get(run.pk) or {}
        for key in {*keys, *([metric] if metric else [])}:
            value = found.get(key)
            if isinstance(value, int | float) and math.isfinite(value):
                values[group_key].setdefault(key, []).append(float(value))
    for group_key, group in groups.items():
        spreads = {key: spread(found) for key, found in values[group_key].items()}
        group["stats"] = {key: s.as_dict() for key, s in spreads.items() if s and key in keys}
        for name in ("delta", "delta_se", "dof", "inside_noise", "improvement", "meets_threshold"):
            group[name] = None
        if group["is_baseline"] or not metric:
            continue
        mine = spreads.get(metric)
        base_values = values.get(("baseline", group_key[1]), {}).get(metric, [])
        base = spread(base_values)
        if mine is None or base is None:
            continue
        diff = difference(variant=mine, baseline=base)
        improvement = -diff.delta if lower else diff.delta
        group.update(
            delta=diff.delta,
            delta_se=diff.se,
            dof=diff.dof if diff.dof is None or math.isfinite(diff.dof) else None,
            inside_noise=diff.inside_noise,
            improvement=improvement,
        )
        if isinstance(threshold, int | float) and not isinstance(threshold, bool):
            group["meets_threshold"] = improvement >= threshold and not diff.inside_noise
    return list(groups.values())


def seeded(groups: Iterable[Mapping[str, Any]]) -> bool:
    """Whether any variant ran with more than one seed at a scale."""
    return any(group["seeds"] > 1 for group in groups)


def verdict_suggest(groups: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """A suggested verdict over the ablation points, and why, in words.

    An ablation point whose difference is inside the seed noise counts as no evidence
    either way: when every one is, the verdict is ``inconclusive``, never ``worked``."""
    points = [g for g in groups if not g["is_baseline"]]
    judged = [g for g in points if g["improvement"] is not None]
    if not judged or len(judged) < len(points) / 2:
        return "inconclusive", "too few ablation points finished with a result to compare"
    known = [g for g in judged if g["inside_noise"] is not None]
    if not known:
        noise = "one seed per point: no spread is known, so no difference can be told from noise"
    elif len(known) < len(judged):
        noise = "some points have one seed, whose differences could not be tested against noise"
    else:
        noise = "differences were tested against the seed spread (Welch's t-test, 95%)"
    clear = [g for g in judged if not g["inside_noise"]]
    if not clear:
        return "inconclusive", "every difference from the baseline is inside the seed noise"
    meets = [g for g in judged if g["meets_threshold"]]
    if len(meets) == len(judged):
        return "worked", f"every point beats the baseline by the threshold; {noise}"
    if meets:
        return (
            "mixed",
            f"{len(meets)} of {len(judged)} points beat the baseline by the threshold; {noise}",
        )
    if any(g["improvement"] > 0 for g in clear):
        return "promising", f"better than the baseline, but by less than the threshold; {noise}"
    return "did_not_work", f"no point beats the baseline; {noise}"
