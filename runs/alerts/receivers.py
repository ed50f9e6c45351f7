"""What alerts do when something else happens in runs (connected in ``runs/receivers.py``):
a run that ends closes its alerts; a rule or a recipe that changes drops this process's
cached rules."""

from __future__ import annotations

import logging

from runs.alerts import rules

logger = logging.getLogger(__name__)


def alerts_close_with_run(*, run_id: int, state: str) -> None:
    from runs.alerts.tasks import alerts_close_ended_task

    try:
        alerts_close_ended_task.apply_async(kwargs={"run_id": run_id, "state": state}, retry=False)
    except Exception:  # the broker is down: the periodic silence check closes them
        logger.warning("could not enqueue closing the alerts of run %s", run_id)


def alert_rules_forget() -> None:
    rules.rules_forget()
