"""A recipe's own list of the executors and pools its launches may choose
(``launch.executors``): checked when the recipe is saved, offered by the approval form,
enforced on every door (the form, the API, the service)."""

from __future__ import annotations

from typing import Any

import pytest

from proposals.models import Proposal, State
from runs.models import PlanLaunch, Recipe
from runs.recipes.demo import TINY_MOE
from tests.factories import ProposalFactory

pytestmark = pytest.mark.django_db


def allowing(recipe: Recipe, *names: str) -> Recipe:
    launch = {**(recipe.launch or {}), "executors": list(names)}
    Recipe.objects.filter(pk=recipe.pk).update(launch=launch)
    recipe.refresh_from_db()
    return recipe


def test_saving_a_recipe_refuses_an_unknown_executor_in_its_list(
    api_as: Any, maintainer: Any
) -> None:
    api = api_as(maintainer)
    body = {**TINY_MOE, "name": "fresh", "launch": {"executors": ["iris", "slurm"]}}
    refused = api.post("/api/v1/recipes/", body, format="json")
    assert refused.status_code == 400
    assert refused.json()["launch"] == [
        "executors: 'slurm' is no executor; use local, ray, iris or pool:<name>"
    ]
    body["launch"] = {"executors": "iris"}
    refused = api.post("/api/v1/recipes/", body, format="json")
    assert refused.status_code == 400
    assert "executors must be a list" in refused.json()["launch"][0]
    body.update(launch={"executors": ["iris"]}, executor="local")
    refused = api.post("/api/v1/recipes/", body, format="json")
    assert refused.status_code == 400
    assert refused.json()["launch"] == [
        "executors: the recipe's own executor 'local' is not in the list (iris)"
    ]
    body.update(launch={"executors": ["iris", "pool:lab", "local"]}, executor="local")
    made = api.post("/api/v1/recipes/", body, format="json")
    assert made.status_code == 201, made.json()
    assert Recipe.objects.get(name="fresh").launch["executors"] == ["iris", "pool:lab", "local"]


def test_the_approval_form_offers_only_the_recipe_s_executors_and_refuses_others(
    client: Any, recipe: Recipe, maintainer: Any
) -> None:
    allowing(recipe, "ray", "local")
    proposal = ProposalFactory.create(recipe=recipe, state=State.SUBMITTED)
    client.force_login(maintainer)
    page = client.get(proposal.get_absolute_url()).content.decode()
    assert '<select id="executor" name="executor">' in page
    assert '<option value="ray">ray</option>' in page
    assert '<option value="local">local</option>' in page
    assert '<option value="iris">' not in page
    url = f"/proposals/{proposal.pk}/transition/approve/"
    refused = client.post(url, {"executor": "iris"})
    assert refused.status_code == 400
    assert (
        b"recipe &#x27;tiny-moe&#x27; may run only on ray, local (its launch.executors), "
        b"not on &#x27;iris&#x27;"
    ) in refused.content
    assert Proposal.objects.get(pk=proposal.pk).state == State.SUBMITTED
    assert client.post(url, {"executor": "local"}).status_code == 302
    assert PlanLaunch.objects.get(plan__proposal=proposal).executor == "local"


def test_a_recipe_without_a_list_keeps_the_free_choice(
    client: Any, recipe: Recipe, maintainer: Any
) -> None:
    proposal = ProposalFactory.create(recipe=recipe, state=State.SUBMITTED)
    client.force_login(maintainer)
    page = client.get(proposal.get_absolute_url()).content.decode()
    assert '<input type="text" id="executor" name="executor"' in page
    url = f"/proposals/{proposal.pk}/transition/approve/"
    assert client.post(url, {"executor": "iris"}).status_code == 302
    assert PlanLaunch.objects.get(plan__proposal=proposal).executor == "iris"


def test_the_api_refuses_an_executor_the_recipe_does_not_allow_naming_those_it_does(
    api_as: Any, recipe: Recipe, maintainer: Any, settings: Any
) -> None:
    allowing(recipe, "iris", "ray")
    settings.RUNS_DEFAULT_EXECUTOR = "local"
    api = api_as(maintainer)
    first = ProposalFactory.create(recipe=recipe, state=State.SUBMITTED)
    refused = api.post(f"/api/v1/proposals/{first.pk}/approve/", {"executor": "local"})
    assert refused.status_code == 400
    assert refused.json()["executor"] == [
        "recipe 'tiny-moe' may run only on iris, ray (its launch.executors), not on 'local'"
    ]
    assert Proposal.objects.get(pk=first.pk).state == State.SUBMITTED
    approved = api.post(f"/api/v1/proposals/{first.pk}/approve/", {"executor": "ray"})
    assert approved.status_code == 200, approved.json()
    assert PlanLaunch.objects.get(plan__proposal=first).executor == "ray"
    # Blank: the site's default is not on the list, so the list's first stands for it.
    second = ProposalFactory.create(recipe=recipe, state=State.SUBMITTED)
    assert api.post(f"/api/v1/proposals/{second.pk}/approve/").status_code == 200
    assert PlanLaunch.objects.get(plan__proposal=second).executor == "iris"
