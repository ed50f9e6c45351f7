"""What alerts do when something else happens in runs: a run that ends closes its alerts;
a rule or a recipe that changes drops this process's cached rules. Connected when
``RunsConfig.ready()`` imports this module."""

from __future__ import annotations

import logging
from typing import Any

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from runs.alerts import rules
from runs.alerts.models import AlertRule
from runs.models import TERMINAL_RUN_STATES, Recipe
from runs.signals import run_state_changed

logger = logging.getLogger(__name__)


@receiver(run_state_changed, dispatch_uid="runs.alerts.close_ended")
def on_run_state_changed(sender: Any, *, run_id: int, to_state: str, **kwargs: Any) -> None:
    if to_state not in TERMINAL_RUN_STATES:
        return
    from runs.alerts.tasks import alerts_close_ended_task

    try:
        alerts_close_ended_task.apply_async(
            kwargs={"run_id": run_id, "state": to_state}, retry=False
        )
    except Exception:  # the broker is down: the periodic silence check closes them
        logger.warning("could not enqueue closing the alerts of run %s", run_id)


@receiver(post_save, sender=AlertRule, dispatch_uid="runs.alerts.rule_saved")
@receiver(post_delete, sender=AlertRule, dispatch_uid="runs.alerts.rule_deleted")
@receiver(post_save, sender=Recipe, dispatch_uid="runs.alerts.recipe_saved")
def on_rules_changed(sender: Any, **kwargs: Any) -> None:
    rules.rules_forget()
