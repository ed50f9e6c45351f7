# mypy: ignore-errors
"""A 5-step Levanter training on JAX's CPU backend with W&B (offline) and marin_site side by
side, as Marin configures its trackers. Run by tests/client/test_levanter.py with the Python
of .venv-levanter (bin/setup-levanter: current marin-levanter needs Python 3.12), with
RUN_API_URL, RUN_ID and RUN_TOKEN pointing at a live site and WANDB_MODE=offline.

    python levanter_train.py OUT_DIR

Never calls ``finish`` on the trackers, as Levanter's ``Trainer`` does not: the marin_site
tracker's own exit path must deliver. Prints one JSON line: the final loss and what the
performance hook computed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import draccus
import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import levanter.callbacks
import levanter.callbacks._metrics as levanter_metrics
import marin_client.levanter  # noqa: F401  (registers the tracker config "marin_site")
import optax
from levanter.trainer import Trainer, TrainerConfig

# JAX's "cpu" device kind has no peak FLOPs in Levanter's table, so no MFU would be logged:
# give it one (1 GFLOP/s) for the test.
CPU_PEAK_FLOPS = 1e9
levanter_metrics.device_flops_for_jax_device = lambda kind: CPU_PEAK_FLOPS

FEATURES = 16
BATCH = 8
STEPS = 5
FLOPS_PER_EXAMPLE = 6.0 * FEATURES  # forward and backward of a linear model, per example


def main(out: Path) -> None:
    feature = hax.Axis("feature", FEATURES)
    batch = hax.Axis("batch", BATCH)

    class Linear(eqx.Module):
        w: hax.NamedArray

        def __call__(self, x):
            return hax.dot(x, self.w, axis=feature)

    def loss_fn(model, example, **kwargs):
        x, y = example
        return hax.mean((model(x) - y) ** 2).scalar()

    def batches():
        key = jax.random.PRNGKey(0)
        true_w = hax.named(jnp.arange(float(FEATURES)), feature)
        while True:
            key, sub = jax.random.split(key)
            x = hax.random.normal(sub, (batch, feature))
            yield x, hax.dot(x, true_w, axis=feature)

    config = draccus.decode(
        TrainerConfig,
        {
            "num_train_steps": STEPS,
            "train_batch_size": BATCH,
            "id": "marin-site-test",
            "require_accelerator": False,
            "log_jaxprs": False,
            "log_xla_hlo": False,
            "log_dir": str(out / "logs"),
            "checkpointer": {"base_path": str(out / "checkpoints")},
            "tracker": [
                {
                    "type": "wandb",
                    "project": "marin-site-test",
                    "mode": "offline",
                    "save_code": False,
                },
                {"type": "marin_site", "flush_interval": 0.2},
            ],
        },
    )
    trainer = Trainer(config, optax.sgd(0.01), loss_fn)
    trainer.add_hook(levanter.callbacks.log_performance_stats(1, BATCH, FLOPS_PER_EXAMPLE), every=1)
    with trainer:
        trainer.tracker.log_hyperparameters({"optimizer": {"lr": 0.01}, "steps": STEPS})
        model = Linear(hax.zeros(feature))
        state = trainer.initial_state(jax.random.PRNGKey(1), model=model)
        info = trainer.train(state, batches())
        levanter.tracker.log_summary({"final_loss": float(info.loss), "text": "not a number"})
    sys.stdout.write(
        json.dumps(
            {
                "final_loss": float(info.loss),
                "final_step": int(info.step),
                "peak_flops": CPU_PEAK_FLOPS * jax.device_count(),
                "flops_per_example": FLOPS_PER_EXAMPLE,
                "batch": BATCH,
            }
        )
        + "\n"
    )
    # No trainer.tracker.finish(): the Trainer does not call it either.


if __name__ == "__main__":
    main(Path(sys.argv[1]))
