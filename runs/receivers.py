"""What runs/ does when something happens: receivers, in one place.

Every receiver of the app is a ``@receiver``-decorated function here, connected when
``RunsConfig.ready()`` imports this module (as ``proposals/receivers.py`` is). What a write
makes stale in the caches is not here: it is the app's table in ``invalidation.py``.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.signals import worker_process_init
from django.conf import settings
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from marin_site.nudges import nudge
from runs.alerts.models import AlertRule
from runs.alerts.receivers import alert_rules_forget, alerts_close_with_run
from runs.board.models import BoardTrack
from runs.board.rank import board_rank_soon
from runs.executors import ExecutorError
from runs.models import TERMINAL_RUN_STATES, Recipe, Run, RunState
from runs.series.rollup import series_refresh_now
from runs.signals import run_state_changed

logger = logging.getLogger(__name__)


@receiver(run_state_changed, dispatch_uid="runs.refresh_ended_run")
def on_run_state_changed(sender: Any, *, run_id: int, to_state: str, **kwargs: Any) -> None:
    """A run that ended has its charts' series refreshed at once, not at the next period."""
    if to_state in TERMINAL_RUN_STATES:
        series_refresh_now(run_id=run_id)


@receiver(run_state_changed, dispatch_uid="runs.alerts.close_ended")
def on_run_ended_close_alerts(sender: Any, *, run_id: int, to_state: str, **kwargs: Any) -> None:
    """A run that ended closes its open alerts (they cannot close from its metrics); so does
    an attempt that ended and put the run back in the queue (a lost lease, a preemption): what
    was wrong with the attempt is over, and the next attempt is watched afresh."""
    if to_state in TERMINAL_RUN_STATES or to_state == RunState.QUEUED:
        alerts_close_with_run(run_id=run_id, state=to_state)


@receiver(post_save, sender=AlertRule, dispatch_uid="runs.alerts.rule_saved")
@receiver(post_delete, sender=AlertRule, dispatch_uid="runs.alerts.rule_deleted")
@receiver(post_save, sender=Recipe, dispatch_uid="runs.alerts.recipe_saved")
def on_alert_rules_changed(sender: Any, **kwargs: Any) -> None:
    """A rule or a recipe changed: this process's cached rules are dropped."""
    alert_rules_forget()


@receiver(run_state_changed, dispatch_uid="runs.board.run_finished")
def on_run_finished_rank_board(sender: Any, *, run_id: int, to_state: str, **kwargs: Any) -> None:
    """A finished run may enter the board: the tracks reading its recipe are ranked again (a
    failed, killed or crashed run never enters; it stays on its proposal's page)."""
    if to_state == RunState.FINISHED:
        recipe_name = Run.objects.filter(pk=run_id).values_list("recipe_name", flat=True).first()
        if recipe_name is not None:
            board_rank_soon(recipe_name)


@receiver(post_save, sender=BoardTrack, dispatch_uid="runs.board.track_saved")
def on_board_track_saved(sender: Any, instance: BoardTrack, **kwargs: Any) -> None:
    """A track added or edited (its rule, parameters, recipe) is ranked again."""
    if instance.active and not kwargs.get("raw"):
        nudge("runs.board_rank", track_id=instance.pk)


@receiver(worker_process_init, dispatch_uid="runs.iris.submitter_warm")
def on_worker_process_start_warm_iris(**kwargs: Any) -> None:
    """A worker process that may submit to Iris starts its submitter now, so its first
    submit does not wait seconds for Iris to be imported (runs/executors/iris_process.py)."""
    iris_set = (
        settings.RUNS_IRIS_CONTROLLER_URL,
        settings.RUNS_IRIS_CLUSTER,
        settings.RUNS_IRIS_CONFIG,
    )
    if any(iris_set) and settings.RUNS_IRIS_SUBMITTER == "process":
        from runs.executors.iris import IrisExecutor

        try:
            IrisExecutor().warm()
        except ExecutorError as exc:  # its first submit tries again, saying why
            logger.warning("the Iris submitter did not start: %s", exc)
