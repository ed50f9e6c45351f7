"""A Levanter tracker that reports to marin-site, beside W&B and TensorBoard.

Levanter (and Marin, whose trainer it is) picks trackers by name from its config; importing
this module registers ``marin_site``::

    trainer:
      tracker:
        - type: wandb
        - type: marin_site          # RUN_API_URL, RUN_ID, RUN_TOKEN from the job's environment

Points go through ``marin_client.client.RunClient`` (batched, retried, spilled to a file if the site
stays away); hyperparameters become the run's reported config, summaries its summary,
artifacts links on its page. Only process 0 of a multi-host job reports, as Levanter's own
file trackers do. This module imports levanter; ``marin_client.client`` stays standard-library only.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import math
import os
import typing
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

import jax
from levanter.tracker import NoopTracker, Tracker, TrackerConfig

from marin_client.client import RunClient

logger = logging.getLogger(__name__)


def _scalar(value: Any) -> float | None:
    """A float from a Python, NumPy or JAX scalar (NaN included); None for anything else."""
    if isinstance(value, bool | str | bytes) or value is None:
        return None
    if getattr(value, "shape", ()) not in ((), (1,)):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out.update(_flatten(value, name))
        else:
            out[name] = value
    return out


def _jsonable(value: Any) -> Any:
    """Hyperparameters as JSON: containers kept, scalars as numbers, the rest as text."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))
    number = _scalar(value)
    return number if number is not None and math.isfinite(number) else str(value)


class MarinSiteTracker(Tracker):
    """Levanter's Tracker interface over a RunClient. Never raises into the training loop:
    the client queues, and what it cannot deliver it spills (``unsent_metrics.jsonl``).

    Levanter's Trainer does not call ``finish`` when it is done (``train_lm`` does), so the
    tracker finishes itself at the interpreter's exit too (``atexit``): what is queued is
    delivered or spilled either way. ``finish`` runs once."""

    name: str = "marin_site"

    def __init__(self, client: RunClient, *, report_final_status: bool = False) -> None:
        self.client = client
        self.report_final_status = report_final_status
        self.skipped = 0  # values that are not scalars (histograms, text), counted and logged
        self._finished = False
        atexit.register(self.finish)

    def log_hyperparameters(self, hparams: dict[str, Any]) -> None:
        self.client.report(config=_jsonable(hparams))

    def log(
        self, metrics: typing.Mapping[str, Any], *, step: int | None, commit: bool | None = None
    ) -> None:
        del commit  # every point is sent in the next batch
        if step is None:
            self.skipped += len(metrics)
            return
        scalars: dict[str, float] = {}
        for key, value in _flatten(jax.device_get(dict(metrics))).items():
            number = _scalar(value)
            if number is None:
                self.skipped += 1
            else:
                scalars[key] = number
        # NaN and infinities are sent: the site opens its divergence alert on them
        self.client.log_many(scalars, int(step))

    def log_summary(self, metrics: dict[str, Any]) -> None:
        flat = _flatten(jax.device_get(dict(metrics)))
        summary = {
            k: n for k, v in flat.items() if (n := _scalar(v)) is not None and math.isfinite(n)
        }
        self.client.report(summary=summary)

    def log_artifact(
        self, artifact_path: Any, *, name: str | None = None, type: str | None = None
    ) -> None:
        uri = str(artifact_path)
        label = name or PurePath(uri).name or uri
        self.client.report(artifacts=[{"uri": uri, "name": label, "type": type or ""}])

    def finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        atexit.unregister(self.finish)
        if self.report_final_status:
            self.client.finish("finished")
        else:
            self.client.close()
        if self.skipped:
            logger.info("marin_site tracker: %d values were not scalars, not sent", self.skipped)


@TrackerConfig.register_subclass("marin_site")
@dataclasses.dataclass
class MarinSiteTrackerConfig(TrackerConfig):
    """Where to report: the job's environment by default (the site sets RUN_API_URL, RUN_ID
    and RUN_TOKEN for the jobs it launches). The token is read from the environment only,
    never from the config, which Levanter logs."""

    api_url: str | None = None
    run_id: str | None = None
    token_env: str = "RUN_TOKEN"  # noqa: S105  (the variable's name, not a token)
    flush_interval: float = 2.0
    report_final_status: bool = False

    def init(self, run_id: str | None) -> Tracker:
        del run_id  # Levanter's run id; marin-site's run comes from RUN_ID
        if jax.process_index() != 0:
            return NoopTracker()
        api_url = self.api_url or os.environ.get("RUN_API_URL", "")
        site_run = self.run_id or os.environ.get("RUN_ID", "")
        token = os.environ.get(self.token_env, "")
        missing = [
            name
            for name, value in (
                ("RUN_API_URL", api_url),
                ("RUN_ID", site_run),
                (self.token_env, token),
            )
            if not value
        ]
        if missing:
            raise ValueError(
                f"The marin_site tracker needs {', '.join(missing)} (set by marin-site for the "
                "jobs it launches, or by hand for a claimed run)."
            )
        client = RunClient(
            api_url=api_url, run_id=site_run, token=token, flush_interval=self.flush_interval
        )
        client.start()
        return MarinSiteTracker(client, report_final_status=self.report_final_status)
