"""Sending one outbox row to GitHub, and sorting its failures into Retry and Permanent.

Creates carry a marker; a create whose answer was lost is found by its marker before it is
tried again. ``classify`` reads GitHub's ``Retry-After`` / ``x-ratelimit-reset``, and
``backoff`` turns that (or the attempt count) into the delay before the next try.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

import requests
from django.conf import settings
from github import GithubException

from proposals.github.body import body_with_block
from proposals.github.outbox.render import (
    HOLD_LABEL,
    STATE_LABEL_PREFIX,
    STATUS_MARKER,
    outbox_marker,
    proposal_marker,
    render_block,
    render_status,
    site_labels,
    wanted_labels,
)
from proposals.models import Comment, GitHubOutbox, OutboxOperation, OutboxState, Proposal


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
    # The site removes only what it manages: state labels, the hold, and the site's labels
    # it wrote before (the last sync's) that the proposal no longer has. A label people put
    # on the issue reaches the site by its webhook, never removed here first.
    before = (
        GitHubOutbox.objects.filter(
            proposal=proposal, operation=OutboxOperation.LABELS_SYNC, state=OutboxState.DONE
        )
        .order_by("-id")
        .values_list("result", flat=True)
        .first()
    )
    synced = set((before or {}).get("site_labels") or [])
    managed = {name for name in current if name.startswith(STATE_LABEL_PREFIX)} | (
        ({HOLD_LABEL} | synced) & current
    )
    for name in sorted(managed - wanted):
        issue.remove_from_labels(name)
    missing = sorted(wanted - current)
    if missing:
        issue.add_to_labels(*missing)
    return {
        "labels": sorted((current - managed) | wanted),
        "site_labels": sorted(site_labels(proposal)),
    }


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
