"""The importers of runs from the project's past, registered into ``marin_site.importing``
from ``RunsConfig.ready()``: ``speedrun`` (``speedrun.py``),
``tracker_metrics`` (``tracker.py``), ``wandb_history`` (``wandb.py``)."""

from __future__ import annotations


def links_register() -> None:
    """The fields of runs/ whose links ``manage.py links_rewrite`` moves when a host moves."""
    from marin_site import links
    from runs.campaigns.models import Campaign, Intervention
    from runs.models import Recipe, Run

    links.rewritable_register(Recipe, "description")
    links.rewritable_register(Run, "wandb_url", "tracker_artifacts", "tracker_tags")
    links.rewritable_register(Campaign, "description")
    links.rewritable_register(Intervention, "note")


def register_all() -> None:
    from runs.imports import speedrun, tracker, wandb

    links_register()
    speedrun.register()
    tracker.register()
    wandb.register()
