"""Reads for proposals: querysets that load what a page needs in a fixed number of queries."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import (
    Avg,
    Count,
    FloatField,
    IntegerField,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
    Value,
)
from django.db.models.functions import Coalesce

from proposals.models import Comment, Event, Proposal, Review, State


def _per_proposal(aggregate: Any, output_field: Any) -> Subquery:
    """An aggregate over one proposal's reviews, as a correlated subquery.

    A JOIN with GROUP BY would make the database group every proposal before it sorts and
    takes one page; the subquery runs for the rows of the page only.
    """
    reviews = (
        Review.objects.filter(proposal=OuterRef("pk"))
        .order_by()
        .values("proposal")
        .annotate(value=aggregate)
        .values("value")
    )
    return Subquery(reviews, output_field=output_field)


RECIPE_HEAVY = tuple(
    f"recipe__{name}"
    for name in (
        "description",
        "command_template",
        "default_config",
        "parameter_schema",
        "compute_model",
        "scales",
    )
)
PROPOSAL_HEAVY = (
    "description",
    "hypothesis",
    "baseline",
    "ablation_spec",
    "state_reason",
    "approved_hypothesis",
    "approved_criteria",
    "conclusion",
    "results",
    "github_sections",
)


def proposal_list() -> QuerySet[Proposal]:
    """Every proposal (all are public), with what the list page and the API show.

    A list row never needs its recipe's config and schema (JSON decoded per row otherwise)
    nor the search vector."""
    return (
        Proposal.objects.select_related("author", "recipe")
        .defer("search_vector", *RECIPE_HEAVY)
        .prefetch_related("labels")
        .annotate(
            review_count=Coalesce(
                _per_proposal(Count("pk"), IntegerField()), Value(0), output_field=IntegerField()
            ),
            average_score=_per_proposal(Avg("score"), FloatField()),
        )
        .order_by("-created_at", "-id")
    )


def proposal_rows() -> QuerySet[Proposal]:
    """The list page's rows: ``proposal_list`` without the long texts a row never shows."""
    return proposal_list().defer(*PROPOSAL_HEAVY)


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
