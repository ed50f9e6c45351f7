"""The importers of runs from the project's past, registered into ``marin_site.importing``
from ``RunsConfig.ready()``: ``speedrun`` (``speedrun.py``),
``tracker_metrics`` (``tracker.py``), ``wandb_history`` (``wandb.py``)."""

from __future__ import annotations


def register_all() -> None:
    from runs.imports import speedrun, tracker, wandb

    speedrun.register()
    tracker.register()
    wandb.register()
