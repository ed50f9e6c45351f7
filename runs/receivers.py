"""What runs/ does when something happens: receivers, in one place.

Every receiver of the app is a ``@receiver``-decorated function here, connected when
``RunsConfig.ready()`` imports this module (as ``proposals/receivers.py`` is).
"""

from __future__ import annotations

from typing import Any

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from marin_site.fragments import versions_bump
from marin_site.pagecache import PAGE_SIGNALS, generation_bump
from runs.alerts.models import Alert, AlertRule
from runs.alerts.receivers import alert_rules_forget, alerts_close_with_run
from runs.campaigns.selectors import CAMPAIGN_LIST_VERSION
from runs.models import (
    TERMINAL_RUN_STATES,
    Campaign,
    CampaignRun,
    Intervention,
    Plan,
    PlanLaunch,
    Recipe,
    RecipeEvent,
    Run,
    RunEvent,
)
from runs.series.rollup import series_refresh_now
from runs.signals import run_state_changed


@receiver(PAGE_SIGNALS, sender=Recipe, dispatch_uid="pagecache:runs.Recipe")
@receiver(PAGE_SIGNALS, sender=RecipeEvent, dispatch_uid="pagecache:runs.RecipeEvent")
@receiver(PAGE_SIGNALS, sender=Plan, dispatch_uid="pagecache:runs.Plan")
@receiver(PAGE_SIGNALS, sender=PlanLaunch, dispatch_uid="pagecache:runs.PlanLaunch")
@receiver(PAGE_SIGNALS, sender=Run, dispatch_uid="pagecache:runs.Run")
@receiver(PAGE_SIGNALS, sender=RunEvent, dispatch_uid="pagecache:runs.RunEvent")  # timelines
@receiver(PAGE_SIGNALS, sender=Alert, dispatch_uid="pagecache:runs.Alert")  # proposal pages
@receiver(PAGE_SIGNALS, sender=Campaign, dispatch_uid="pagecache:runs.Campaign")  # home page
@receiver(PAGE_SIGNALS, sender=CampaignRun, dispatch_uid="pagecache:runs.CampaignRun")
@receiver(PAGE_SIGNALS, sender=Intervention, dispatch_uid="pagecache:runs.Intervention")
def on_page_row_changed(sender: Any, **kwargs: Any) -> None:
    """A row the public pages show was written: every cached page is stale."""
    generation_bump()


@receiver(PAGE_SIGNALS, sender=Campaign, dispatch_uid="fragments:runs.Campaign")
def on_campaign_written(sender: Any, **kwargs: Any) -> None:
    """The home page's list of active campaigns (a fragment) is stale."""
    versions_bump(CAMPAIGN_LIST_VERSION[0], [CAMPAIGN_LIST_VERSION[1]])


@receiver(run_state_changed, dispatch_uid="runs.refresh_ended_run")
def on_run_state_changed(sender: Any, *, run_id: int, to_state: str, **kwargs: Any) -> None:
    """A run that ended has its charts' series refreshed at once, not at the next period."""
    if to_state in TERMINAL_RUN_STATES:
        series_refresh_now(run_id=run_id)


@receiver(run_state_changed, dispatch_uid="runs.alerts.close_ended")
def on_run_ended_close_alerts(sender: Any, *, run_id: int, to_state: str, **kwargs: Any) -> None:
    """A run that ended closes its open alerts (they cannot close from its metrics)."""
    if to_state in TERMINAL_RUN_STATES:
        alerts_close_with_run(run_id=run_id, state=to_state)


@receiver(post_save, sender=AlertRule, dispatch_uid="runs.alerts.rule_saved")
@receiver(post_delete, sender=AlertRule, dispatch_uid="runs.alerts.rule_deleted")
@receiver(post_save, sender=Recipe, dispatch_uid="runs.alerts.recipe_saved")
def on_alert_rules_changed(sender: Any, **kwargs: Any) -> None:
    """A rule or a recipe changed: this process's cached rules are dropped."""
    alert_rules_forget()
