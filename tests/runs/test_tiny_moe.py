"""The tiny MoE trainer: it really learns, its knobs matter, and it stays fast."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from django.conf import settings

from runs import tiny_moe
from runs.demo_recipes import TINY_MOE


def config(**overrides: Any) -> dict[str, Any]:
    return {**tiny_moe.DEFAULTS, **overrides}


def test_recipe_defaults_match_the_trainer() -> None:
    for key, value in TINY_MOE["default_config"].items():
        assert tiny_moe.DEFAULTS[key] == value


def test_gradients_match_finite_differences() -> None:
    cfg = config(width=8, num_experts=3, top_k=2, capacity_factor=8.0, depth=1, seq_len=6)
    model = tiny_moe.TinyMoE(cfg, np.random.default_rng(1))
    batch = np.random.default_rng(2).integers(0, 256, size=(2, 7))
    _, grads, _ = model.loss_and_grads(batch)
    rng = np.random.default_rng(3)
    for name in ("router0", "w1_0", "w2_0", "out", "embed"):
        param = model.params[name]
        for _ in range(3):
            if name == "embed":
                index: tuple[int, ...] = (int(batch[0, 1]), int(rng.integers(param.shape[1])))
            else:
                index = tuple(int(rng.integers(n)) for n in param.shape)
            saved = param[index]
            param[index] = saved + 1e-5
            up = model.loss_and_grads(batch, grads=False)[0]
            param[index] = saved - 1e-5
            down = model.loss_and_grads(batch, grads=False)[0]
            param[index] = saved
            numeric = (up - down) / 2e-5
            assert math.isclose(grads[name][index], numeric, rel_tol=1e-3, abs_tol=1e-7), name


def test_knobs_change_the_curves_and_the_drop_fraction(tmp_path: Path) -> None:
    base = config(steps=15, width=32, depth=1, eval_every=5)
    tight = tiny_moe.train({**base, "capacity_factor": 0.5}, None, tmp_path)
    roomy = tiny_moe.train({**base, "capacity_factor": 8.0}, None, tmp_path)
    fast = tiny_moe.train({**base, "capacity_factor": 8.0, "learning_rate": 0.02}, None, tmp_path)
    code_only = tiny_moe.train(
        {**base, "capacity_factor": 8.0, "data_mix": {"code": 1.0}}, None, tmp_path
    )
    assert tight["moe/drop_fraction"] > 0.4
    assert roomy["moe/drop_fraction"] == 0.0
    assert len({tight["train/loss"], roomy["train/loss"], fast["train/loss"]}) == 3
    assert code_only["eval/loss"] != roomy["eval/loss"]
    assert roomy["train/loss"] < math.log(256)
    assert 0 < roomy["throughput/mfu"] < 10
    assert roomy["throughput/tokens_per_second"] > 0


def test_smallest_scale_runs_offline_and_learns(tmp_path: Path) -> None:
    """How long it takes is bench/trainer.py's figure (target: under 30 s on 2 cores)."""
    small = {**TINY_MOE["default_config"], **TINY_MOE["scales"]["small"]}
    (tmp_path / "config.json").write_text(json.dumps(small))
    done = subprocess.run(
        [sys.executable, "-m", "runs.tiny_moe", "--config", "config.json"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(settings.BASE_DIR), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    line = json.loads((tmp_path / "tracker_metrics.jsonl").read_text().splitlines()[-1])
    assert set(line) == {"config", "summary"}
    assert line["config"]["width"] == TINY_MOE["scales"]["small"]["width"]
    summary = line["summary"]
    assert summary["eval/loss"] < 0.5 * math.log(256)  # far below a uniform guess
    for key in (
        "train/loss",
        "throughput/tokens_per_second",
        "throughput/mfu",
        "moe/drop_fraction",
    ):
        assert key in summary


@pytest.mark.parametrize(
    "bad", [{"top_k": 5, "num_experts": 4}, {"data_mix": {"web": 0.0}}, {"width": 0}]
)
def test_refused_config_exits_with_2(tmp_path: Path, bad: dict[str, Any]) -> None:
    (tmp_path / "config.json").write_text(json.dumps(bad))
    assert (
        tiny_moe.main(["--config", str(tmp_path / "config.json"), "--output", str(tmp_path)]) == 2
    )


def test_the_trainer_imports_numpy_and_the_standard_library_only() -> None:
    """A Ray cluster's Python (RUNS_RAY_PYTHON) needs numpy, not the site's dependencies."""
    check = "import sys, runs.tiny_moe; print(sorted({'yaml', 'django'} & set(sys.modules)))"
    result = subprocess.run(  # noqa: S603  (our own interpreter and code)
        [sys.executable, "-c", check],
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.strip() == "[]"
