"""Helpers of the tracker import tests: what Levanter's json_logger writes."""

from __future__ import annotations

import json
import math


def json_logger_lines(steps: int, *, nan_at: int | None = None) -> list[str]:
    """What Levanter's json_logger writes: hparams, a log event per step, summary, finish."""
    lines = [
        json.dumps(
            {
                "tracker": "json_logger",
                "event": "hparams",
                "hparams": {"model": {"width": 32}, "lr": 0.003},
            }
        )
    ]
    for step in range(steps):
        loss = math.nan if step == nan_at else 3.0 - step / steps
        lines.append(
            json.dumps(
                {
                    "tracker": "json_logger",
                    "event": "log",
                    "step": step,
                    "metrics": {
                        "train": {"loss": loss},
                        "throughput/tokens_per_second": 1000.0 + step,
                        "optim/learning_rate": 0.003,
                        "note": "text is not a metric",
                        "grads": {
                            "min": 0,
                            "max": 1,
                            "num": 3,
                            "sum": 1,
                            "sum_squares": 1,
                            "bucket_limits": [0, 1],
                            "bucket_counts": [1, 2],
                        },
                    },
                }
            )
        )
    lines.append(
        json.dumps(
            {"tracker": "json_logger", "event": "summary", "metrics": {"parameter_count": 1234}}
        )
    )
    lines.append(
        json.dumps(
            {
                "tracker": "json_logger",
                "event": "artifact",
                "path": "gs://bucket/ckpt/step-10",
                "name": "checkpoint",
                "artifact_type": "model",
            }
        )
    )
    lines.append(
        json.dumps(
            {
                "tracker": "json_logger",
                "event": "finish",
                "summary": {"train/loss": 2.1, "eval/loss": 2.4},
            }
        )
    )
    return lines
