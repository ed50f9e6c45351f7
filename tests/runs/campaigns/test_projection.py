"""The ladder's projection to a campaign's FLOPs: a synthetic ladder with a known law."""

from __future__ import annotations

import numpy as np
import pytest

from runs.campaigns.projection import projection_compute

FLOPS = [10.0**e for e in np.arange(17, 22.01, 0.5)]  # five decades, eleven scales
E, A, B = 2.0, 100.0, -0.1
TARGET = 1e24


def law(flops: float) -> float:
    return E + A * flops**B


def ladder(noise: float) -> list[tuple[float, float]]:
    rng = np.random.default_rng(3)
    return [(x, law(x) * float(np.exp(rng.normal(0, noise)))) for x in FLOPS]


def test_projection_recovers_the_exponent_and_brackets_the_truth() -> None:
    found = projection_compute(points=ladder(0.001), target_flops=TARGET, metric="eval/loss")
    assert found["refusals"] == []
    assert found["fit"]["exponent"] == pytest.approx(B, abs=0.01)
    assert found["fit"]["irreducible"] == pytest.approx(E, abs=0.1)
    at = found["at_target"]
    assert at["low"] < at["loss"] < at["high"]
    assert at["low"] <= law(TARGET) <= at["high"]
    assert at["loss"] == pytest.approx(law(TARGET), rel=0.01)
    curve = found["curve"]
    assert curve["flops"][0] == pytest.approx(FLOPS[0]) and curve["flops"][-1] == pytest.approx(
        TARGET
    )
    assert all(
        lo <= mid <= hi
        for lo, mid, hi in zip(curve["low"], curve["loss"], curve["high"], strict=True)
    )


def test_band_widens_with_noisier_ladders() -> None:
    def width(noise: float) -> float:
        at = projection_compute(points=ladder(noise), target_flops=TARGET)["at_target"]
        return at["high"] - at["low"]

    assert width(0.01) > 2 * width(0.001)


def test_two_scales_are_refused_in_words() -> None:
    found = projection_compute(points=ladder(0.0)[:2], target_flops=TARGET)
    assert found["curve"] is None
    assert any("scales" in reason for reason in found["refusals"])


def test_a_flat_ladder_is_refused() -> None:
    flat = [(x, 3.0 + 0.01 * (-1) ** i) for i, x in enumerate(FLOPS)]
    found = projection_compute(points=flat, target_flops=TARGET)
    assert found["curve"] is None and found["refusals"]
