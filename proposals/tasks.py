"""Celery tasks of proposals (the GitHub sync): thin, idempotent, ids only.

The two drains' tasks are defined beside the drains they run (``github.outbox.drain``,
``github.deliveries``), because the writes that nudge them live below this module; the
reconciler, which nudges both, is here. Importing this module (Celery's autodiscovery
does) registers all three.
"""

from __future__ import annotations

import smtplib
from typing import Any

from celery import shared_task

from proposals.github.accounts import github_roles_sync
from proposals.github.client import sync_enabled
from proposals.github.deliveries import deliveries_left_behind, github_deliveries_drain
from proposals.github.outbox.drain import github_outbox_drain, outbox_due_proposals


@shared_task(name="proposals.github_outbox_reconcile", time_limit=60, soft_time_limit=50)
def github_outbox_reconcile() -> int:
    """Nudge every proposal with due writes, and deliveries left unprocessed (lost nudges);
    keep the GitHub roles bound to the ids of the configured logins."""
    if sync_enabled():
        github_roles_sync()
    due = outbox_due_proposals()
    for proposal_id in due:
        github_outbox_drain.apply_async(kwargs={"proposal_id": proposal_id})
    if deliveries_left_behind():
        github_deliveries_drain.apply_async()
    return len(due)


@shared_task(
    name="proposals.notice_send",
    bind=True,
    time_limit=120,
    soft_time_limit=100,
    max_retries=5,
    default_retry_delay=30,
)
def notice_send_task(self: Any, *, notice_id: int) -> int:
    """Mail a notice to the proposal's followers; safe to run twice (``follows``)."""
    from proposals.follows import notice_send

    try:
        return notice_send(notice_id=notice_id)
    except (OSError, smtplib.SMTPException) as exc:  # the mail server: transient
        raise self.retry(exc=exc) from exc


@shared_task(name="proposals.notices_reconcile", time_limit=240, soft_time_limit=200)
def notices_reconcile_task() -> int:
    from proposals.follows import notices_reconcile

    return notices_reconcile()
