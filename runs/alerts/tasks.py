"""Celery tasks of alerts: thin, idempotent. Imported by ``RunsConfig.ready()``."""

from __future__ import annotations

from celery import shared_task

from runs.alerts import services


@shared_task(name="runs.alerts_silence_check", time_limit=120, soft_time_limit=100)
def alerts_silence_check_task() -> dict[str, int]:
    return services.alerts_silence_check()


@shared_task(name="runs.alerts_close_ended", time_limit=60, soft_time_limit=50)
def alerts_close_ended_task(*, run_id: int, state: str) -> int:
    return services.alerts_close_ended(run_id=run_id, state=state)
