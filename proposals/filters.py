"""Filters of the proposal list, shared by the web page and the API (django-filter).

``q`` is a query in the search language of ``/search/`` (``proposals/query_language.py``):
``state:approved label:moe weight_decay>0.05 router``, plain words matching the text as the
search page matches them. A query that cannot be read is a form error naming the column.
"""

from __future__ import annotations

from typing import Any

import django_filters
from django import forms
from django.db.models import QuerySet

from proposals import query_language
from proposals.models import Outcome, Proposal, State
from proposals.search import proposal_search


class QueryField(forms.CharField):
    """A search query: cleans to a parsed query (None when empty)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", query_language.MAX_QUERY_LENGTH)
        super().__init__(**kwargs)

    def clean(self, value: Any) -> query_language.ParsedQuery | None:
        text = super().clean(value)
        if not text or not text.strip():
            return None
        try:
            return query_language.parse_query(text)
        except query_language.QuerySyntaxError as exc:
            raise forms.ValidationError(str(exc), code="query") from exc


class QueryFilter(django_filters.Filter):
    field_class = QueryField


class ProposalFilter(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=State.choices)
    outcome = django_filters.MultipleChoiceFilter(choices=Outcome.choices)
    label = django_filters.CharFilter(method="filter_label", label="Label")
    recipe = django_filters.CharFilter(field_name="recipe__name", label="Recipe")
    author = django_filters.CharFilter(field_name="author__username", label="Author")
    q = QueryFilter(method="filter_query", label="Search")

    class Meta:
        model = Proposal
        fields = ["state", "outcome", "label", "recipe", "author", "q"]

    def filter_label(
        self, queryset: QuerySet[Proposal], name: str, value: str
    ) -> QuerySet[Proposal]:
        return queryset.filter(labels__name=value.strip().lower())

    def filter_query(
        self, queryset: QuerySet[Proposal], name: str, value: query_language.ParsedQuery | None
    ) -> QuerySet[Proposal]:
        """The proposals matching the query as ``/search/`` matches them, in the list's order."""
        if value is None:
            return queryset
        ordering = list(queryset.query.order_by or ["-created_at", "-id"])
        return proposal_search(query=value, queryset=queryset).matched.order_by(*ordering)
