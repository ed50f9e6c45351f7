"""Scaling ladders: power-law fits and compute multipliers on data whose answer is known."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest

from runs.ladder import (
    LadderPoint,
    LadderVariant,
    PowerLaw,
    compute_multiplier,
    ladder_build,
    plan_ladder,
    power_law_fit,
)

FLOPS = [1e17, 1e18, 1e19, 1e20]


def _law(coefficient: float, exponent: float, flops: list[float] = FLOPS) -> list[float]:
    return [coefficient * c**exponent for c in flops]


def test_fit_recovers_exponent_and_coefficient_of_an_exact_power_law() -> None:
    fit = power_law_fit(FLOPS, _law(40.0, -0.07))
    assert fit is not None
    assert fit.exponent == pytest.approx(-0.07, abs=1e-9)
    assert fit.coefficient == pytest.approx(40.0, rel=1e-6)
    assert fit.r_squared == pytest.approx(1.0)
    assert fit.points == 4


def test_fit_through_noise_stays_close_to_the_true_exponent() -> None:
    noise = [1.01, 0.99, 1.005, 0.995, 1.0, 1.002]
    flops = [1e17, 3e17, 1e18, 3e18, 1e19, 3e19]
    losses = [loss * n for loss, n in zip(_law(25.0, -0.05, flops), noise, strict=True)]
    fit = power_law_fit(flops, losses)
    assert fit is not None
    assert fit.exponent == pytest.approx(-0.05, abs=0.005)
    assert 0.9 < fit.r_squared <= 1.0


def test_fit_needs_two_distinct_computes_and_skips_values_a_log_axis_cannot_hold() -> None:
    assert power_law_fit([1e18], [3.0]) is None
    assert power_law_fit([1e18, 1e18], [3.0, 3.1]) is None
    assert power_law_fit([1e18, 1e19, 0.0], [3.0, -1.0, 2.0]) is None
    fit = power_law_fit([1e18, 1e19, 1e20, 1e21], [3.0, 2.5, math.nan, 0.0])
    assert fit is not None
    assert fit.points == 2


def test_multiplier_of_a_variant_that_needs_half_the_compute_is_two() -> None:
    # The variant at C FLOPs does what the baseline does at 2C: L_v(C) = L_b(2C).
    baseline = power_law_fit(FLOPS, _law(30.0, -0.1))
    variant = power_law_fit(FLOPS, [30.0 * (2 * c) ** -0.1 for c in FLOPS])
    assert baseline is not None and variant is not None
    for loss in (2.0, 3.0, 4.0):
        assert compute_multiplier(baseline=baseline, variant=variant, loss=loss) == pytest.approx(
            2.0, rel=1e-6
        )
    worse = power_law_fit(FLOPS, [30.0 * (c / 4) ** -0.1 for c in FLOPS])
    assert worse is not None
    assert compute_multiplier(baseline=baseline, variant=worse, loss=3.0) == pytest.approx(0.25)


def test_multiplier_with_different_exponents_is_stated_at_the_largest_compute() -> None:
    baseline = LadderVariant(
        key="baseline",
        label="baseline",
        is_baseline=True,
        points=[LadderPoint(c, v) for c, v in zip(FLOPS, _law(30.0, -0.10), strict=True)],
    )
    steeper = LadderVariant(
        key="b",
        label="lr=0.01",
        is_baseline=False,
        points=[LadderPoint(c, v) for c, v in zip(FLOPS, _law(40.0, -0.12), strict=True)],
    )
    ladder = ladder_build(metric="eval/loss", variants=[baseline, steeper])
    assert baseline.multiplier == 1.0
    assert steeper.reference_flops == 1e20
    reference_loss = 40.0 * 1e20**-0.12
    assert steeper.reference_loss == pytest.approx(reference_loss)
    expected = (reference_loss / 30.0) ** (1 / -0.10) / 1e20
    assert steeper.multiplier == pytest.approx(expected, rel=1e-6)
    data = ladder.chart_data()
    assert data["x"] == FLOPS
    assert data["variants"][1]["exponent"] == pytest.approx(-0.12)
    assert data["variants"][1]["points"] == pytest.approx(_law(40.0, -0.12))


def test_flat_fit_has_no_compute_for_a_loss() -> None:
    flat = PowerLaw(coefficient=3.0, exponent=0.0, r_squared=1.0, points=2)
    assert flat.flops_at(3.0) is None
    other = PowerLaw(coefficient=30.0, exponent=-0.1, r_squared=1.0, points=2)
    assert compute_multiplier(baseline=other, variant=flat, loss=2.0) is None


def _run(
    pk: int,
    index: int,
    *,
    baseline: bool,
    overrides: dict[str, Any],
    scale: str,
    flops: float,
    state: str = "finished",
) -> Any:
    entry = SimpleNamespace(
        index=index,
        is_baseline=baseline,
        overrides=overrides,
        diff={},
        scale=scale,
        seed=0,
        flops=flops,
    )
    return SimpleNamespace(pk=pk, entry=entry, entry_id=index, state=state)


def test_plan_ladder_groups_runs_by_grid_point_and_skips_unfinished_runs() -> None:
    scales = {"small": 1e17, "medium": 1e18, "large": 1e19}
    runs, values, pk = [], {}, 0
    for index, (name, flops) in enumerate(scales.items()):
        for offset, (baseline, overrides, shift) in enumerate(
            [(True, {}, 1.0), (False, {"capacity_factor": 1.25}, 3.0)]
        ):
            pk += 1
            runs.append(
                _run(
                    pk,
                    index * 2 + offset,
                    baseline=baseline,
                    overrides=overrides,
                    scale=name,
                    flops=flops,
                )
            )
            values[pk] = {"eval/loss": 20.0 * (shift * flops) ** -0.08}
    runs.append(
        _run(
            99,
            50,
            baseline=False,
            overrides={"capacity_factor": 2.0},
            scale="small",
            flops=1e17,
            state="running",
        )
    )
    plan = SimpleNamespace(spec={"axes": {"capacity_factor": [1.25]}, "scales": list(scales)})
    ladder = plan_ladder(plan=plan, runs=runs, values=values, metric="eval/loss")
    assert ladder is not None
    assert [v.label for v in ladder.variants] == ["baseline", "capacity_factor=1.25"]
    variant = ladder.variants[1]
    assert len(variant.points) == 3
    assert variant.fit is not None and variant.fit.exponent == pytest.approx(-0.08)
    assert variant.multiplier == pytest.approx(3.0, rel=1e-6)


def test_plan_without_two_scales_has_no_ladder() -> None:
    plan = SimpleNamespace(spec={"axes": {"capacity_factor": [1.25]}, "scales": ["small"]})
    assert plan_ladder(plan=plan, runs=[], values={}, metric="eval/loss") is None
