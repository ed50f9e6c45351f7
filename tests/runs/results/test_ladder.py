"""Scaling ladders: power-law fits and compute multipliers on data whose answer is known."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from runs.results.ladder import (
    IRREDUCIBLE_LAW,
    MIN_R_SQUARED,
    PLAIN_LAW,
    LadderPoint,
    LadderVariant,
    PowerLaw,
    compute_multiplier,
    irreducible_power_law_fit,
    ladder_build,
    ladder_markdown,
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


# --- the law with an irreducible loss ------------------------------------------------------

WIDE = [float(c) for c in np.logspace(15, 21, 7)]


def test_irreducible_fit_recovers_exponent_and_irreducible_loss_through_noise() -> None:
    true = [2.0 + 300.0 * c**-0.12 for c in WIDE]
    exact = irreducible_power_law_fit(WIDE, true)
    assert exact is not None
    assert exact.kind == IRREDUCIBLE_LAW
    assert exact.irreducible == pytest.approx(2.0, abs=1e-6)
    assert exact.exponent == pytest.approx(-0.12, abs=1e-6)
    assert exact.coefficient == pytest.approx(300.0, rel=1e-4)
    noise = np.random.default_rng(7).normal(0.0, 0.005, len(WIDE))  # 0.5% per point
    fit = irreducible_power_law_fit(WIDE, [v * (1 + n) for v, n in zip(true, noise, strict=True)])
    assert fit is not None
    assert fit.irreducible == pytest.approx(2.0, abs=0.1)
    assert fit.exponent == pytest.approx(-0.12, abs=0.02)
    assert fit.exponent_se is not None and 0 < fit.exponent_se < 0.02
    assert fit.r_squared > 0.99
    # The plain law misreads the same points: its exponent is the flattened average slope.
    plain = power_law_fit(WIDE, true)
    assert plain is not None and plain.exponent > -0.1


def test_irreducible_fit_of_a_plain_power_law_finds_no_floor() -> None:
    fit = irreducible_power_law_fit(FLOPS, _law(40.0, -0.07))
    assert fit is not None
    assert fit.irreducible == 0.0
    assert fit.exponent == pytest.approx(-0.07, abs=1e-9)


def test_ladder_fits_the_irreducible_loss_from_four_scales_and_the_plain_law_below() -> None:
    def variant(flops: list[float]) -> LadderVariant:
        points = [LadderPoint(c, 2.0 + 300.0 * c**-0.12) for c in flops]
        return LadderVariant(key="baseline", label="baseline", is_baseline=True, points=points)

    four = variant(WIDE[:4])
    ladder_build(metric="eval/loss", variants=[four])
    assert four.fit is not None and four.fit.kind == IRREDUCIBLE_LAW
    assert four.fit.irreducible == pytest.approx(2.0, abs=1e-3)
    three = variant(WIDE[:3])
    ladder_build(metric="eval/loss", variants=[three])
    assert three.fit is not None and three.fit.kind == PLAIN_LAW
    assert three.fit.irreducible == 0.0


# --- refusals ------------------------------------------------------------------------------


def _variant(label: str, losses: list[float], flops: list[float], **more: Any) -> LadderVariant:
    points = [LadderPoint(c, v, **more) for c, v in zip(flops, losses, strict=True)]
    return LadderVariant(key=label, label=label, is_baseline=label == "baseline", points=points)


THREE = [1e10, 6e10, 1.5e11]


def test_flat_noisy_ladder_states_no_multiplier_and_says_r_squared() -> None:
    # What the old tiny ladder did: the same tokens at every size, loss not falling.
    baseline = _variant("baseline", [3.00, 2.98, 3.01], THREE)
    variant = _variant("wd=0.1", [2.99, 3.02, 2.97], THREE)
    ladder = ladder_build(metric="eval/loss", variants=[baseline, variant])
    assert baseline.fit is not None and baseline.fit.r_squared < MIN_R_SQUARED
    assert variant.multiplier is None and baseline.multiplier is None
    assert any("R² 0." in reason and "below 0.9" in reason for reason in variant.refusals)
    assert ladder.refused == [baseline, variant]
    text = ladder_markdown(ladder.as_summary())
    assert "wd=0.1: no multiplier, because the baseline's fit has R²" in text


def test_two_scales_state_no_multiplier() -> None:
    baseline = _variant("baseline", _law(30.0, -0.1, THREE[:2]), THREE[:2])
    variant = _variant("lr=0.01", [30.0 * (2 * c) ** -0.1 for c in THREE[:2]], THREE[:2])
    ladder_build(metric="eval/loss", variants=[baseline, variant])
    assert variant.fit is not None and variant.fit.r_squared == pytest.approx(1.0)
    assert variant.multiplier is None
    assert any("has 2 scales; a multiplier needs at least 3" in r for r in variant.refusals)


def test_rising_loss_states_no_multiplier_even_with_a_perfect_fit() -> None:
    baseline = _variant("baseline", _law(30.0, -0.1, THREE), THREE)
    rising = _variant("lr=1.0", [1.0 * c**0.05 for c in THREE], THREE)
    ladder_build(metric="eval/loss", variants=[baseline, rising])
    assert rising.fit is not None and rising.fit.r_squared == pytest.approx(1.0)
    assert baseline.multiplier == 1.0 and not baseline.refusals
    assert rising.multiplier is None
    assert rising.refusals == [
        "this variant's exponent (+0.050 ± 0.000) is not clearly below zero: "
        "its loss does not clearly fall with compute"
    ]


def test_good_three_scale_ladder_states_its_multiplier() -> None:
    baseline = _variant("baseline", _law(30.0, -0.1, THREE), THREE)
    variant = _variant("cf=2", [30.0 * (2 * c) ** -0.1 for c in THREE], THREE)
    ladder_build(metric="eval/loss", variants=[baseline, variant])
    assert variant.refusals == []
    assert variant.multiplier == pytest.approx(2.0, rel=1e-6)


# --- throughput and effective speedup -----------------------------------------------------


def test_effective_speedup_is_multiplier_times_throughput_ratio() -> None:
    baseline = _variant("baseline", _law(30.0, -0.1, THREE), THREE, tokens_per_second=1000.0)
    slower = LadderVariant(
        key="e8",
        label="num_experts=8",
        is_baseline=False,
        points=[
            LadderPoint(c, 30.0 * (2 * c) ** -0.1, scale=name, tokens_per_second=speed)
            for c, name, speed in zip(THREE, ["s", "m", "l"], [900.0, 800.0, 750.0], strict=True)
        ],
    )
    ladder = ladder_build(metric="eval/loss", variants=[baseline, slower])
    assert slower.multiplier == pytest.approx(2.0, rel=1e-6)
    assert slower.throughput_ratio == pytest.approx(0.75)  # at the largest scale both ran
    assert slower.throughput_scale == "l"
    assert slower.effective_speedup == pytest.approx(1.5, rel=1e-6)
    assert (baseline.throughput_ratio, baseline.effective_speedup) == (1.0, 1.0)
    summary = ladder.as_summary()["variants"][1]
    assert (summary["multiplier"], summary["throughput_ratio"]) == (
        pytest.approx(2.0),
        pytest.approx(0.75),
    )
    assert (
        "| num_experts=8 | 3 | plain power law | -0.100 ± 0.000 | 1.000 | 2.00× | 0.75× | 1.50× |"
        in ladder_markdown(ladder.as_summary())
    )


def test_throughput_ratio_is_stated_without_a_multiplier() -> None:
    baseline = _variant("baseline", [3.0, 2.99], THREE[:2], tokens_per_second=1000.0)
    variant = _variant("cf=2", [3.0, 2.98], THREE[:2], tokens_per_second=1200.0)
    ladder_build(metric="eval/loss", variants=[baseline, variant])
    assert variant.multiplier is None and variant.effective_speedup is None
    assert variant.throughput_ratio == pytest.approx(1.2)


def test_baseline_that_never_reaches_the_variants_loss_is_refused_in_words() -> None:
    base_law = PowerLaw(coefficient=300.0, exponent=-0.12, r_squared=1.0, points=5, irreducible=2.0)
    assert base_law.flops_at(1.9) is None
    assert base_law.flops_at(2.5) == pytest.approx((0.5 / 300.0) ** (1 / -0.12))
    baseline = _variant("baseline", [2.0 + 300.0 * c**-0.12 for c in WIDE[:5]], WIDE[:5])
    better = _variant("muon", [0.5 + 30.0 * c**-0.12 for c in WIDE[:5]], WIDE[:5])
    ladder_build(metric="eval/loss", variants=[baseline, better])
    assert better.multiplier is None
    assert better.refusals and "never reaches this variant's loss" in better.refusals[0]
