"""Reads for the GitHub sync: the outbox rows a maintainer should see."""

from __future__ import annotations

from django.db.models import QuerySet

from proposals.models import GitHubOutbox, OutboxState


def outbox_attention() -> QuerySet[GitHubOutbox]:
    """Failed rows, and pending rows that have been retried, newest first."""
    return (
        GitHubOutbox.objects.select_related("proposal")
        .filter(state__in=[OutboxState.FAILED, OutboxState.PENDING])
        .exclude(state=OutboxState.PENDING, attempts=0)
        .order_by("-id")
    )
