"""What runs/ does when something happens: receivers, in one place.

Every receiver of the app is a ``@receiver``-decorated function here, connected when
``RunsConfig.ready()`` imports this module (as ``proposals/receivers.py`` is).
"""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from marin_site.pagecache import PAGE_SIGNALS, generation_bump
from runs.models import TERMINAL_RUN_STATES, Plan, PlanLaunch, Recipe, RecipeEvent, Run, RunEvent
from runs.series.rollup import series_refresh_now
from runs.signals import run_state_changed


@receiver(PAGE_SIGNALS, sender=Recipe, dispatch_uid="pagecache:runs.Recipe")
@receiver(PAGE_SIGNALS, sender=RecipeEvent, dispatch_uid="pagecache:runs.RecipeEvent")
@receiver(PAGE_SIGNALS, sender=Plan, dispatch_uid="pagecache:runs.Plan")
@receiver(PAGE_SIGNALS, sender=PlanLaunch, dispatch_uid="pagecache:runs.PlanLaunch")
@receiver(PAGE_SIGNALS, sender=Run, dispatch_uid="pagecache:runs.Run")
@receiver(PAGE_SIGNALS, sender=RunEvent, dispatch_uid="pagecache:runs.RunEvent")  # timelines
def on_page_row_changed(sender: Any, **kwargs: Any) -> None:
    """A row the public pages show was written: every cached page is stale."""
    generation_bump()


@receiver(run_state_changed, dispatch_uid="runs.refresh_ended_run")
def on_run_state_changed(sender: Any, *, run_id: int, to_state: str, **kwargs: Any) -> None:
    """A run that ended has its charts' series refreshed at once, not at the next period."""
    if to_state in TERMINAL_RUN_STATES:
        series_refresh_now(run_id=run_id)
