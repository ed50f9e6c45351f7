"""Adding rows to the outbox, inside the transaction of the change that causes them.

The proposal services call these, so a write exists exactly when the change that caused
it committed; each addition nudges the proposal's drain once the transaction commits.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from proposals.github import client as gh
from proposals.github.outbox.drain import github_outbox_drain
from proposals.github.outbox.render import render_review
from proposals.models import (
    Comment,
    GitHubOutbox,
    OutboxOperation,
    OutboxState,
    Proposal,
    Review,
    State,
)

logger = logging.getLogger(__name__)

SYNC_OPERATIONS = (
    OutboxOperation.BODY_SYNC,
    OutboxOperation.STATUS_SYNC,
    OutboxOperation.LABELS_SYNC,
)


def _nudge(proposal_id: int) -> None:
    def send() -> None:
        try:
            github_outbox_drain.apply_async(kwargs={"proposal_id": proposal_id}, retry=False)
        except Exception:  # broker down: the periodic reconciler sends it
            logger.warning("could not enqueue the outbox drain of proposal %s", proposal_id)

    transaction.on_commit(send, robust=True)


def _add(proposal: Proposal, operation: str, key: str, payload: dict[str, Any]) -> GitHubOutbox:
    row, _ = GitHubOutbox.objects.get_or_create(
        idempotency_key=key[:200],
        defaults={"proposal": proposal, "operation": operation, "payload": payload},
    )
    _nudge(proposal.pk)
    return row


def quiet(proposal: Proposal) -> bool:
    """An imported old issue (``manage.py github_backfill``) is a mirror: nothing is written
    to GitHub about it (no comment, label, managed block or status comment) until a
    maintainer adopts it."""
    return proposal.state == State.IMPORTED


def outbox_proposal_changed(*, proposal: Proposal) -> None:
    """Queue what a change of the proposal means on GitHub: the issue, body, status, labels.

    Drafts made on the site get no issue until they are submitted. The sync writes compute
    what to send when they are sent, so one unsent row of each kind is enough.
    """
    if not gh.sync_enabled() or quiet(proposal):
        return
    has_issue = proposal.github_issue_number is not None
    if not has_issue:
        if proposal.state in {State.DRAFT, State.WITHDRAWN}:  # never submitted: no issue
            return
        _add(proposal, OutboxOperation.ISSUE_CREATE, f"issue_create:{proposal.pk}", {})
    unsent = set(
        GitHubOutbox.objects.filter(
            proposal=proposal,
            state=OutboxState.PENDING,
            operation__in=SYNC_OPERATIONS,
            attempts=0,
            leased_until__isnull=True,
        ).values_list("operation", flat=True)
    )
    stamp = f"{timezone.now().timestamp():.6f}"
    for operation in SYNC_OPERATIONS:
        if operation == OutboxOperation.BODY_SYNC and not has_issue:
            continue  # the create writes the body
        if operation not in unsent:
            _add(proposal, operation, f"{operation}:{proposal.pk}:{stamp}", {})


def outbox_comment_enqueue(
    *, proposal: Proposal, key: str, body: str, comment_id: int | None = None
) -> GitHubOutbox | None:
    """Queue a comment on the proposal's issue (a site comment, an answer, a result)."""
    if not gh.sync_enabled() or quiet(proposal):
        return None
    if (
        proposal.github_issue_number is None
        and not GitHubOutbox.objects.filter(
            proposal=proposal, operation=OutboxOperation.ISSUE_CREATE
        ).exists()
    ):
        return None  # no issue and none coming: nothing to comment on
    return _add(
        proposal,
        OutboxOperation.COMMENT_CREATE,
        f"comment:{key}",
        {"body": body, "comment_id": comment_id},
    )


def outbox_site_comment(*, comment: Comment) -> None:
    """A comment written on the site appears on the issue, with a footer naming its author."""
    proposal = comment.proposal
    link = f"{settings.SITE_URL}{proposal.get_absolute_url()}"
    who = comment.author_label or "someone"
    body = f"{comment.body}\n\n---\n*{who} commented on [marin-site]({link}).*"
    outbox_comment_enqueue(
        proposal=proposal, key=f"site:{comment.pk}", body=body, comment_id=comment.pk
    )


def outbox_review_comment(*, review: Review) -> None:
    """A review written on the site appears on the issue; an edited review posts again
    (one comment per distinct score, recommendation and text)."""
    content = f"{review.score}|{review.recommendation}|{review.text}"
    digest = hashlib.sha256(content.encode()).hexdigest()[:16]
    outbox_comment_enqueue(
        proposal=review.proposal, key=f"review:{review.pk}:{digest}", body=render_review(review)
    )


def outbox_outcome_comment(*, proposal: Proposal) -> None:
    """The maintainer's verdict as a comment: outcome, confidence and the conclusion. One
    comment per distinct verdict; changing it posts the new one (the old stays, dated)."""
    link = f"{settings.SITE_URL}{proposal.get_absolute_url()}"
    confidence = f" ({proposal.get_confidence_display()})" if proposal.confidence else ""
    body = f"**Outcome: {proposal.get_outcome_display()}**{confidence}"
    if proposal.conclusion.strip():
        body += f"\n\n{proposal.conclusion.strip()}"
    body += f"\n\nRecorded on [marin-site]({link}); the results are judged against the criteria as approved."
    verdict = f"{proposal.outcome}|{proposal.confidence}|{proposal.conclusion}"
    digest = hashlib.sha256(verdict.encode()).hexdigest()[:16]
    outbox_comment_enqueue(proposal=proposal, key=f"outcome:{proposal.pk}:{digest}", body=body)


@transaction.atomic
def outbox_retry(*, row_id: int) -> GitHubOutbox:
    """Put a failed row back in line (a maintainer's retry button)."""
    row = GitHubOutbox.objects.select_for_update().get(pk=row_id)
    if row.state == OutboxState.FAILED:
        row.state = OutboxState.PENDING
        row.attempts = 0
        row.next_attempt_at = None
        row.leased_until = None
        row.save(update_fields=["state", "attempts", "next_attempt_at", "leased_until"])
        _nudge(row.proposal_id)
    return row
