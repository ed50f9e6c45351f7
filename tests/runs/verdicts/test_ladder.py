"""The site's ladder rule as a plug-in gives what the ladder page gives."""

from __future__ import annotations

import pytest

from runs.results import ladder as ladders
from runs.verdicts.base import Refusal
from runs.verdicts.rules import verdict_compute

FLOPS = [1e17, 1e18, 1e19]


def law(a: float, b: float) -> list[float]:
    return [a * x**b for x in FLOPS]


def test_ladder_rule_matches_ladder_build() -> None:
    base, variant = law(40.0, -0.05), law(38.0, -0.05)
    verdict = verdict_compute(
        {
            "rule": {"kind": "ladder"},
            "variants": [
                {
                    "label": "baseline",
                    "baseline": True,
                    "points": [
                        {"flops": x, "loss": y, "tokens_per_second": 1000}
                        for x, y in zip(FLOPS, base, strict=True)
                    ],
                },
                {
                    "label": "wide",
                    "points": [
                        {"flops": x, "loss": y, "tokens_per_second": 900}
                        for x, y in zip(FLOPS, variant, strict=True)
                    ],
                },
            ],
        }
    )
    direct = ladders.ladder_build(
        metric="loss",
        variants=[
            ladders.LadderVariant(
                key="b",
                label="baseline",
                is_baseline=True,
                points=[
                    ladders.LadderPoint(flops=x, loss=y, tokens_per_second=1000)
                    for x, y in zip(FLOPS, base, strict=True)
                ],
            ),
            ladders.LadderVariant(
                key="w",
                label="wide",
                is_baseline=False,
                points=[
                    ladders.LadderPoint(flops=x, loss=y, tokens_per_second=900)
                    for x, y in zip(FLOPS, variant, strict=True)
                ],
            ),
        ],
    )
    wide = verdict.result["variants"][1]
    assert wide["multiplier"] == pytest.approx(direct.variants[1].multiplier)
    # Same exponent, 5% lower loss: (40 / 38) ** (1 / 0.05) in compute, x 0.9 in throughput.
    assert wide["multiplier"] == pytest.approx((40 / 38) ** 20, rel=1e-6)
    assert wide["effective_speedup"] == pytest.approx(0.9 * (40 / 38) ** 20, rel=1e-6)
    assert any(step.startswith("wide:") and "multiplier" in step for step in verdict.steps)


def test_ladder_rule_needs_one_baseline() -> None:
    with pytest.raises(Refusal) as refused:
        verdict_compute(
            {
                "rule": {"kind": "ladder"},
                "variants": [{"label": "a", "points": [{"flops": 1e17, "loss": 3.0}]}],
            }
        )
    assert refused.value.field == "variants"
