"""Factories for test data (factory_boy)."""

from __future__ import annotations

import copy
from typing import Any

import factory
from django.contrib.auth.models import Group, User

from proposals.models import Comment, Proposal, Review, State
from runs.models import Recipe
from runs.recipes.demo import TINY_MOE

WALKTHROUGH_SPEC = """axes:
  capacity_factor: [1.0, 1.25]
  weight_decay: [0.0, 0.1]
scales: [small]
seeds: [0]
"""


class UserFactory(factory.django.DjangoModelFactory[User]):
    class Meta:
        model = User
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.org")
    password = factory.django.Password("correct-horse-battery")

    @factory.post_generation
    def roles(obj: Any, create: bool, extracted: list[str] | None, **kwargs: object) -> None:  # noqa: N805
        for role in extracted or []:
            obj.groups.add(Group.objects.get_or_create(name=role)[0])


class RecipeFactory(factory.django.DjangoModelFactory[Recipe]):
    class Meta:
        model = Recipe
        django_get_or_create = ("name", "version")

    name = TINY_MOE["name"]
    version = TINY_MOE["version"]
    title = TINY_MOE["title"]
    description = TINY_MOE["description"]
    command_template = TINY_MOE["command_template"]
    default_config = factory.LazyFunction(lambda: copy.deepcopy(TINY_MOE["default_config"]))
    parameter_schema = factory.LazyFunction(lambda: copy.deepcopy(TINY_MOE["parameter_schema"]))
    compute_model = factory.LazyFunction(lambda: copy.deepcopy(TINY_MOE["compute_model"]))
    metrics = factory.LazyFunction(lambda: copy.deepcopy(TINY_MOE["metrics"]))
    scales = factory.LazyFunction(lambda: copy.deepcopy(TINY_MOE["scales"]))


class ProposalFactory(factory.django.DjangoModelFactory[Proposal]):
    class Meta:
        model = Proposal

    title = factory.Sequence(lambda n: f"Capacity factor ablation {n}")
    summary = "Does a higher capacity factor lower the drop fraction?"
    description = "We vary the **capacity factor** of the router."
    hypothesis = "A higher capacity factor lowers the drop fraction without hurting eval loss."
    success_metric = "eval/loss"
    success_direction = "lower"
    success_threshold = 0.01
    recipe = factory.SubFactory(RecipeFactory)
    baseline = factory.LazyFunction(dict)
    ablation_spec = WALKTHROUGH_SPEC
    budget_accelerator_hours = 10.0
    author = factory.SubFactory(UserFactory)
    state = State.DRAFT


class ReviewFactory(factory.django.DjangoModelFactory[Review]):
    class Meta:
        model = Review

    proposal = factory.SubFactory(ProposalFactory, state=State.SUBMITTED)
    reviewer = factory.SubFactory(UserFactory, roles=["reviewer"])
    score = 4
    recommendation = Review.Recommendation.APPROVE
    text = "Looks sound."


class CommentFactory(factory.django.DjangoModelFactory[Comment]):
    class Meta:
        model = Comment

    proposal = factory.SubFactory(ProposalFactory)
    author = factory.SubFactory(UserFactory)
    body = "Have you tried top-2 routing?"
