"""Reads for proposals: querysets that load what a page needs in a fixed number of queries."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Avg, Count, Prefetch, Q, QuerySet

from proposals.models import Comment, Event, Proposal, Review, State


def proposal_list() -> QuerySet[Proposal]:
    """Every proposal (all are public), with what the list page and the API show."""
    return (
        Proposal.objects.select_related("author", "recipe")
        .prefetch_related("labels")
        .annotate(
            review_count=Count("reviews", distinct=True),
            average_score=Avg("reviews__score"),
        )
        .order_by("-created_at", "-id")
    )


def proposal_detail(*, pk: int) -> Proposal:
    """One proposal with its reviews, comments, amendments and timeline, prefetched."""
    return (
        Proposal.objects.select_related("author", "recipe", "plan")
        .prefetch_related(
            "labels",
            "amendments__author",
            Prefetch("reviews", queryset=Review.objects.select_related("reviewer")),
            Prefetch("comments", queryset=Comment.objects.select_related("author")),
            Prefetch("events", queryset=Event.objects.select_related("actor")),
        )
        .get(pk=pk)
    )


def review_queue(*, reviewer: Any) -> QuerySet[Proposal]:
    """Submitted proposals waiting for review, never the reviewer's own, oldest first."""
    return (
        proposal_list()
        .filter(state=State.SUBMITTED)
        .exclude(author=reviewer)
        .annotate(reviewed_by_me=Count("reviews", filter=Q(reviews__reviewer=reviewer)))
        .order_by("reviewed_by_me", "submitted_at", "id")
    )


def author_choices() -> QuerySet[Any]:
    user_model = get_user_model()
    return user_model.objects.filter(proposals__isnull=False).distinct().order_by("username")
