"""Seeds: spread per variant, the difference from the baseline with its standard error,
Welch's noise test, and the verdict that treats a difference inside the noise as none."""

from __future__ import annotations

import math
import statistics
from types import SimpleNamespace
from typing import Any

import pytest

from runs.results.seeds import difference, spread, t_critical, variant_groups, verdict_suggest

CRITERIA = {"metric": "eval/loss", "direction": "lower", "threshold": 0.01}


def test_spread_is_mean_and_sample_standard_deviation() -> None:
    found = spread([3.0, 3.2, 3.4])
    assert found is not None
    assert (found.n, found.mean) == (3, pytest.approx(3.2))
    assert found.std == pytest.approx(0.2)  # n - 1 in the denominator, not n
    single = spread([3.0])
    assert single is not None and single.std is None
    assert spread([]) is None


def test_t_critical_is_wider_with_few_degrees_of_freedom_and_never_narrower() -> None:
    assert t_critical(1) == 12.706
    assert t_critical(2.9) == 4.303  # rounded down: the wider interval
    assert t_critical(45) == 2.021
    assert t_critical(10_000) == 1.960
    assert t_critical(math.inf) == 1.960


def test_difference_has_welch_standard_error_and_degrees_of_freedom() -> None:
    variant, baseline = spread([2.90, 2.92, 2.94]), spread([3.00, 3.05])
    assert variant is not None and baseline is not None
    found = difference(variant=variant, baseline=baseline)
    var_v, var_b = 0.02**2 / 3, statistics.stdev([3.00, 3.05]) ** 2 / 2
    assert found.delta == pytest.approx(2.92 - 3.025)
    assert found.se == pytest.approx(math.sqrt(var_v + var_b))
    assert found.dof == pytest.approx((var_v + var_b) ** 2 / (var_v**2 / 2 + var_b**2 / 1))
    # |Δ| = 0.105, SE ≈ 0.0271, dof ≈ 1.3: t = 12.7, so 0.105 is inside the noise.
    assert found.inside_noise is True


def test_difference_without_a_spread_has_no_uncertainty() -> None:
    one, many = spread([2.9]), spread([3.0, 3.1])
    assert one is not None and many is not None
    found = difference(variant=one, baseline=many)
    assert found.delta == pytest.approx(-0.15)
    assert (found.se, found.inside_noise) == (None, None)


def _run(pk: int, index: int, *, baseline: bool, seed: int, scale: str = "") -> Any:
    overrides = {} if baseline else {"capacity_factor": 2.0}
    entry = SimpleNamespace(
        index=index, is_baseline=baseline, overrides=overrides, diff={}, scale=scale, seed=seed
    )
    return SimpleNamespace(pk=pk, entry=entry, entry_id=index, state="finished", sequence=0)


def _plan(base: list[float], ablation: list[float]) -> tuple[list[Any], dict[int, Any]]:
    runs: list[Any] = []
    metrics: dict[int, Any] = {}
    for seed, (b, a) in enumerate(zip(base, ablation, strict=True)):
        for offset, (is_base, loss) in enumerate([(True, b), (False, a)]):
            run = _run(len(runs) + 1, 2 * seed + offset, baseline=is_base, seed=seed)
            runs.append(run)
            metrics[run.pk] = {"eval/loss": loss, "train/loss": loss + 0.1}
    return runs, metrics


def test_groups_hold_mean_std_and_delta_per_variant() -> None:
    runs, metrics = _plan([3.00, 3.01, 3.02], [2.90, 2.91, 2.92])
    base, ablation = variant_groups(
        runs=runs, metrics=metrics, keys=["eval/loss", "train/loss"], criteria=CRITERIA
    )
    assert (base["label"], base["seeds"], base["is_baseline"]) == ("baseline", 3, True)
    assert base["stats"]["eval/loss"] == {
        "n": 3,
        "mean": pytest.approx(3.01),
        "std": pytest.approx(0.01),
    }
    assert ablation["label"] == "capacity_factor=2"  # as runs.results.presentation writes 2.0
    assert ablation["stats"]["train/loss"]["mean"] == pytest.approx(3.01)
    assert ablation["delta"] == pytest.approx(-0.1)
    assert ablation["delta_se"] == pytest.approx(math.sqrt(2 * 0.01**2 / 3))
    assert ablation["inside_noise"] is False  # 0.1 is twelve standard errors
    assert ablation["improvement"] == pytest.approx(0.1)
    assert ablation["meets_threshold"] is True
    assert verdict_suggest([base, ablation])[0] == "worked"


def test_a_difference_inside_the_seed_noise_is_inconclusive_not_worked() -> None:
    # The ablation is 0.02 better at every seed, above the 0.01 threshold (run by run, the
    # old verdict said "worked"), but the seeds spread by 0.1: the difference is noise.
    runs, metrics = _plan([3.00, 3.10, 2.90], [2.98, 3.08, 2.88])
    groups = variant_groups(runs=runs, metrics=metrics, keys=["eval/loss"], criteria=CRITERIA)
    ablation = groups[1]
    assert ablation["improvement"] == pytest.approx(0.02)
    assert ablation["inside_noise"] is True
    assert ablation["meets_threshold"] is False
    verdict, reason = verdict_suggest(groups)
    assert verdict == "inconclusive"
    assert reason == "every difference from the baseline is inside the seed noise"


def test_one_seed_is_judged_as_before_and_says_no_spread_is_known() -> None:
    runs, metrics = _plan([3.0], [2.98])
    groups = variant_groups(runs=runs, metrics=metrics, keys=["eval/loss"], criteria=CRITERIA)
    assert groups[1]["delta_se"] is None and groups[1]["inside_noise"] is None
    verdict, reason = verdict_suggest(groups)
    assert verdict == "worked"
    assert "no spread is known" in reason


def test_a_rerun_replaces_the_run_before_it_in_its_group() -> None:
    runs, metrics = _plan([3.0, 3.1], [2.9, 2.9])
    rerun = SimpleNamespace(
        pk=99, entry=runs[3].entry, entry_id=runs[3].entry_id, state="finished", sequence=1
    )
    metrics[99] = {"eval/loss": 2.5}
    groups = variant_groups(
        runs=[*runs, rerun], metrics=metrics, keys=["eval/loss"], criteria=CRITERIA
    )
    assert groups[1]["runs"] == [2, 99]
    assert groups[1]["stats"]["eval/loss"]["mean"] == pytest.approx(2.7)
