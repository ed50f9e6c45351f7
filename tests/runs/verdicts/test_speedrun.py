"""Speedrun tracks: threshold (fastest to at most X C4-EN BPB) and scaling (log-log fit)."""

from __future__ import annotations

import math

import pytest

from runs.verdicts.base import Refusal
from runs.verdicts.rules import verdict_compute


def test_threshold_ranks_the_qualifying_by_flops() -> None:
    verdict = verdict_compute(
        {
            "rule": {"kind": "speedrun_threshold", "threshold": 1.3},
            "entries": [
                {"name": "a", "bpb": 1.28, "flops": 3e18},
                {"name": "b", "bpb": 1.25, "flops": 5e18},
                {"name": "c", "bpb": 1.35, "flops": 1e18},
                {"name": "d", "bpb": 1.30, "flops": 3e18},
            ],
        }
    )
    ranks = {e["name"]: (e["qualifies"], e["rank"]) for e in verdict.result["entries"]}
    assert ranks == {"a": (True, 1), "d": (True, 2), "b": (True, 3), "c": (False, None)}
    assert verdict.result["winner"] == "a"


def test_threshold_with_nobody_under_it_has_no_winner() -> None:
    verdict = verdict_compute(
        {
            "rule": {"kind": "speedrun_threshold", "threshold": 1.0},
            "entries": [{"name": "a", "bpb": 1.28, "flops": 3e18}],
        }
    )
    assert verdict.result["winner"] is None and verdict.passed is False


def test_scaling_fit_by_hand() -> None:
    """bpb = 10 ** (1 - 0.05 log10 C): slope -0.05, intercept 1, and 10 ** -0.05 at 1e21."""
    points = [
        {"name": f"s{e}", "flops": 10.0**e, "bpb": 10 ** (1 - 0.05 * e)} for e in (18, 19, 20)
    ]
    result = verdict_compute(
        {"rule": {"kind": "speedrun_scaling", "reference_budget": 1e21}, "points": points}
    ).result
    assert result["slope"] == pytest.approx(-0.05)
    assert result["intercept"] == pytest.approx(1.0)
    assert result["r2"] == pytest.approx(1.0)
    assert result["projected_bpb"] == pytest.approx(10**-0.05)


def test_scaling_r2_drops_with_scatter() -> None:
    points = [
        {"flops": 1e18, "bpb": 1.30},
        {"flops": 1e19, "bpb": 1.10},
        {"flops": 1e20, "bpb": 1.15},
    ]
    result = verdict_compute({"rule": {"kind": "speedrun_scaling"}, "points": points}).result
    x = [18.0, 19.0, 20.0]
    y = [math.log10(p["bpb"]) for p in points]
    slope = sum((a - 19) * (b - sum(y) / 3) for a, b in zip(x, y, strict=True)) / 2
    assert result["slope"] == pytest.approx(slope)
    assert 0 < result["r2"] < 0.9


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"rule": {"kind": "speedrun_threshold", "threshold": 0}, "entries": []}, "rule.threshold"),
        ({"rule": {"kind": "speedrun_threshold"}, "entries": []}, "entries"),
        (
            {"rule": {"kind": "speedrun_threshold"}, "entries": [{"bpb": 1.2, "flops": 0}]},
            "entries[0].flops",
        ),
        (
            {"rule": {"kind": "speedrun_scaling"}, "points": [{"bpb": 1.2, "flops": 1e18}] * 2},
            "points",
        ),
        (
            {"rule": {"kind": "speedrun_scaling"}, "points": [{"bpb": 1.2, "flops": 1e18}] * 3},
            "points",
        ),
        (
            {
                "rule": {"kind": "speedrun_scaling", "min_points": 2.5},
                "points": [{"bpb": 1.2, "flops": 1e18}] * 3,
            },
            "rule.min_points",
        ),
    ],
)
def test_bad_input_is_refused(payload: dict, field: str) -> None:
    with pytest.raises(Refusal) as refused:
        verdict_compute(payload)
    assert refused.value.field == field


def test_a_projection_past_floating_point_is_refused() -> None:
    """BPB rising a hundred decades per decade of FLOPs, projected 300 decades on."""
    points = [{"flops": 1e-300 * 10**e, "bpb": 10.0 ** (100 * e)} for e in (1, 2, 3)]
    with pytest.raises(Refusal) as refused:
        verdict_compute({"rule": {"kind": "speedrun_scaling"}, "points": points})
    assert "out of the range" in str(refused.value)
