"""The ``marin_site`` Levanter tracker with current Marin Levanter (marin-levanter, Python
3.12, in .venv-levanter made by bin/setup-levanter): a real 5-step ``Trainer`` on JAX's CPU
backend with W&B offline beside it, reporting to a live site; the tracker interface under
``current_tracker``; and the client importing without Levanter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runs.models import MetricPoint, MetricSummary, Run, RunState

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="session")
def levanter_python() -> Path:
    """.venv-levanter's Python; bin/setup-levanter makes it once per pinned version."""
    subprocess.run([str(ROOT / "bin" / "setup-levanter")], check=True, timeout=3600)  # noqa: S603
    return ROOT / ".venv-levanter" / "bin" / "python"


def run_in_levanter(python: Path, args: list[str], tmp_path: Path, **env: str) -> Any:
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))},
        "JAX_PLATFORMS": "cpu",
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path),
        "WANDB_SILENT": "true",
        "HOME": str(tmp_path),  # W&B and JAX write their settings and caches here
        **env,
    }
    return subprocess.run(  # noqa: S603  (the Levanter venv, a script of this repository)
        [str(python), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
        env=environment,
        cwd=tmp_path,
    )


def test_a_levanter_trainer_reports_beside_wandb_in_levanter_s_units(
    job: Run, levanter_python: Path, tmp_path: Path
) -> None:
    result = run_in_levanter(
        levanter_python, [str(HERE / "levanter_train.py"), str(tmp_path)], tmp_path
    )
    assert result.returncode == 0, result.stderr[-4000:]
    outcome = json.loads(result.stdout.strip().splitlines()[-1])

    def series(key: str) -> dict[int, float]:
        return dict(MetricPoint.objects.filter(run=job, key=key).values_list("step", "value"))

    # Every step's loss, delivered at exit though nothing called finish().
    losses = series("train/loss")
    assert sorted(losses) == list(range(outcome["final_step"] + 1))
    assert losses[max(losses)] == pytest.approx(outcome["final_loss"], rel=1e-5)
    # MFU as Levanter logs it, a percent: model FLOP/s over the peak, times 100.
    mfu, gflops = series("throughput/mfu"), series("throughput/gflops_per_second")
    assert sorted(mfu) == sorted(gflops) == sorted(losses)
    for step, percent in mfu.items():
        assert percent == pytest.approx(gflops[step] * 1e9 / outcome["peak_flops"] * 100, rel=1e-6)
    durations = series("throughput/duration")
    step = max(durations)
    expected = outcome["flops_per_example"] * outcome["batch"] / durations[step]
    assert mfu[step] == pytest.approx(expected / outcome["peak_flops"] * 100, rel=1e-6)
    job.refresh_from_db()
    summary = job.final_metrics
    assert summary["final_loss"] == pytest.approx(outcome["final_loss"])
    # The summary's MFU percentiles, in the same unit as the points.
    assert min(mfu.values()) <= summary["throughput/p50_mfu"] <= max(mfu.values())
    assert "text" not in summary
    assert job.tracker_config == {"optimizer": {"lr": 0.01}, "steps": 5}
    assert MetricSummary.objects.filter(run=job, key="throughput/mfu").exists()
    assert job.state == RunState.RUNNING  # the job's exit decides how it ended
    # W&B ran beside it, offline: its run directory holds the run's data.
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    assert list(runs[0].glob("run-*.wandb"))
    assert not (tmp_path / "unsent_metrics.jsonl").exists()


TRACKER_INTERFACE = """
import json, sys
import jax.numpy as jnp
import levanter.tracker
from levanter.tracker import Tracker, current_tracker
from marin_client.levanter import MarinSiteTracker, MarinSiteTrackerConfig

assert issubclass(MarinSiteTracker, Tracker)
tracker = MarinSiteTrackerConfig(flush_interval=0.2, report_final_status=True).init(None)
with current_tracker(tracker):
    for step in range(20):
        levanter.tracker.log(
            {"train": {"loss": jnp.asarray(3.0 - step / 10)}, "hist": jnp.ones(3)}, step=step
        )
    levanter.tracker.log({"train/loss": float("nan")}, step=20)
tracker.finish()
tracker.finish()  # once only
print(json.dumps({"skipped": tracker.skipped, "stats": dict(tracker.client.stats)}))
"""


def test_the_tracker_interface_under_current_tracker(
    job: Run, levanter_python: Path, tmp_path: Path
) -> None:
    result = run_in_levanter(levanter_python, ["-c", TRACKER_INTERFACE], tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    steps = list(
        MetricPoint.objects.filter(run=job, key="train/loss")
        .order_by("step")
        .values_list("step", flat=True)
    )
    assert steps == list(range(20))  # NaN at step 20 is refused by the site, not stored
    assert outcome["skipped"] == 20  # the histograms
    assert outcome["stats"]["sent"] == 20
    spilled = [
        json.loads(line) for line in (tmp_path / "unsent_metrics.jsonl").read_text().splitlines()
    ]
    assert [(p["key"], p["step"], p["value"]) for p in spilled if "key" in p] == [
        ("train/loss", 20, "nan")
    ]
    assert not MetricPoint.objects.filter(run=job, key="hist").exists()
    job.refresh_from_db()
    assert job.state == RunState.FINISHED  # report_final_status


def test_the_tracker_is_chosen_by_name_and_refuses_to_start_without_its_environment(
    levanter_python: Path, tmp_path: Path
) -> None:
    code = """
import draccus
from levanter.trainer import TrainerConfig
from marin_client.levanter import MarinSiteTrackerConfig
config = draccus.decode(
    TrainerConfig, {"tracker": [{"type": "wandb"}, {"type": "marin_site", "flush_interval": 0.5}]}
)
assert isinstance(config.tracker[1], MarinSiteTrackerConfig), config.tracker
assert config.tracker[1].flush_interval == 0.5
try:
    MarinSiteTrackerConfig().init(None)
except ValueError as exc:
    print(exc)
"""
    env = {"RUN_API_URL": "", "RUN_ID": "", "RUN_TOKEN": ""}
    result = run_in_levanter(levanter_python, ["-c", code], tmp_path, **env)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "needs RUN_API_URL, RUN_ID, RUN_TOKEN" in result.stdout


def test_the_client_module_imports_without_levanter() -> None:
    code = (
        "import sys; sys.modules['levanter'] = None; sys.modules['jax'] = None\n"
        "import marin_client, marin_client.client, marin_client.agent\n"
        "print(sorted(m for m, v in sys.modules.items() if v is not None and m.startswith(('django', 'levanter', 'jax'))))"
    )
    result = subprocess.run(  # noqa: S603  (this Python, a fixed script)
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"
