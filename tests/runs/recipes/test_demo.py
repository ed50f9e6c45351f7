"""The demo recipes: the tiny recipe's scales are a ladder whose fit means something."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from runs.metrics import steady
from runs.metrics.declarations import declarations_parse, declarations_validate
from runs.recipes.demo import TINY_MOE, TINY_TOKENS_PER_PARAM, ladder_scale
from runs.results.ladder import MIN_R_SQUARED, LadderPoint, LadderVariant, ladder_build
from runs.specs.compute import run_cost, validate_compute_model

SCALES = ("small", "medium", "large")
# bench/RESULTS.md, "ladder": final eval/loss of each scale, seed 0, measured with
# `python bench/trainer.py --seed 0` (each scale as `python -m trainers.tiny_moe --config ...`).
RECORDED_EVAL_LOSS = {"small": 2.7387, "medium": 2.3831, "large": 2.2149}


def _config(scale: str) -> dict[str, object]:
    return {**TINY_MOE["default_config"], **TINY_MOE["scales"][scale]}


def _ladder(losses: dict[str, float]) -> LadderVariant:
    points = [
        LadderPoint(run_cost(TINY_MOE["compute_model"], _config(s)).flops, losses[s], scale=s)
        for s in SCALES
    ]
    baseline = LadderVariant(key="baseline", label="baseline", is_baseline=True, points=points)
    ladder_build(metric="eval/loss", variants=[baseline])
    return baseline


def test_tiny_scales_train_on_the_same_tokens_per_parameter() -> None:
    costs = [run_cost(TINY_MOE["compute_model"], _config(s)) for s in SCALES]
    params = [cost.active_params for cost in costs]
    assert params == sorted(params) and len(set(params)) == 3
    for cost in costs:  # one ratio, up to rounding the steps
        assert cost.tokens / cost.active_params == pytest.approx(TINY_TOKENS_PER_PARAM, rel=0.02)
    flops = [cost.flops for cost in costs]
    assert flops[-1] / flops[0] == pytest.approx((params[-1] / params[0]) ** 2, rel=0.05)


def test_tiny_recipe_files_steps_are_the_ladders_at_its_tokens_per_parameter() -> None:
    """The steps written in runs/recipes/tiny-moe.yaml are what ladder_scale computes."""
    for name, scale in TINY_MOE["scales"].items():
        sizes = {key: scale[key] for key in ("width", "depth")}
        expected = ladder_scale(TINY_MOE, tokens_per_param=TINY_TOKENS_PER_PARAM, **sizes)
        assert scale == expected, name


def test_tiny_recipe_declares_a_valid_warm_up_once() -> None:
    declared = declarations_parse(TINY_MOE["metrics"])
    throughput = [d for d in declared.values() if steady.is_steady_state_key(d.key)]
    assert throughput and {d.warmup_steps for d in throughput} == {5}
    assert "steady_state_warmup_steps" not in TINY_MOE["compute_model"]
    assert declarations_validate(TINY_MOE["metrics"]) == []
    assert validate_compute_model(TINY_MOE["compute_model"]) == []


def test_recorded_tiny_ladder_fits_a_falling_power_law() -> None:
    baseline = _ladder(RECORDED_EVAL_LOSS)
    assert baseline.fit is not None
    assert baseline.fit.r_squared >= 0.95
    assert baseline.fit.exponent == pytest.approx(-0.0710, abs=0.0005)
    assert baseline.refusals == [] and baseline.multiplier == 1.0


def test_tiny_ladder_trains_for_real_and_fits(tmp_path: Path) -> None:
    """The three scales, trained as a run starts them (about a minute of one core in all,
    bench/trainer.py): loss falls with compute and the power law fits, so the ladder states
    a multiplier."""
    losses = {}
    for scale in SCALES:
        folder = tmp_path / scale
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(_config(scale)))
        done = subprocess.run(
            [sys.executable, "-m", "trainers.tiny_moe", "--config", "config.json"],
            cwd=folder,
            env={"PYTHONPATH": str(settings.BASE_DIR), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=900,  # a loaded shared machine: the figure is bench/trainer.py's
            check=False,
        )
        assert done.returncode == 0, done.stderr
        line = json.loads((folder / "tracker_metrics.jsonl").read_text().splitlines()[-1])
        losses[scale] = line["summary"]["eval/loss"]
    assert losses["small"] > losses["medium"] > losses["large"]
    baseline = _ladder(losses)
    assert baseline.fit is not None
    assert baseline.fit.r_squared >= max(0.95, MIN_R_SQUARED)
    assert baseline.fit.clearly_falling
    assert baseline.refusals == []
