"""Draining the outbox: one proposal's rows sent one at a time, in id order, after commit.

A failure reschedules the row (exponential backoff with jitter, or what GitHub asks) and
stops the drain, so later writes to that issue wait behind it. Several drains of one
proposal may run at once: a row is claimed in one conditional UPDATE (still pending, due,
not leased) and re-read, so only one drain sends it, knowing how often it was tried. The
Celery task that runs a drain is defined here, beside the drain, so that the enqueueing
side can nudge it without importing anything that imports it back.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from celery import shared_task
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from proposals.github import client as gh
from proposals.github.outbox.send import Permanent, Retry, backoff, outbox_send
from proposals.models import GitHubOutbox, OutboxOperation, OutboxState

LEASE = timedelta(minutes=2)


def _next_row(proposal_id: int) -> GitHubOutbox | None:
    """The oldest unsent row, whether or not another drain holds it (the caller then stops:
    writes go out in order); a failed create blocks the issue's other writes."""
    if GitHubOutbox.objects.filter(
        proposal_id=proposal_id,
        operation=OutboxOperation.ISSUE_CREATE,
        state=OutboxState.FAILED,
    ).exists():
        return None
    return (
        GitHubOutbox.objects.filter(proposal_id=proposal_id, state=OutboxState.PENDING)
        .order_by("id")
        .first()
    )


def _claim(row_id: int, now: datetime) -> GitHubOutbox | None:
    """Take a row for this drain in one statement: only while it is pending, due and not
    leased by another drain. Returns the row as stored once claimed (attempts, schedule),
    never the copy read before, which another drain may have sent meanwhile."""
    claimed = (
        GitHubOutbox.objects.filter(pk=row_id, state=OutboxState.PENDING)
        .filter(Q(leased_until__isnull=True) | Q(leased_until__lt=now))
        .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))
        .update(leased_until=now + LEASE)
    )
    return GitHubOutbox.objects.filter(pk=row_id).first() if claimed else None


def outbox_drain(*, proposal_id: int, limit: int = 200) -> datetime | None:
    """Send the proposal's due rows in order; return when to come back, if anything waits."""
    if not gh.sync_enabled():
        return None
    client = gh.github_client()
    repo = gh.github_repo(client)
    for _ in range(limit):
        found = _next_row(proposal_id)
        now = timezone.now()
        if found is None:
            return None
        if found.leased_until is not None and found.leased_until >= now:
            return None  # another drain is sending this issue's writes; it carries on
        if found.next_attempt_at and found.next_attempt_at > now:
            return found.next_attempt_at
        row = _claim(found.pk, now)
        if row is None:
            continue  # it changed since it was read (sent, rescheduled, taken): look again
        try:
            result = outbox_send(repo=repo, row=row)
        except Retry as exc:
            row.attempts += 1
            row.last_error = exc.message
            row.leased_until = None
            if row.attempts >= settings.GITHUB_OUTBOX_MAX_ATTEMPTS:
                row.state = OutboxState.FAILED
                row.save(update_fields=["attempts", "last_error", "leased_until", "state"])
                continue
            row.next_attempt_at = timezone.now() + timedelta(
                seconds=backoff(row.attempts, exc.delay)
            )
            row.save(update_fields=["attempts", "last_error", "leased_until", "next_attempt_at"])
            return row.next_attempt_at
        except Permanent as exc:
            row.attempts += 1
            row.state = OutboxState.FAILED
            row.last_error = str(exc)
            row.leased_until = None
            row.save(update_fields=["attempts", "state", "last_error", "leased_until"])
            continue
        row.attempts += 1
        row.state = OutboxState.DONE
        row.result = result
        row.sent_at = timezone.now()
        row.leased_until = None
        row.last_error = ""
        row.save(
            update_fields=["attempts", "state", "result", "sent_at", "leased_until", "last_error"]
        )
        remaining, _limit = client.rate_limiting
        if remaining == 0:
            reset = datetime.fromtimestamp(client.rate_limiting_resettime, tz=UTC)
            GitHubOutbox.objects.filter(proposal_id=proposal_id, state=OutboxState.PENDING).update(
                next_attempt_at=reset
            )
            return reset
    return timezone.now()


def outbox_due_proposals() -> list[int]:
    """Proposals with a row that is due and not being sent: what the reconciler nudges."""
    now = timezone.now()
    return list(
        GitHubOutbox.objects.filter(state=OutboxState.PENDING)
        .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))
        .filter(Q(leased_until__isnull=True) | Q(leased_until__lt=now))
        .order_by("proposal_id")  # the model's ordering would defeat distinct()
        .values_list("proposal_id", flat=True)
        .distinct()[:500]
    )


@shared_task(bind=True, name="proposals.github_outbox_drain", time_limit=120, soft_time_limit=100)
def github_outbox_drain(self: object, *, proposal_id: int) -> None:
    """Send one proposal's due GitHub writes in order; come back later instead of sleeping."""
    come_back = outbox_drain(proposal_id=proposal_id)
    if come_back is not None and not getattr(getattr(self, "request", None), "is_eager", False):
        delay = max(0.0, (come_back - timezone.now()).total_seconds())
        github_outbox_drain.apply_async(kwargs={"proposal_id": proposal_id}, countdown=delay)
