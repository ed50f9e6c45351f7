"""Recipe and plan services: what a recipe must satisfy, and plans that stay frozen."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from django.core.exceptions import ValidationError

from marin_site.doors import Door
from runs.models import Plan, PlanEntry, Recipe
from runs.recipes.demo import MARIN_MOE, TINY_MOE
from runs.services import plans as plan_services
from runs.services import recipes as recipe_services
from runs.specs.ablation import config_hash
from runs.specs.compute import run_cost
from tests.factories import WALKTHROUGH_SPEC


def recipe_data(source: dict[str, Any] = TINY_MOE, **changes: Any) -> dict[str, Any]:
    return {**copy.deepcopy(source), **changes}


def refusal(data: dict[str, Any]) -> dict[str, list[str]]:
    with pytest.raises(ValidationError) as caught:
        recipe_services.recipe_validate(data=data)
    return caught.value.message_dict


# Validating a recipe


@pytest.mark.parametrize("source", [TINY_MOE, MARIN_MOE])
def test_demo_recipes_are_valid(source: dict[str, Any]) -> None:
    recipe_services.recipe_validate(data=recipe_data(source))


def test_recipe_with_an_invalid_json_schema_is_refused() -> None:
    schema = {"type": "objekt", "properties": {"lr": {"type": "number"}}}

    errors = refusal(recipe_data(parameter_schema=schema))

    assert list(errors) == ["parameter_schema"]
    assert errors["parameter_schema"][0].startswith("is not a valid JSON Schema: ")
    assert "objekt" in errors["parameter_schema"][0]


def test_recipe_schema_with_an_invalid_rule_for_a_parameter_is_refused() -> None:
    schema = {"type": "object", "properties": {"lr": {"minimum": "zero"}}}

    errors = refusal(recipe_data(parameter_schema=schema))

    assert (
        "is not a valid JSON Schema: 'zero' is not of type 'number'" in errors["parameter_schema"]
    )


def test_recipe_schema_without_properties_is_refused() -> None:
    errors = refusal(recipe_data(parameter_schema={"type": "object"}))

    assert errors == {
        "parameter_schema": ["must declare the overridable parameters under 'properties'"]
    }


@pytest.mark.parametrize("schema", [None, [], "object"])
def test_recipe_schema_that_is_not_an_object_is_refused(schema: Any) -> None:
    errors = refusal(recipe_data(parameter_schema=schema))

    assert errors == {"parameter_schema": ["must be a JSON object (a JSON Schema)"]}


def test_recipe_default_config_violating_its_own_schema_is_refused() -> None:
    data = recipe_data()
    data["default_config"]["weight_decay"] = -1
    data["default_config"]["width"] = 100

    errors = refusal(data)

    assert list(errors) == ["default_config"]
    assert sorted(errors["default_config"]) == [
        "'weight_decay': -1 is less than the minimum of 0",
        "'width': 100 is not one of [32, 64, 128, 256]",
    ]


def test_recipe_default_config_may_hold_keys_the_schema_does_not_declare() -> None:
    data = recipe_data()
    assert "depth" not in data["parameter_schema"]["properties"]

    recipe_services.recipe_validate(data=data)  # depth, batch_size, ... are fixed, not overridable


@pytest.mark.parametrize("default_config", [None, [], "lr: 1"])
def test_recipe_default_config_that_is_not_an_object_is_refused(default_config: Any) -> None:
    errors = refusal(recipe_data(default_config=default_config))

    assert errors == {"default_config": ["must be a JSON object"]}


def test_recipe_compute_formula_over_an_unknown_name_is_refused() -> None:
    data = recipe_data()
    data["compute_model"]["active_params"] = "depth * hidden_size ** 2"

    errors = refusal(data)

    assert errors == {"compute_model": ["unknown name 'hidden_size' (not a key of the config)"]}


def test_recipe_compute_formula_that_fails_only_at_one_scale_names_the_scale() -> None:
    data = recipe_data()
    data["scales"]["xl"] = {"width": "wide"}

    errors = refusal(data)

    assert errors == {"compute_model": ["'width' is 'wide', not a number at scale 'xl'"]}


def test_recipe_compute_formula_that_cannot_be_evaluated_is_refused() -> None:
    data = recipe_data()
    data["compute_model"]["tokens"] = "min()"

    errors = refusal(data)

    assert "min expected at least 1 argument" in errors["compute_model"][0]


def test_recipe_compute_model_problems_are_listed() -> None:
    data = recipe_data(compute_model={"active_params": 1e9, "assumed_mfu": 3})

    errors = refusal(data)

    assert errors == {
        "compute_model": [
            "'peak_flops_per_accelerator' is required",
            "'tokens' is required",
            "'assumed_mfu' is a fraction of peak and must be at most 1",
        ]
    }


@pytest.mark.parametrize(
    "scales", [{"Big Scale": {"width": 256}}, {"xl": 256}, ["small"], {"-xl": {}}]
)
def test_recipe_scales_must_map_slug_names_to_overrides(scales: Any) -> None:
    errors = refusal(recipe_data(scales=scales))

    assert errors == {
        "scales": ["must map scale names (lowercase, digits, '-') to config overrides"]
    }


def test_recipe_problems_in_several_fields_are_reported_together() -> None:
    errors = refusal(
        recipe_data(parameter_schema={"type": "object"}, default_config=[], compute_model={})
    )

    assert set(errors) == {"parameter_schema", "default_config", "compute_model"}


# Creating and editing recipes


@pytest.mark.django_db
def test_recipe_create_stores_a_valid_recipe(maintainer: Any) -> None:
    recipe = recipe_services.recipe_create(actor=maintainer, data=recipe_data(MARIN_MOE))

    stored = Recipe.objects.get(pk=recipe.pk)
    assert (stored.name, stored.version) == ("marin-moe", "1")
    assert stored.default_config == MARIN_MOE["default_config"]
    assert stored.parameter_schema == MARIN_MOE["parameter_schema"]
    assert stored.compute_model == MARIN_MOE["compute_model"]
    assert stored.scales == MARIN_MOE["scales"]
    assert stored.created_by == maintainer
    assert stored.is_active


@pytest.mark.django_db
def test_recipe_create_ignores_keys_that_are_not_recipe_fields() -> None:
    data = recipe_data(created_by=None, id=999, plan_count=3)

    recipe = recipe_services.recipe_create(actor=None, data=data)

    assert recipe.pk != 999
    assert recipe.created_by is None


@pytest.mark.django_db
def test_recipe_create_with_an_invalid_recipe_stores_nothing() -> None:
    with pytest.raises(ValidationError):
        recipe_services.recipe_create(
            actor=None, data=recipe_data(parameter_schema={"type": "object"})
        )

    assert Recipe.objects.count() == 0


@pytest.mark.django_db
def test_recipe_create_refuses_a_bad_name() -> None:
    with pytest.raises(ValidationError) as caught:
        recipe_services.recipe_create(actor=None, data=recipe_data(name="Tiny MoE"))

    assert "name" in caught.value.message_dict
    assert Recipe.objects.count() == 0


@pytest.mark.django_db
def test_recipe_create_refuses_a_second_recipe_of_the_same_name_and_version(recipe: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        recipe_services.recipe_create(actor=None, data=recipe_data())

    assert "already exists" in str(caught.value)
    assert Recipe.objects.count() == 1
    recipe_services.recipe_create(actor=None, data=recipe_data(version="2"))
    assert Recipe.objects.count() == 2


@pytest.mark.django_db
def test_recipe_update_changes_the_stored_recipe(recipe: Any) -> None:
    recipe_services.recipe_update(recipe=recipe, data={"title": "Tiny MoE, v1", "is_active": False})

    recipe.refresh_from_db()
    assert (recipe.title, recipe.is_active) == ("Tiny MoE, v1", False)
    assert recipe.default_config == TINY_MOE["default_config"]


@pytest.mark.django_db
def test_recipe_update_that_breaks_the_recipe_changes_nothing(recipe: Any) -> None:
    config = {**TINY_MOE["default_config"], "top_k": 99}

    with pytest.raises(ValidationError) as caught:
        recipe_services.recipe_update(
            recipe=recipe, data={"default_config": config, "title": "New"}
        )

    assert (
        "'top_k': 99 is greater than the maximum of 8"
        in caught.value.message_dict["default_config"]
    )
    stored = Recipe.objects.get(pk=recipe.pk)
    assert stored.title == TINY_MOE["title"]
    assert stored.default_config["top_k"] == 1


# Plans


@pytest.mark.django_db
def test_plan_build_returns_the_expanded_plan_without_storing_it(recipe: Any) -> None:
    preview = plan_services.plan_build(
        recipe=recipe, baseline={}, spec_text=WALKTHROUGH_SPEC, budget_accelerator_hours=None
    )

    assert preview.run_count == 4
    assert Plan.objects.count() == 0


@pytest.mark.django_db
def test_plan_build_errors_are_a_validation_error_by_field(recipe: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        plan_services.plan_build(
            recipe=recipe,
            baseline={"capacity_factr": 2},
            spec_text="axes:\n  top_k: [two]\n",
            budget_accelerator_hours=None,
        )

    errors = caught.value.message_dict
    assert set(errors) == {"baseline", "ablation_spec"}
    assert "did you mean 'capacity_factor'?" in errors["baseline"][0]
    assert "'two' is not of type 'integer'" in errors["ablation_spec"][0]


@pytest.mark.django_db
def test_plan_build_reports_a_compute_model_that_fails_for_a_run(recipe: Any) -> None:
    # the formula works at the default width and divides by zero only at the grid point
    recipe.compute_model["tokens"] = "steps * batch_size * seq_len / (width - 32)"
    recipe.save()

    with pytest.raises(ValidationError) as caught:
        plan_services.plan_build(
            recipe=recipe,
            baseline={},
            spec_text="axes: {width: [32]}",
            budget_accelerator_hours=None,
        )

    assert caught.value.message_dict == {
        "recipe": [
            "compute model: 'steps * batch_size * seq_len / (width - 32)': float division by zero"
        ]
    }


@pytest.mark.django_db
def test_plan_freeze_stores_the_plan_and_one_entry_per_run(recipe: Any) -> None:
    plan = plan_services.plan_freeze(
        recipe=recipe,
        baseline={"learning_rate": 0.001},
        spec_text=WALKTHROUGH_SPEC,
        budget_accelerator_hours=5.0,
    )

    plan.refresh_from_db()
    entries = list(PlanEntry.objects.filter(plan=plan).order_by("index"))
    assert [e.index for e in entries] == [0, 1, 2, 3]
    assert plan.run_count == 4
    assert plan.recipe == recipe
    assert plan.baseline == {"learning_rate": 0.001}
    assert plan.spec_text == WALKTHROUGH_SPEC
    assert plan.spec == {
        "axes": {"capacity_factor": [1.0, 1.25], "weight_decay": [0.0, 0.1]},
        "scales": ["small"],
        "seeds": [0],
    }
    assert plan.budget_accelerator_hours == 5.0
    for entry in entries:
        assert entry.config_hash == config_hash(entry.config)
        assert entry.config["learning_rate"] == 0.001
        assert (entry.scale, entry.seed) == ("small", 0)
        cost = run_cost(TINY_MOE["compute_model"], entry.config)
        assert entry.flops == cost.flops
        assert entry.accelerator_hours == pytest.approx(cost.accelerator_hours)
        assert entry.cost_formula.startswith("6 × N_active × D")
    assert len({e.config_hash for e in entries}) == 4
    assert [e.is_baseline for e in entries] == [True, False, False, False]
    assert entries[0].diff == {}
    assert entries[3].diff == {
        "capacity_factor": {"baseline": 1.0, "value": 1.25},
        "weight_decay": {"baseline": 0.0, "value": 0.1},
    }
    assert plan.total_flops == sum(e.flops for e in entries)
    assert plan.total_accelerator_hours == pytest.approx(sum(e.accelerator_hours for e in entries))
    assert plan.total_accelerator_hours < 5.0
    assert not plan.over_budget


@pytest.mark.django_db
def test_plan_freeze_snapshots_the_recipe(recipe: Any) -> None:
    plan = plan_services.plan_freeze(
        recipe=recipe, baseline={}, spec_text="", budget_accelerator_hours=None
    )

    plan.refresh_from_db()
    assert plan.recipe_snapshot == {
        key: TINY_MOE[key]
        for key in (
            "name",
            "version",
            "default_config",
            "parameter_schema",
            "compute_model",
            "scales",
        )
    } | {"resources": {}}  # what one job asks of a scheduler: the tiny recipe asks nothing
    assert plan.run_count == 1


@pytest.mark.django_db
def test_plan_freeze_with_a_bad_spec_stores_nothing(recipe: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        plan_services.plan_freeze(
            recipe=recipe,
            baseline={},
            spec_text="axes:\n  width: [100]\n",
            budget_accelerator_hours=None,
        )

    assert "100 is not one of [32, 64, 128, 256]" in caught.value.message_dict["ablation_spec"][0]
    assert Plan.objects.count() == 0
    assert PlanEntry.objects.count() == 0


@pytest.mark.django_db
def test_plan_freeze_over_budget_is_stored_as_over_budget(recipe: Any) -> None:
    plan = plan_services.plan_freeze(
        recipe=recipe, baseline={}, spec_text=WALKTHROUGH_SPEC, budget_accelerator_hours=1e-9
    )

    plan.refresh_from_db()
    assert plan.over_budget


@pytest.mark.django_db
def test_editing_the_recipe_does_not_change_a_frozen_plan(recipe: Any) -> None:
    plan = plan_services.plan_freeze(
        recipe=recipe, baseline={}, spec_text=WALKTHROUGH_SPEC, budget_accelerator_hours=None
    )
    plan.refresh_from_db()
    snapshot_before = copy.deepcopy(plan.recipe_snapshot)
    entries_before = list(
        PlanEntry.objects.filter(plan=plan)
        .order_by("index")
        .values("config", "config_hash", "flops", "accelerator_hours", "diff", "is_baseline")
    )
    totals_before = (plan.total_flops, plan.total_accelerator_hours, plan.run_count)

    recipe_services.recipe_update(
        recipe=recipe,
        data={
            "default_config": {**TINY_MOE["default_config"], "learning_rate": 0.01, "steps": 400},
            "compute_model": {**TINY_MOE["compute_model"], "assumed_mfu": 0.5},
            "scales": {"small": {"width": 32, "depth": 1}},
        },
    )

    recipe.refresh_from_db()
    assert recipe.default_config["learning_rate"] == 0.01  # the edit happened
    rebuilt = plan_services.plan_build(
        recipe=recipe, baseline={}, spec_text=WALKTHROUGH_SPEC, budget_accelerator_hours=None
    )
    assert {p.config_hash for p in rebuilt.points}.isdisjoint(
        e["config_hash"] for e in entries_before
    )

    plan = Plan.objects.get(pk=plan.pk)
    assert plan.recipe_snapshot == snapshot_before
    assert plan.recipe_snapshot["default_config"]["learning_rate"] == 0.003
    assert plan.recipe_snapshot["compute_model"]["assumed_mfu"] == 0.2
    assert (plan.total_flops, plan.total_accelerator_hours, plan.run_count) == totals_before
    entries_after = list(
        PlanEntry.objects.filter(plan=plan)
        .order_by("index")
        .values("config", "config_hash", "flops", "accelerator_hours", "diff", "is_baseline")
    )
    assert entries_after == entries_before


@pytest.mark.django_db
def test_each_freeze_is_its_own_plan(recipe: Any) -> None:
    first = plan_services.plan_freeze(
        recipe=recipe, baseline={}, spec_text=WALKTHROUGH_SPEC, budget_accelerator_hours=None
    )
    second = plan_services.plan_freeze(
        recipe=recipe, baseline={}, spec_text=WALKTHROUGH_SPEC, budget_accelerator_hours=None
    )

    assert first.pk != second.pk
    assert PlanEntry.objects.filter(plan=first).count() == 4
    assert PlanEntry.objects.filter(plan=second).count() == 4
    first_hashes = set(PlanEntry.objects.filter(plan=first).values_list("config_hash", flat=True))
    second_hashes = set(PlanEntry.objects.filter(plan=second).values_list("config_hash", flat=True))
    assert first_hashes == second_hashes


@pytest.mark.django_db
def test_recipe_create_and_update_are_recorded_in_its_history(maintainer: Any) -> None:
    recipe = recipe_services.recipe_create(actor=maintainer, data=recipe_data(), door=Door.API)
    recipe_services.recipe_update(
        recipe=recipe,
        data={"title": "Tiny MoE, v1", "is_active": False},
        actor=maintainer,
        door=Door.WEB,
    )
    recipe_services.recipe_update(recipe=recipe, data={"title": "Tiny MoE, v1"}, actor=maintainer)
    assert [(e.verb, e.door, e.actor, e.message) for e in recipe.events.all()] == [
        ("created", "api", maintainer, ""),
        ("edited", "web", maintainer, "Changed is_active, title"),
    ]  # the last update changed nothing: nothing recorded


@pytest.mark.django_db
def test_a_refused_recipe_update_records_nothing(recipe: Any, maintainer: Any) -> None:
    with pytest.raises(ValidationError):
        recipe_services.recipe_update(
            recipe=recipe, data={"default_config": {"steps": "many"}}, actor=maintainer
        )
    assert not recipe.events.exists()


@pytest.mark.parametrize("limit", [59, 91 * 24 * 3600, "3600", 1.5])
def test_recipe_time_limit_out_of_range_is_refused(limit: Any) -> None:
    with pytest.raises(ValidationError) as refused:
        recipe_services.recipe_validate(
            data={**copy.deepcopy(TINY_MOE), "time_limit_seconds": limit}
        )
    assert list(refused.value.message_dict) == ["time_limit_seconds"]


def test_recipe_time_limit_of_two_weeks_is_accepted() -> None:
    recipe_services.recipe_validate(
        data={**copy.deepcopy(TINY_MOE), "time_limit_seconds": 14 * 86400}
    )


@pytest.mark.django_db
def test_recipe_for_a_pool_that_may_not_run_it_is_refused(maintainer: Any) -> None:
    from runs.pools.models import Pool

    Pool.objects.create(name="lab", owner=maintainer, recipes=["marin-moe"])
    with pytest.raises(ValidationError) as refused:
        recipe_services.recipe_validate(data={**copy.deepcopy(TINY_MOE), "executor": "pool:lab"})
    assert refused.value.message_dict == {"executor": ["pool 'lab' may not run recipe 'tiny-moe'"]}
