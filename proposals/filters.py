"""Filters of the proposal list, shared by the web page and the API (django-filter)."""

from __future__ import annotations

import django_filters
from django.db.models import Q, QuerySet

from proposals.models import Outcome, Proposal, State


class ProposalFilter(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=State.choices)
    outcome = django_filters.MultipleChoiceFilter(choices=Outcome.choices)
    label = django_filters.CharFilter(method="filter_label", label="Label")
    recipe = django_filters.CharFilter(field_name="recipe__name", label="Recipe")
    author = django_filters.CharFilter(field_name="author__username", label="Author")
    q = django_filters.CharFilter(method="filter_text", label="Text")

    class Meta:
        model = Proposal
        fields = ["state", "outcome", "label", "recipe", "author", "q"]

    def filter_label(
        self, queryset: QuerySet[Proposal], name: str, value: str
    ) -> QuerySet[Proposal]:
        return queryset.filter(labels__name=value.strip().lower())

    def filter_text(
        self, queryset: QuerySet[Proposal], name: str, value: str
    ) -> QuerySet[Proposal]:
        value = value.strip()[:200]
        return queryset.filter(
            Q(title__icontains=value) | Q(summary__icontains=value) | Q(hypothesis__icontains=value)
        )
