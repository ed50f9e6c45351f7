"""A recipe may require labels of the pool that runs it (``requires_labels``): a launch on a
pool lacking them is refused, naming the field, and only agents having them lease its runs."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError

from proposals.models import State
from runs.models import PlanLaunch, Recipe, Run, RunState
from runs.pools import leases
from runs.services import plans as plan_services
from runs.services import recipes as recipe_services
from tests.factories import ProposalFactory, RecipeFactory
from tests.runs.pools.pool_helpers import ONE_RUN, make_agent, make_pool, offered_plan

pytestmark = pytest.mark.django_db

A5000 = ["gpu:a5000"]


@pytest.fixture
def owner() -> User:
    return User.objects.create_user("olga")


@pytest.fixture
def gpu_recipe(recipe: Recipe) -> Recipe:
    recipe.requires_labels = A5000
    recipe.save(update_fields=["requires_labels"])
    return recipe


def test_a_launch_on_a_pool_lacking_the_labels_is_refused_naming_the_field(
    gpu_recipe: Recipe, owner: User
) -> None:
    pool = make_pool(owner, "cpu", labels=["cpu:x86"])
    plan = plan_services.plan_freeze(
        recipe=gpu_recipe, baseline={}, spec_text=ONE_RUN, budget_accelerator_hours=None
    )
    with pytest.raises(ValidationError) as refused:
        plan_services.plan_launch(plan_id=plan.pk, executor=pool.executor)

    message = refused.value.message_dict["executor"][0]
    assert "pool 'cpu' lacks the label gpu:a5000" in message
    assert "requires_labels" in message
    assert not PlanLaunch.objects.filter(plan=plan).exists()


def test_a_launch_on_a_pool_with_the_labels_keeps_them_on_the_launch(
    gpu_recipe: Recipe, owner: User
) -> None:
    pool = make_pool(owner, "gpu", labels=["gpu:a5000", "cuda:12"])
    plan = plan_services.plan_freeze(
        recipe=gpu_recipe, baseline={}, spec_text=ONE_RUN, budget_accelerator_hours=None
    )
    launch = plan_services.plan_launch(plan_id=plan.pk, executor=pool.executor)
    assert launch.requires_labels == A5000


def test_a_launch_off_any_pool_is_refused(gpu_recipe: Recipe) -> None:
    plan = plan_services.plan_freeze(
        recipe=gpu_recipe, baseline={}, spec_text=ONE_RUN, budget_accelerator_hours=None
    )
    with pytest.raises(ValidationError) as refused:
        plan_services.plan_launch(plan_id=plan.pk, executor="local")
    assert "requires_labels" in refused.value.message_dict["executor"][0]


def test_approving_a_proposal_whose_recipe_s_pool_lacks_the_labels_is_a_400(
    api_as: Any, gpu_recipe: Recipe, owner: User, maintainer: Any
) -> None:
    pool = make_pool(owner, "cpu", labels=[])
    Recipe.objects.filter(pk=gpu_recipe.pk).update(executor=pool.executor)  # labels came later
    proposal = ProposalFactory.create(recipe=gpu_recipe, state=State.SUBMITTED)

    response = api_as(maintainer).post(f"/api/v1/proposals/{proposal.pk}/approve/")

    assert response.status_code == 400, response.content
    assert "lacks the label gpu:a5000" in str(response.json()["executor"])
    proposal.refresh_from_db()
    assert proposal.state == State.SUBMITTED and proposal.plan_id is None


def test_a_recipe_naming_a_pool_lacking_its_labels_is_refused(owner: User) -> None:
    pool = make_pool(owner, "cpu", labels=[])
    data = {
        f: getattr(Recipe(), f)
        for f in recipe_services.RECIPE_FIELDS
        if f not in ("name", "version")
    }
    with pytest.raises(ValidationError) as refused:
        recipe_services.recipe_validate(
            data=data
            | {"name": "gpu-job", "executor": pool.executor, "requires_labels": ["gpu:a5000"]}
        )
    assert "lacks the label gpu:a5000" in refused.value.message_dict["executor"][0]


def test_only_an_agent_with_the_labels_leases_the_run(gpu_recipe: Recipe, owner: User) -> None:
    """A pool of mixed machines, without the label itself: the launch is accepted because one
    of its agents has it, and only that agent leases the run."""
    pool = make_pool(owner, "mixed", labels=[])
    plain, _ = make_agent(pool, "cpu-box")
    plain.labels = ["cpu:x86"]
    plain.save(update_fields=["labels"])
    gpu, _ = make_agent(pool, "gpu-box")  # registered with gpu:a5000
    plan = offered_plan(gpu_recipe, pool, ONE_RUN)
    plain.refresh_from_db()
    gpu.refresh_from_db()

    assert leases.lease_acquire(agent=plain) is None
    lease = leases.lease_acquire(agent=gpu)
    assert lease is not None and lease.run.plan_id == plan.pk
    assert Run.objects.get(plan=plan).state == RunState.RUNNING


def test_a_batch_gives_labelled_runs_only_to_labelled_agents(
    gpu_recipe: Recipe, owner: User
) -> None:
    """One hand-out for agents with different labels: each gets a run it may run."""
    pool = make_pool(owner, "mixed", labels=[])
    plain, _ = make_agent(pool, "cpu-box")
    plain.labels = []
    plain.save(update_fields=["labels"])
    gpu, _ = make_agent(pool, "gpu-box")
    gpu_plan = offered_plan(gpu_recipe, pool, ONE_RUN)
    any_plan = offered_plan(RecipeFactory.create(name="any-job"), pool, ONE_RUN)

    got = leases.leases_grant(pool=pool, agents=[plain, gpu])

    assert got[plain.pk].run.plan_id == any_plan.pk
    assert got[gpu.pk].run.plan_id == gpu_plan.pk
