"""Reads for recipes and plans."""

from __future__ import annotations

from django.db.models import Count, QuerySet

from runs.models import Plan, PlanEntry, Recipe


def recipe_list(*, include_inactive: bool = False) -> QuerySet[Recipe]:
    recipes = Recipe.objects.annotate(plan_count=Count("plans"))
    return recipes if include_inactive else recipes.filter(is_active=True)


def plan_entries(*, plan: Plan) -> QuerySet[PlanEntry]:
    return plan.entries.order_by("index")
