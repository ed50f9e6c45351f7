"""Outgoing GitHub writes: stored in the outbox with the change, sent after commit, in order.

``outbox_*_enqueue`` run inside the caller's transaction (the proposal services call them),
so a write exists exactly when the change that caused it committed. ``outbox_drain`` sends
one proposal's rows one at a time, in id order; a failure reschedules the row (exponential
backoff with jitter, or what ``Retry-After`` / ``x-ratelimit-reset`` asks) and stops the
drain, so later writes to that issue wait behind it. Creates carry a marker; a create
whose answer was lost is found by its marker before it is tried again. Several drains of
one proposal may run at once: a row is claimed in one conditional UPDATE (still pending,
due, not leased) and re-read, so only one drain sends it, knowing how often it was tried.
"""

from __future__ import annotations

import hashlib
import logging
import random
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import requests
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from github import GithubException

from proposals.github import client as gh
from proposals.github.body import MARKER_PREFIX, body_with_block
from proposals.models import (
    Comment,
    GitHubOutbox,
    OutboxOperation,
    OutboxState,
    Proposal,
    State,
)
from proposals.selectors import proposal_status_text

logger = logging.getLogger(__name__)

LEASE = timedelta(minutes=2)
STATUS_MARKER = "<!-- marin-site:status -->"
HOLD_LABEL = "on-hold"
STATE_LABEL_PREFIX = "status:"
SYNC_OPERATIONS = (
    OutboxOperation.BODY_SYNC,
    OutboxOperation.STATUS_SYNC,
    OutboxOperation.LABELS_SYNC,
)


def proposal_marker(proposal_id: int) -> str:
    return f"<!-- marin-site:proposal:{proposal_id} -->"


def outbox_marker(key: str) -> str:
    return f"<!-- marin-site:outbox:{key} -->"


def is_own_text(body: str | None) -> bool:
    """Text the site wrote carries one of its markers; it never comes back as input."""
    return MARKER_PREFIX in (body or "")


# Enqueueing: called inside the transaction of the change.


def _nudge(proposal_id: int) -> None:
    from proposals import tasks

    def send() -> None:
        try:
            tasks.github_outbox_drain.apply_async(kwargs={"proposal_id": proposal_id}, retry=False)
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


def outbox_proposal_changed(*, proposal: Proposal) -> None:
    """Queue what a change of the proposal means on GitHub: the issue, body, status, labels.

    Drafts made on the site get no issue until they are submitted. The sync writes compute
    what to send when they are sent, so one unsent row of each kind is enough.
    """
    if not gh.sync_enabled():
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
    if not gh.sync_enabled():
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


# Rendering what the site writes.


def render_block(proposal: Proposal) -> str:
    link = f"{settings.SITE_URL}{proposal.get_absolute_url()}"
    lines = [
        proposal_marker(proposal.pk),
        f"**[Proposal #{proposal.pk} on marin-site]({link})** · {proposal_status_text(proposal)}",
    ]
    if not proposal.github_sections:  # written on the site: the issue shows its sections
        lines += ["", "### Summary", "", proposal.summary]
        if proposal.description:
            lines += ["", "### Description", "", proposal.description]
        if proposal.hypothesis:
            lines += ["", "### Hypothesis", "", proposal.hypothesis]
        if proposal.success_metric:
            threshold = proposal.success_threshold
            lines += [
                "",
                "### Success criteria",
                "",
                f"`{proposal.success_metric}`, {proposal.get_success_direction_display().lower()}"
                + (f", by at least {threshold:g}" if threshold is not None else "")
                + " against the baseline.",
            ]
    return "\n".join(lines)


def render_status(proposal: Proposal) -> str:
    link = f"{settings.SITE_URL}{proposal.get_absolute_url()}"
    lines = [STATUS_MARKER, f"**Status** · {proposal_status_text(proposal)}"]
    if proposal.on_hold:
        lines.append("Approval waits for `/unhold`.")
    if proposal.state_reason:
        lines.append(f"> {proposal.state_reason.splitlines()[0][:500]}")
    plan = proposal.plan
    if plan is not None:
        lines.append(
            f"Plan: {plan.run_count} runs, {plan.total_accelerator_hours:.1f} accelerator-hours"
            + (
                f" of a {plan.budget_accelerator_hours:g} h budget"
                if plan.budget_accelerator_hours is not None
                else ""
            )
        )
    lines.append(f"[Open on marin-site]({link}) · this comment is edited as things change.")
    return "\n\n".join(lines)


def wanted_labels(proposal: Proposal) -> set[str]:
    labels = {f"{STATE_LABEL_PREFIX}{proposal.state.replace('_', '-')}"}
    if proposal.on_hold:
        labels.add(HOLD_LABEL)
    return labels


# Sending.


@dataclass
class Retry(Exception):
    """A transient failure; ``delay`` is what GitHub asked for, if it said."""

    message: str
    delay: float | None = None


class Permanent(Exception):
    pass


def _header(headers: dict[str, str] | None, name: str) -> str | None:
    for key, value in (headers or {}).items():
        if key.lower() == name:
            return value
    return None


def classify(exc: Exception) -> Exception:
    """Retry (with GitHub's requested delay) for rate limits, 5xx and timeouts; else Permanent."""
    if isinstance(exc, requests.exceptions.RequestException):
        return Retry(f"{type(exc).__name__}: {exc}"[:500])
    if isinstance(exc, GithubException):
        message = f"{exc.status}: {exc.data}"[:500]
        retry_after = _header(exc.headers, "retry-after")
        remaining = _header(exc.headers, "x-ratelimit-remaining")
        reset = _header(exc.headers, "x-ratelimit-reset")
        if retry_after and retry_after.isdigit():
            return Retry(message, float(retry_after))
        if remaining == "0" and reset and reset.isdigit():
            return Retry(message, max(1.0, float(reset) - time.time()))
        if exc.status == 429 or exc.status >= 500 or "rate limit" in str(exc.data).lower():
            return Retry(message)
        return Permanent(message)
    return Permanent(f"{type(exc).__name__}: {exc}"[:500])


def backoff(attempts: int, hint: float | None) -> float:
    if hint is not None:
        return hint + random.uniform(0, 1)  # noqa: S311  (jitter, not cryptography)
    base = float(settings.GITHUB_OUTBOX_BACKOFF_SECONDS)
    cap = float(settings.GITHUB_OUTBOX_BACKOFF_MAX_SECONDS)
    return min(cap, base * 2 ** max(0, attempts - 1)) * random.uniform(0.5, 1.0)  # noqa: S311


def _find_comment(issue: Any, marker: str) -> Any | None:
    for comment in issue.get_comments():
        if marker in (comment.body or ""):
            return comment
    return None


def _send_issue_create(repo: Any, row: GitHubOutbox, proposal: Proposal) -> dict[str, Any]:
    issue = None
    if row.attempts > 0:  # an earlier answer may have been lost: look before creating
        for candidate in repo.get_issues(state="all", sort="created", direction="desc")[:100]:
            if proposal_marker(proposal.pk) in (candidate.body or ""):
                issue = candidate
                break
    if issue is None:
        issue = repo.create_issue(
            title=proposal.title,
            body=body_with_block("", render_block(proposal)),
            labels=["experiment", *sorted(wanted_labels(proposal))],
        )
    Proposal.objects.filter(pk=proposal.pk).update(
        github_issue_number=issue.number, github_issue_node_id=issue.node_id or ""
    )
    return {"number": issue.number}


def _send_body_sync(repo: Any, proposal: Proposal) -> dict[str, Any]:
    issue = repo.get_issue(proposal.github_issue_number)
    current = issue.body or ""
    wanted = body_with_block(current, render_block(proposal))
    if wanted != current:
        issue.edit(body=wanted)
    return {"changed": wanted != current}


def _send_status_sync(repo: Any, proposal: Proposal) -> dict[str, Any]:
    issue = repo.get_issue(proposal.github_issue_number)
    body = render_status(proposal)
    comment = None
    if proposal.github_status_comment_id:
        try:
            comment = issue.get_comment(proposal.github_status_comment_id)
        except GithubException as exc:
            if exc.status != 404:
                raise
    if comment is None:
        comment = _find_comment(issue, STATUS_MARKER)
    if comment is None:
        comment = issue.create_comment(body)
    elif comment.body != body:
        comment.edit(body)
    Proposal.objects.filter(pk=proposal.pk).update(github_status_comment_id=comment.id)
    return {"comment_id": comment.id}


def _send_labels_sync(repo: Any, proposal: Proposal) -> dict[str, Any]:
    issue = repo.get_issue(proposal.github_issue_number)
    current = {label.name for label in issue.labels}
    wanted = wanted_labels(proposal)
    managed = {name for name in current if name.startswith(STATE_LABEL_PREFIX)} | (
        {HOLD_LABEL} & current
    )
    for name in sorted(managed - wanted):
        issue.remove_from_labels(name)
    missing = sorted(wanted - current)
    if missing:
        issue.add_to_labels(*missing)
    return {"labels": sorted((current - managed) | wanted)}


def _send_comment(repo: Any, row: GitHubOutbox, proposal: Proposal) -> dict[str, Any]:
    issue = repo.get_issue(proposal.github_issue_number)
    marker = outbox_marker(row.idempotency_key)
    comment = _find_comment(issue, marker) if row.attempts > 0 else None
    if comment is None:
        comment = issue.create_comment(f"{row.payload['body']}\n{marker}")
    comment_id = row.payload.get("comment_id")
    if comment_id:
        Comment.objects.filter(pk=comment_id).update(github_comment_id=comment.id)
    return {"comment_id": comment.id}


def outbox_send(*, repo: Any, row: GitHubOutbox) -> dict[str, Any]:
    """Send one row; raises Retry or Permanent."""
    proposal = Proposal.objects.select_related("plan").get(pk=row.proposal_id)
    try:
        if row.operation == OutboxOperation.ISSUE_CREATE:
            if proposal.github_issue_number is not None:
                return {"number": proposal.github_issue_number, "already": True}
            return _send_issue_create(repo, row, proposal)
        if proposal.github_issue_number is None:
            raise Retry("waiting for the issue to be created")
        if row.operation == OutboxOperation.BODY_SYNC:
            return _send_body_sync(repo, proposal)
        if row.operation == OutboxOperation.STATUS_SYNC:
            return _send_status_sync(repo, proposal)
        if row.operation == OutboxOperation.LABELS_SYNC:
            return _send_labels_sync(repo, proposal)
        if row.operation == OutboxOperation.COMMENT_CREATE:
            return _send_comment(repo, row, proposal)
    except (Retry, Permanent):
        raise
    except Exception as exc:
        raise classify(exc) from exc
    raise Permanent(f"unknown operation {row.operation}")


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
