"""Celery tasks of runs: thin, idempotent, ids only. The services do the work."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from runs.alerts.tasks import (  # noqa: F401  (registered with the others)
    alerts_close_ended_task,
    alerts_silence_check_task,
)
from runs.results import summary as results
from runs.series import rollup
from runs.services import dispatch, dry_runs, reconcile
from runs.trackers import uploads as tracker_uploads


@shared_task(name="runs.plan_expand", time_limit=120, soft_time_limit=100)
def plan_expand_task(*, plan_id: int) -> int:
    return dispatch.plan_expand(plan_id=plan_id)


@shared_task(name="runs.dispatch", time_limit=120, soft_time_limit=100)
def dispatch_task() -> list[int]:
    return dispatch.runs_dispatch()


@shared_task(name="runs.run_reconcile", time_limit=60, soft_time_limit=50)
def run_reconcile_task(*, run_id: int) -> str:
    run = reconcile.run_reconcile(run_id=run_id)
    return run.state if run is not None else ""


@shared_task(name="runs.plan_stop", time_limit=120, soft_time_limit=100)
def plan_stop_task(*, plan_id: int) -> int:
    return reconcile.plan_stop(plan_id=plan_id)


# Longer than an Iris submit may take (RUNS_IRIS_SUBMIT_TIMEOUT): a submit is not cut short.
@shared_task(name="runs.dry_run_submit", time_limit=180, soft_time_limit=170)
def dry_run_submit_task(*, dry_run_id: int) -> str:
    return dry_runs.dry_run_submit(dry_run_id=dry_run_id)


@shared_task(name="runs.plan_check_finished", time_limit=60, soft_time_limit=50)
def plan_check_finished_task(*, plan_id: int) -> bool:
    return results.plan_check_finished(plan_id=plan_id)


@shared_task(name="runs.reconcile", time_limit=240, soft_time_limit=200)
def reconcile_task() -> dict[str, Any]:
    return dict(reconcile.runs_reconcile())


@shared_task(name="runs.series_refresh", time_limit=120, soft_time_limit=100)
def series_refresh_task(*, run_id: int) -> int:
    return rollup.series_refresh(run_id=run_id)


@shared_task(name="runs.series_refresh_stale", time_limit=240, soft_time_limit=200)
def series_refresh_stale_task() -> int:
    return rollup.series_refresh_stale()


@shared_task(name="runs.tracker_import", time_limit=3600, soft_time_limit=3500)
def tracker_import_task(*, import_id: int) -> str:
    return tracker_uploads.tracker_import_run(import_id=import_id)


@shared_task(name="runs.tracker_imports_resume", time_limit=3600, soft_time_limit=3500)
def tracker_imports_resume_task() -> int:
    return tracker_uploads.tracker_imports_resume()


@shared_task(name="runs.board_rank", time_limit=600, soft_time_limit=540)
def board_rank_task(*, recipe_name: str | None = None, track_id: int | None = None) -> int:
    """Rank the board's tracks that read ``recipe_name`` (one track by id; every track when
    neither is given). Answers how many tracks were ranked."""
    from runs.board.models import BoardTrack
    from runs.board.rank import boards_rank_for, rank_asked_forget, track_rank

    if recipe_name is not None:
        rank_asked_forget(recipe_name)
    if track_id is not None:
        track = BoardTrack.objects.filter(pk=track_id, active=True).first()
        return 0 if track is None else int(bool(track_rank(track)))
    return len(boards_rank_for(recipe_name))
