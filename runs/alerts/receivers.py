"""What alerts do when something else happens in runs (connected in ``runs/receivers.py``):
a run that ends, or whose attempt ends and goes back to the queue, closes its alerts; a rule or
a recipe that changes drops this process's cached rules (other processes see the rules'
version change: runs/invalidation.py)."""

from __future__ import annotations

from marin_site.nudges import task_send
from runs.alerts import rules


def alerts_close_with_run(*, run_id: int, state: str) -> None:
    """Close the run's open alerts soon (the broker down: the periodic silence check does)."""
    task_send("runs.alerts_close_ended", run_id=run_id, state=state)


def alert_rules_forget() -> None:
    rules.rules_forget()
