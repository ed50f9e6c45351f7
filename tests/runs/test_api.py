"""The recipe API and the plan preview: who may do what, and the shapes they answer with."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from runs.models import Plan, Recipe
from runs.recipes.demo import MARIN_MOE, TINY_MOE
from runs.specs.ablation import config_hash
from tests.factories import WALKTHROUGH_SPEC, RecipeFactory

pytestmark = pytest.mark.django_db

RECIPES = "/api/v1/recipes/"
PREVIEW = "/api/v1/plans/preview/"


def marin_data(**changes: Any) -> dict[str, Any]:
    return {**copy.deepcopy(MARIN_MOE), **changes}


def preview(api: APIClient, recipe: Any, **body: Any) -> Any:
    return api.post(PREVIEW, {"recipe": recipe.pk, **body}, format="json")


# Reading recipes


def test_recipe_list_is_public(api: APIClient, recipe: Any) -> None:
    response = api.get(RECIPES)

    assert response.status_code == 200
    body = response.json()
    assert body["count"] == 1
    (item,) = body["results"]
    assert (item["name"], item["version"]) == ("tiny-moe", "1")
    assert item["parameter_schema"] == TINY_MOE["parameter_schema"]
    assert item["url"].endswith(f"{RECIPES}{recipe.pk}/")


def test_recipe_list_is_paginated(api: APIClient) -> None:
    for n in range(27):
        RecipeFactory(name=f"recipe-{n:02d}")

    first = api.get(RECIPES).json()
    second = api.get(first["next"]).json()

    assert first["count"] == 27
    assert len(first["results"]) == 25
    assert first["previous"] is None
    assert len(second["results"]) == 2
    assert second["next"] is None
    names = [r["name"] for r in first["results"] + second["results"]]
    assert names == sorted(names)
    assert len(set(names)) == 27


def test_recipe_list_filters_by_name(api: APIClient) -> None:
    RecipeFactory(name="tiny-moe")
    RecipeFactory(name="marin-moe")

    body = api.get(RECIPES, {"name": "marin-moe"}).json()

    assert [r["name"] for r in body["results"]] == ["marin-moe"]


def test_recipe_list_includes_inactive_recipes(api: APIClient) -> None:
    RecipeFactory(name="old-moe", is_active=False)

    body = api.get(RECIPES).json()

    assert [(r["name"], r["is_active"]) for r in body["results"]] == [("old-moe", False)]


def test_recipe_list_query_count_does_not_grow_with_more_recipes(
    api: APIClient, django_assert_num_queries: Any
) -> None:
    for n in range(2):
        RecipeFactory(name=f"recipe-{n}", version=str(n))
    with CaptureQueriesContext(connection) as two_recipes:
        assert len(api.get(RECIPES).json()["results"]) == 2

    for n in range(2, 6):
        RecipeFactory(name=f"recipe-{n}", version=str(n))
    with django_assert_num_queries(len(two_recipes.captured_queries)):
        assert len(api.get(RECIPES).json()["results"]) == 6

    assert len(two_recipes.captured_queries) == 2  # the page's count, then the page


def test_recipe_detail_is_public(api: APIClient, recipe: Any) -> None:
    response = api.get(f"{RECIPES}{recipe.pk}/")

    assert response.status_code == 200
    assert response.json()["compute_model"] == TINY_MOE["compute_model"]


# Registering and editing recipes


def test_maintainer_registers_a_recipe(api_as: Any, maintainer: Any) -> None:
    response = api_as(maintainer).post(RECIPES, marin_data(), format="json")

    assert response.status_code == 201, response.json()
    recipe = Recipe.objects.get(name="marin-moe", version="1")
    assert response.json()["id"] == recipe.pk
    assert recipe.created_by == maintainer
    assert recipe.scales == MARIN_MOE["scales"]
    assert recipe.executor == "ray"
    assert response.json()["executor"] == "ray"


def test_recipe_with_an_unknown_executor_is_refused(api_as: Any, maintainer: Any) -> None:
    data = marin_data() | {"executor": "kubernetes"}

    response = api_as(maintainer).post(RECIPES, data, format="json")

    assert response.status_code == 400
    assert list(response.json()) == ["executor"]
    assert "'kubernetes' is no executor" in response.json()["executor"][0]
    assert not Recipe.objects.exists()


def test_recipe_for_a_pool_that_does_not_exist_is_refused(api_as: Any, maintainer: Any) -> None:
    data = marin_data() | {"executor": "pool:nowhere"}

    response = api_as(maintainer).post(RECIPES, data, format="json")

    assert response.status_code == 400
    assert response.json() == {"executor": ["there is no pool named 'nowhere'"]}
    assert not Recipe.objects.exists()


def test_contributor_cannot_register_a_recipe(api_as: Any, contributor: Any) -> None:
    response = api_as(contributor).post(RECIPES, marin_data(), format="json")

    assert response.status_code == 403
    assert not Recipe.objects.exists()


def test_reviewer_cannot_register_a_recipe(api_as: Any, reviewer: Any) -> None:
    response = api_as(reviewer).post(RECIPES, marin_data(), format="json")

    assert response.status_code == 403
    assert not Recipe.objects.exists()


def test_anonymous_visitor_cannot_register_a_recipe(api: APIClient) -> None:
    response = api.post(RECIPES, marin_data(), format="json")

    assert response.status_code == 401
    assert not Recipe.objects.exists()


def test_invalid_recipe_is_refused_naming_the_field(api_as: Any, maintainer: Any) -> None:
    data = marin_data()
    data["default_config"]["top_k"] = 32

    response = api_as(maintainer).post(RECIPES, data, format="json")

    assert response.status_code == 400
    assert response.json() == {"default_config": ["'top_k': 32 is greater than the maximum of 16"]}
    assert not Recipe.objects.exists()


def test_recipe_with_an_unknown_formula_name_is_refused(api_as: Any, maintainer: Any) -> None:
    data = marin_data()
    data["compute_model"]["tokens"] = "tokens_billions * 1e9"

    response = api_as(maintainer).post(RECIPES, data, format="json")

    assert response.status_code == 400
    assert "unknown name 'tokens_billions'" in response.json()["compute_model"][0]


def test_recipe_without_required_fields_is_refused(api_as: Any, maintainer: Any) -> None:
    response = api_as(maintainer).post(RECIPES, {"name": "bare"}, format="json")

    assert response.status_code == 400
    assert {"title", "command_template"} <= set(response.json())


def test_second_recipe_of_the_same_name_and_version_is_refused(
    api_as: Any, maintainer: Any
) -> None:
    client = api_as(maintainer)
    assert client.post(RECIPES, marin_data(), format="json").status_code == 201

    response = client.post(RECIPES, marin_data(), format="json")

    assert response.status_code == 400
    assert Recipe.objects.count() == 1
    assert client.post(RECIPES, marin_data(version="2"), format="json").status_code == 201


def test_maintainer_edits_a_recipe(api_as: Any, maintainer: Any, recipe: Any) -> None:
    response = api_as(maintainer).patch(
        f"{RECIPES}{recipe.pk}/", {"title": "Tiny MoE (CPU), revised"}, format="json"
    )

    assert response.status_code == 200
    recipe.refresh_from_db()
    assert recipe.title == "Tiny MoE (CPU), revised"
    event = recipe.events.get()
    assert (event.verb, event.door, event.actor, event.message) == (
        "edited",
        "api",
        maintainer,
        "Changed title",
    )


def test_maintainer_edit_that_breaks_the_recipe_is_refused(
    api_as: Any, maintainer: Any, recipe: Any
) -> None:
    model = {**TINY_MOE["compute_model"], "assumed_mfu": 4}

    response = api_as(maintainer).patch(
        f"{RECIPES}{recipe.pk}/", {"compute_model": model}, format="json"
    )

    assert response.status_code == 400
    assert response.json() == {
        "compute_model": ["'assumed_mfu' is a fraction of peak and must be at most 1"]
    }
    recipe.refresh_from_db()
    assert recipe.compute_model["assumed_mfu"] == 0.2


def test_contributor_cannot_edit_a_recipe(api_as: Any, contributor: Any, recipe: Any) -> None:
    response = api_as(contributor).patch(
        f"{RECIPES}{recipe.pk}/", {"title": "Mine now"}, format="json"
    )

    assert response.status_code == 403
    recipe.refresh_from_db()
    assert recipe.title == TINY_MOE["title"]


# Plan preview


def test_preview_returns_runs_hashes_diffs_and_totals(api: APIClient, recipe: Any) -> None:
    response = preview(api, recipe, ablation_spec=WALKTHROUGH_SPEC, budget_accelerator_hours=10)

    assert response.status_code == 200
    body = response.json()
    assert body["run_count"] == 4
    assert body["frozen"] is False
    assert body["recipe"] == {"name": "tiny-moe", "version": "1"}
    assert body["axes"] == ["capacity_factor", "weight_decay"]
    runs = body["runs"]
    assert len(runs) == 4
    for run in runs:
        assert run["config_hash"] == config_hash(run["config"])
    assert body["total_flops"] == pytest.approx(sum(run["flops"] for run in runs))
    assert body["total_accelerator_hours"] == pytest.approx(
        sum(run["accelerator_hours"] for run in runs)
    )
    assert [run["is_baseline"] for run in runs] == [True, False, False, False]
    assert runs[0]["diff"] == {}
    assert runs[1]["diff"] == {"weight_decay": {"baseline": 0.0, "value": 0.1}}
    assert body["over_budget"] is False
    assert not Plan.objects.exists()


def test_preview_applies_the_baseline(api: APIClient, recipe: Any) -> None:
    response = preview(api, recipe, baseline={"data_mix": {"docs": 0.5}}, ablation_spec="")

    assert response.status_code == 200
    (run,) = response.json()["runs"]
    assert run["config"]["data_mix"] == {"code": 0.7, "docs": 0.5}
    assert run["is_baseline"] is True


def test_preview_over_budget_says_so(api: APIClient, recipe: Any) -> None:
    response = preview(
        api, recipe, ablation_spec=WALKTHROUGH_SPEC, budget_accelerator_hours=0.000001
    )

    assert response.status_code == 200
    assert response.json()["over_budget"] is True


def test_preview_with_a_bad_spec_names_the_ablation_spec(api: APIClient, recipe: Any) -> None:
    response = preview(api, recipe, ablation_spec="axes:\n  capacity_factr: [1.5]\n")

    assert response.status_code == 400
    (message,) = response.json()["ablation_spec"]
    assert "unknown parameter 'capacity_factr'" in message
    assert "did you mean 'capacity_factor'?" in message


def test_preview_with_an_alias_in_the_spec_is_refused(api: APIClient, recipe: Any) -> None:
    response = preview(api, recipe, ablation_spec="axes:\n  top_k: &k [1, 2]\n")

    assert response.status_code == 400
    assert "anchors and aliases" in response.json()["ablation_spec"][0]


def test_preview_with_a_non_finite_value_is_refused(api: APIClient, recipe: Any) -> None:
    response = preview(api, recipe, ablation_spec="axes:\n  learning_rate: [.nan]\n")

    assert response.status_code == 400
    assert "NaN and infinity are not allowed" in response.json()["ablation_spec"][0]


def test_preview_with_a_deeply_nested_spec_is_refused(api: APIClient, recipe: Any) -> None:
    response = preview(api, recipe, ablation_spec="axes: " + "[" * 20_000 + "]" * 20_000)

    assert response.status_code == 400
    assert "nested deeper than 32 levels" in response.json()["ablation_spec"][0]


def test_preview_with_a_bad_baseline_names_the_baseline(api: APIClient, recipe: Any) -> None:
    response = preview(api, recipe, baseline={"top_k": "two"})

    assert response.status_code == 400
    assert response.json() == {
        "baseline": ["baseline: parameter 'top_k': 'two' is not of type 'integer'"]
    }


def test_preview_of_an_unknown_recipe_is_refused(api: APIClient, recipe: Any) -> None:
    response = api.post(PREVIEW, {"recipe": recipe.pk + 1000}, format="json")

    assert response.status_code == 400
    assert "recipe" in response.json()


def test_preview_with_a_negative_budget_is_refused(api: APIClient, recipe: Any) -> None:
    response = preview(api, recipe, budget_accelerator_hours=-1)

    assert response.status_code == 400
    assert "budget_accelerator_hours" in response.json()


def test_preview_with_malformed_json_is_refused(api: APIClient, recipe: Any) -> None:
    response = api.post(
        PREVIEW, data=f'{{"recipe": {recipe.pk}, "ablation_spec": ', content_type="application/json"
    )

    assert response.status_code == 400
    assert "JSON parse error" in response.json()["detail"]


def test_preview_body_over_the_configured_cap_is_refused(
    api: APIClient, recipe: Any, settings: Any
) -> None:
    settings.REQUEST_BODY_CAP = 2048
    padding = "#" * 4096
    body = json.dumps({"recipe": recipe.pk, "ablation_spec": padding})

    response = api.post(PREVIEW, data=body, content_type="application/json")

    assert response.status_code == 413
    assert response.json() == {
        "detail": f"Request body is {len(body)} bytes; the limit is 2048 bytes."
    }


def test_preview_body_under_the_configured_cap_is_accepted(
    api: APIClient, recipe: Any, settings: Any
) -> None:
    settings.REQUEST_BODY_CAP = 2048
    body = json.dumps({"recipe": recipe.pk, "ablation_spec": "# short\n"})

    response = api.post(PREVIEW, data=body, content_type="application/json")

    assert response.status_code == 200


def test_preview_body_over_the_default_cap_of_1_mib_is_refused(api: APIClient, recipe: Any) -> None:
    body = json.dumps({"recipe": recipe.pk, "ablation_spec": "#" * (1024 * 1024)})

    response = api.post(PREVIEW, data=body, content_type="application/json")

    assert response.status_code == 413
    assert "the limit is 1048576 bytes" in response.json()["detail"]


def test_preview_spec_over_64_kib_is_refused(api: APIClient, recipe: Any) -> None:
    response = preview(api, recipe, ablation_spec="#" * (64 * 1024 + 1))

    assert response.status_code == 400
    assert "the limit is 64 KiB" in response.json()["ablation_spec"][0]
