"""Celery tasks of proposals (the GitHub sync): thin, idempotent, ids only."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from proposals.github import outbox, services


@shared_task(bind=True, name="proposals.github_outbox_drain", time_limit=120, soft_time_limit=100)
def github_outbox_drain(self: object, *, proposal_id: int) -> None:
    """Send one proposal's due GitHub writes in order; come back later instead of sleeping."""
    come_back = outbox.outbox_drain(proposal_id=proposal_id)
    if come_back is not None and not getattr(getattr(self, "request", None), "is_eager", False):
        delay = max(0.0, (come_back - timezone.now()).total_seconds())
        github_outbox_drain.apply_async(kwargs={"proposal_id": proposal_id}, countdown=delay)


@shared_task(name="proposals.github_outbox_reconcile", time_limit=60, soft_time_limit=50)
def github_outbox_reconcile() -> int:
    """Nudge every proposal with due writes, and deliveries left unprocessed (lost nudges)."""
    due = outbox.outbox_due_proposals()
    for proposal_id in due:
        github_outbox_drain.apply_async(kwargs={"proposal_id": proposal_id})
    if services.deliveries_left_behind():
        github_deliveries_drain.apply_async()
    return len(due)


@shared_task(
    bind=True, name="proposals.github_deliveries_drain", time_limit=600, soft_time_limit=580
)
def github_deliveries_drain(self: object) -> int:
    """Process stored webhook deliveries; while more keep coming, come back shortly."""
    done, come_back = services.deliveries_drain()
    if come_back and not getattr(getattr(self, "request", None), "is_eager", False):
        github_deliveries_drain.apply_async(countdown=services.DRAIN_LINGER_SECONDS)
    return done
