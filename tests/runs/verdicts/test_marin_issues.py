"""Verdicts published in Marin's Agent MoE issues, recomputed with agent.md's rule from the
figures they print (final macro loss, mean tokens/s of the last 100 steps).

Agree: #7409 (Identity-HC) to every printed digit; #5596 (MuonH, d512) and #5854 (context
norm) within the rounding of their inputs. #5224 (lm_head softcap) prints the rule's own
figures, and its wall-clock speedup at d512 is 0.979, yet declares gate 1 passed by
excluding throughput (a rule of its own, not agent.md's). #4716's "corrected formula"
table (attention gate sizing) does not follow the rule: the rule gives 1.037 where it
prints 1.031, and 1.036 where it prints 1.042.
"""

from __future__ import annotations

import pytest

from runs.verdicts.rules import verdict_compute


def speedups(*scales: tuple[str, float, float, float, float]) -> dict[str, dict]:
    verdict = verdict_compute(
        {
            "rule": {"kind": "effective_speedup", "asymptote": 1.6, "alpha": 0.0941},
            "scales": [
                {
                    "name": name,
                    "budget": 1e18,
                    "baseline": {"loss": bl, "tokens_per_second": btps},
                    "variant": {"loss": vl, "tokens_per_second": vtps},
                }
                for name, bl, vl, btps, vtps in scales
            ],
        }
    )
    return {row["name"]: row for row in verdict.result["scales"]}


def test_issue_7409_agrees_to_every_digit() -> None:
    rows = speedups(
        ("d512", 3.566663, 3.544176, 352_496.25, 328_021.81),
        ("d768", 3.227240, 3.208981, 248_672.40, 225_091.48),
    )
    assert round(rows["d512"]["stepwise"], 4) == 1.1300
    assert round(rows["d512"]["speedup"], 4) == 1.0515
    assert round(rows["d768"]["stepwise"], 4) == 1.1274
    assert round(rows["d768"]["speedup"], 4) == 1.0205


def test_issues_5596_and_5854_agree_within_rounding() -> None:
    assert round(speedups(("d512", 3.8104, 3.7542, 405_630, 411_620))["d512"]["speedup"], 2) == 1.33
    rows = speedups(
        ("d512", 3.8104, 3.8293, 405_630, 449_488), ("d768", 3.4339, 3.4478, 273_532, 312_981)
    )
    assert rows["d512"]["speedup"] == pytest.approx(1.0124, abs=2e-4)
    assert round(rows["d768"]["speedup"], 3) == 1.056


def test_issue_5224_figures_agree_but_its_gate_is_not_agent_md_s() -> None:
    rows = speedups(
        ("d512", 3.8104, 3.7971, 405_630, 372_477), ("d768", 3.4339, 3.4249, 273_532, 263_755)
    )
    assert round(rows["d512"]["stepwise"], 3) == 1.066
    assert round(rows["d512"]["speedup"], 3) == 0.979
    assert round(rows["d768"]["speedup"], 3) == 1.016
    assert rows["d512"]["passed"] is False  # the issue declared gate 1 passed


def test_issue_4716_corrected_table_does_not_follow_the_rule() -> None:
    none_d512 = speedups(("d512", 3.8104, 3.8034, 405_630, 406_627))["d512"]["speedup"]
    quarter_d768 = speedups(("d768", 3.4339, 3.4273, 273_532, 272_701))["d768"]["speedup"]
    printed = {"none d512": 1.031, "truncated 1/4 d768": 1.042}
    assert round(none_d512, 3) == 1.037 and abs(none_d512 - printed["none d512"]) > 0.005
    assert round(quarter_d768, 3) == 1.036
    assert abs(quarter_d768 - printed["truncated 1/4 d768"]) > 0.005
