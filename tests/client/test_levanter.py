"""The ``marin_site`` Levanter tracker, with the real Levanter (Marin's fork, JAX on CPU): a
few steps of Levanter's own Trainer, and the Tracker interface under ``current_tracker``,
reporting to a live server."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections

from runs import tokens
from runs.models import MetricPoint, MetricSummary, Run, RunState
from runs.services import runs as run_writes
from tests.runs.runs_helpers import launched_plan

os.environ.setdefault("JAX_PLATFORMS", "cpu")

pytestmark = [
    pytest.mark.django_db(transaction=True),
    # JAX and Levanter warn about their own APIs (e.g. thread_resources in JAX 0.8)
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


@pytest.fixture
def job(recipe: Any, live_server: Any, monkeypatch: pytest.MonkeyPatch) -> Run:
    """A running run and the environment the site gives the jobs it launches."""
    run = Run.objects.filter(plan=launched_plan(recipe)).order_by("pk").first()
    assert run is not None
    run = run_writes.run_transition(
        run_id=run.pk,
        to_state=RunState.RUNNING,
        door="worker",
        changes={"token_hash": tokens.token_hash(tokens.run_token(run=run))},
    )
    monkeypatch.setenv("RUN_API_URL", f"{live_server.url}/api/v1/")
    monkeypatch.setenv("RUN_ID", str(run.pk))
    monkeypatch.setenv("RUN_TOKEN", tokens.run_token(run=run))
    monkeypatch.setitem(connections.databases["default"], "CONN_MAX_AGE", 0)
    return run


def test_the_tracker_is_chosen_by_name_in_a_levanter_config() -> None:
    import draccus
    from levanter.trainer import TrainerConfig
    from marin_client.levanter import MarinSiteTrackerConfig

    config = draccus.decode(
        TrainerConfig,
        {"tracker": [{"type": "noop"}, {"type": "marin_site", "flush_interval": 0.5}]},
    )
    assert isinstance(config.tracker, tuple)
    assert isinstance(config.tracker[1], MarinSiteTrackerConfig)
    assert config.tracker[1].flush_interval == 0.5


def test_a_levanter_training_loop_reports_to_the_run(job: Run, tmp_path: pathlib.Path) -> None:
    import draccus
    import equinox as eqx
    import haliax as hax
    import jax
    import jax.numpy as jnp
    import levanter
    import marin_client.levanter  # noqa: F401  (registers marin_site)
    import optax
    from levanter.trainer import Trainer, TrainerConfig

    feature = hax.Axis("feature", 4)
    batch = hax.Axis("batch", 8)

    class Linear(eqx.Module):
        w: hax.NamedArray

        def __call__(self, x: hax.NamedArray) -> hax.NamedArray:
            return hax.dot(x, self.w, axis=feature)

    def loss_fn(model: Linear, example: Any, **kwargs: Any) -> Any:
        x, y = example
        return hax.mean((model(x) - y) ** 2).scalar()

    def batches() -> Iterator[Any]:
        key = jax.random.PRNGKey(0)
        true_w = hax.named(jnp.arange(4.0), feature)
        while True:
            key, sub = jax.random.split(key)
            x = hax.random.normal(sub, (batch, feature))
            yield x, hax.dot(x, true_w, axis=feature)

    config = draccus.decode(
        TrainerConfig,
        {
            "num_train_steps": 6,
            "train_batch_size": 8,
            "id": "marin-site-test",
            "require_accelerator": False,
            "log_jaxprs": False,
            "log_xla_hlo": False,
            "log_dir": str(tmp_path / "logs"),
            "checkpointer": {"base_path": str(tmp_path / "checkpoints")},
            "tracker": {"type": "marin_site", "flush_interval": 0.2},
        },
    )
    trainer = Trainer(config, optax.sgd(0.1), loss_fn)
    with trainer:
        trainer.tracker.log_hyperparameters({"optimizer": {"lr": 0.1}, "steps": 6})
        state = trainer.initial_state(jax.random.PRNGKey(1), model=Linear(hax.zeros(feature)))
        info = trainer.train(state, batches())
        levanter.tracker.log_summary({"final_loss": float(info.loss), "text": "ignored"})
        trainer.tracker.log_artifact(str(tmp_path / "checkpoints"), name="checkpoints", type="ckpt")
    trainer.tracker.finish()

    losses = dict(
        MetricPoint.objects.filter(run=job, key="train/loss").values_list("step", "value")
    )
    assert len(losses) >= 3
    assert losses[max(losses)] == pytest.approx(float(info.loss), rel=1e-5)
    assert MetricSummary.objects.filter(run=job, key="throughput/loading_time").exists()
    job.refresh_from_db()
    assert job.tracker_config == {"optimizer": {"lr": 0.1}, "steps": 6}
    assert job.final_metrics == {"final_loss": pytest.approx(float(info.loss))}
    assert job.tracker_artifacts == [
        {"uri": str(tmp_path / "checkpoints"), "name": "checkpoints", "type": "ckpt"}
    ]
    assert job.state == RunState.RUNNING  # the job's exit decides how it ended


def test_the_tracker_interface_under_current_tracker(job: Run) -> None:
    import jax.numpy as jnp
    import levanter.tracker
    from levanter.tracker import Tracker, current_tracker
    from marin_client.levanter import MarinSiteTrackerConfig

    tracker = MarinSiteTrackerConfig(flush_interval=0.2, report_final_status=True).init(None)
    assert isinstance(tracker, Tracker)
    with current_tracker(tracker):
        for step in range(20):
            levanter.tracker.log(
                {"train": {"loss": jnp.asarray(3.0 - step / 10)}, "hist": jnp.ones(3)}, step=step
            )
        levanter.tracker.log({"train/loss": float("nan")}, step=20)  # skipped, never sent
    tracker.finish()
    steps = list(
        MetricPoint.objects.filter(run=job, key="train/loss")
        .order_by("step")
        .values_list("step", flat=True)
    )
    assert steps == list(range(20))
    assert not MetricPoint.objects.filter(run=job, key="hist").exists()
    job.refresh_from_db()
    assert job.state == RunState.FINISHED  # report_final_status


def test_the_tracker_refuses_to_start_without_its_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from marin_client.levanter import MarinSiteTrackerConfig

    for name in ("RUN_API_URL", "RUN_ID", "RUN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="RUN_API_URL, RUN_ID, RUN_TOKEN"):
        MarinSiteTrackerConfig().init(None)


def test_the_client_module_imports_without_levanter() -> None:
    code = (
        "import sys; sys.modules['levanter'] = None; sys.modules['jax'] = None\n"
        "import marin_client.client\n"
        "print(sorted(m for m, v in sys.modules.items() if v is not None and m.startswith(('django', 'levanter', 'jax'))))"
    )
    result = subprocess.run(  # noqa: S603  (this Python, a fixed script)
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"
