"""Ablation specs and plans: expansion, merge order, dedupe, hashes, diffs, refused input."""

from __future__ import annotations

import copy
import hashlib
import time
from typing import Any

import pytest

from runs.recipes.demo import TINY_MOE
from runs.specs.ablation import (
    MAX_RUNS,
    Plan,
    PlanError,
    RecipeSpec,
    build_plan,
    canonical_json,
    config_diff,
    config_hash,
    deep_merge,
    parse_overrides,
    parse_spec,
)
from runs.specs.compute import run_cost
from tests.factories import WALKTHROUGH_SPEC

BILLION_LAUGHS = """\
a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]
"""


def tiny(**changes: Any) -> RecipeSpec:
    data = copy.deepcopy(TINY_MOE)
    fields = ("name", "version", "default_config", "parameter_schema", "compute_model", "scales")
    return RecipeSpec(**{key: data[key] for key in fields} | changes)


def plan(spec_text: str, baseline: dict[str, Any] | None = None, **kwargs: Any) -> Plan:
    return build_plan(recipe=tiny(), baseline=baseline or {}, spec_text=spec_text, **kwargs)


def refusal(spec_text: str, baseline: dict[str, Any] | None = None) -> dict[str, list[str]]:
    with pytest.raises(PlanError) as caught:
        plan(spec_text, baseline)
    return caught.value.errors


def spec_refusal(spec_text: str) -> str:
    """The ablation_spec messages parse_spec gives, joined for substring checks."""
    with pytest.raises(PlanError) as caught:
        parse_spec(spec_text)
    assert list(caught.value.errors) == ["ablation_spec"]
    return " | ".join(caught.value.errors["ablation_spec"])


# Expansion


def test_walkthrough_spec_gives_four_runs_with_the_baseline_among_them() -> None:
    result = plan(WALKTHROUGH_SPEC)

    assert result.run_count == 4
    grid = {(p.config["capacity_factor"], p.config["weight_decay"]) for p in result.points}
    assert grid == {(1.0, 0.0), (1.0, 0.1), (1.25, 0.0), (1.25, 0.1)}
    assert [p.index for p in result.points] == [0, 1, 2, 3]
    assert {(p.scale, p.seed) for p in result.points} == {("small", 0)}


def test_walkthrough_baseline_is_the_grid_point_equal_to_the_defaults() -> None:
    result = plan(WALKTHROUGH_SPEC)

    baselines = [p for p in result.points if p.is_baseline]
    assert len(baselines) == 1
    assert baselines[0].overrides == {"capacity_factor": 1.0, "weight_decay": 0.0}
    assert baselines[0].diff == {}
    assert all(p.diff for p in result.points if not p.is_baseline)


@pytest.mark.parametrize(
    ("spec_text", "expected_runs"),
    [
        # grid of 2 x 3 points, none equal to the baseline, plus the baseline
        ("axes: {capacity_factor: [1.25, 1.5], weight_decay: [0.1, 0.2, 0.3]}", 7),
        # ... at two scales: every scale has its own baseline
        ("axes: {capacity_factor: [1.25, 1.5], top_k: [2, 3, 4]}\nscales: [small, medium]", 14),
        # ... with three seeds at each scale
        (
            "axes: {capacity_factor: [1.25, 1.5], top_k: [2, 3, 4]}\n"
            "scales: [small, medium]\nseeds: [0, 1, 2]",
            42,
        ),
        # seeds and scales alone: the baseline at each
        ("scales: [small, medium, large]\nseeds: [1, 2]", 6),
    ],
)
def test_spec_expands_to_the_cartesian_product_of_axes_scales_and_seeds(
    spec_text: str, expected_runs: int
) -> None:
    result = plan(spec_text)

    assert result.run_count == expected_runs
    assert len({p.config_hash for p in result.points}) == expected_runs


def test_empty_spec_plans_only_the_baseline() -> None:
    result = plan("", {"capacity_factor": 1.5})

    assert result.run_count == 1
    (only,) = result.points
    assert only.is_baseline
    assert only.config == deep_merge(TINY_MOE["default_config"], {"capacity_factor": 1.5})
    assert (only.scale, only.seed, only.overrides) == ("", None, {})


def test_seeds_set_the_seed_of_every_run() -> None:
    result = plan("axes: {top_k: [1, 2]}\nseeds: [3, 7]")

    assert result.run_count == 4
    for point in result.points:
        assert point.config["seed"] == point.seed
    assert [p.seed for p in result.points] == [3, 3, 7, 7]


def test_without_seeds_runs_keep_the_default_seed() -> None:
    result = plan("axes: {top_k: [2]}")

    assert {p.seed for p in result.points} == {None}
    assert {p.config["seed"] for p in result.points} == {TINY_MOE["default_config"]["seed"]}


def test_scales_apply_the_recipe_scale_overrides() -> None:
    result = plan("scales: [small, medium, large]")

    by_scale = {p.scale: p.config for p in result.points}
    for name, overrides in TINY_MOE["scales"].items():
        assert by_scale[name]["width"] == overrides["width"]
        assert by_scale[name]["depth"] == overrides["depth"]
    flops = {p.scale: p.cost.flops for p in result.points}
    assert flops["small"] < flops["medium"] < flops["large"]


def test_runs_merge_defaults_baseline_scale_point_and_seed_in_that_order() -> None:
    recipe = RecipeSpec(
        name="order",
        version="1",
        default_config={"a": 0, "b": 0, "c": 0, "d": 0, "seed": 0, "mix": {"x": 1, "y": 2}},
        parameter_schema={
            "type": "object",
            "properties": {name: {"type": "integer"} for name in ("a", "b", "c", "d", "seed")},
        },
        compute_model={
            "active_params": 10,
            "tokens": 10,
            "peak_flops_per_accelerator": 1,
            "assumed_mfu": 1,
        },
        scales={"s": {"b": 2, "c": 2, "seed": 2, "mix": {"y": 3}}},
    )

    result = build_plan(
        recipe=recipe,
        baseline={"a": 1, "b": 1, "c": 1, "seed": 1},
        spec_text="axes: {c: [3], seed: [3]}\nscales: [s]\nseeds: [4]",
    )

    point = next(p for p in result.points if not p.is_baseline)
    # a from the baseline, b from the scale, c from the grid point, seed from seeds, d default
    assert point.config == {"a": 1, "b": 2, "c": 3, "d": 0, "seed": 4, "mix": {"x": 1, "y": 3}}
    baseline = next(p for p in result.points if p.is_baseline)
    assert baseline.config == {"a": 1, "b": 2, "c": 2, "d": 0, "seed": 4, "mix": {"x": 1, "y": 3}}


def test_nested_baseline_override_keeps_the_other_nested_keys() -> None:
    result = plan("", {"data_mix": {"docs": 0.5}})

    assert result.points[0].config["data_mix"] == {"code": 0.7, "docs": 0.5}


def test_deep_merge_merges_mappings_replaces_the_rest_and_leaves_its_inputs_alone() -> None:
    base: dict[str, Any] = {"mix": {"web": 0.6, "code": 0.4}, "steps": [1, 2], "lr": 0.1}
    override = {"mix": {"web": 0.5}, "steps": [3]}

    merged = deep_merge(base, override, {"lr": 0.2})

    assert merged == {"mix": {"web": 0.5, "code": 0.4}, "steps": [3], "lr": 0.2}
    assert base == {"mix": {"web": 0.6, "code": 0.4}, "steps": [1, 2], "lr": 0.1}
    assert override == {"mix": {"web": 0.5}, "steps": [3]}
    merged["mix"]["code"] = 0.0
    assert base["mix"]["code"] == 0.4


def test_repeated_axis_values_collapse_into_one_run() -> None:
    result = plan("axes: {capacity_factor: [1.25, 1.25, 1.25]}")

    assert result.run_count == 2
    assert sorted(p.config["capacity_factor"] for p in result.points) == [1.0, 1.25]


def test_axis_values_equal_as_numbers_collapse_into_one_run() -> None:
    result = plan("axes: {capacity_factor: [2, 2.0]}")

    assert result.run_count == 2


def test_axis_value_equal_to_the_baseline_is_not_run_twice() -> None:
    result = plan("axes: {capacity_factor: [1.0, 1.25]}")

    assert result.run_count == 2
    baseline = result.points[0]
    assert baseline.is_baseline
    assert baseline.overrides == {"capacity_factor": 1.0}  # named after the grid point it equals


def test_grid_points_that_resolve_to_the_same_config_collapse() -> None:
    # both points spell out part of the default data mix: neither changes the config
    result = plan("axes:\n  data_mix: [{docs: 0.3}, {docs: 0.3, code: 0.7}]\n")

    assert result.run_count == 1
    assert result.points[0].is_baseline
    assert result.points[0].overrides == {"data_mix": {"docs": 0.3}}


def test_baseline_outside_the_grid_is_added_as_an_extra_run() -> None:
    result = plan("axes: {capacity_factor: [1.25, 1.5]}")

    assert result.run_count == 3
    first, *others = result.points
    assert first.is_baseline
    assert first.overrides == {}
    assert first.config["capacity_factor"] == 1.0
    assert [p.is_baseline for p in others] == [False, False]


def test_baseline_at_every_scale_and_seed_is_flagged() -> None:
    result = plan("axes: {capacity_factor: [1.25]}\nscales: [small, medium]\nseeds: [0, 1]")

    baselines = [(p.scale, p.seed) for p in result.points if p.is_baseline]
    assert sorted(baselines) == [("medium", 0), ("medium", 1), ("small", 0), ("small", 1)]
    assert result.run_count == 8


def test_baseline_overrides_move_the_baseline_point() -> None:
    result = plan("axes: {capacity_factor: [1.0, 1.25]}", {"capacity_factor": 1.25})

    assert result.run_count == 2
    baseline = next(p for p in result.points if p.is_baseline)
    other = next(p for p in result.points if not p.is_baseline)
    assert baseline.config["capacity_factor"] == 1.25
    assert other.diff == {"capacity_factor": {"baseline": 1.25, "value": 1.0}}


def test_diff_lists_only_the_keys_that_differ_from_the_baseline() -> None:
    result = plan("axes: {weight_decay: [0.1]}\nseeds: [5]")

    point = next(p for p in result.points if not p.is_baseline)
    assert point.diff == {"weight_decay": {"baseline": 0.0, "value": 0.1}}


def test_diff_of_a_data_mix_point_names_the_nested_keys() -> None:
    result = plan("axes:\n  data_mix:\n    - {docs: 0.5, code: 0.4}\n")

    point = next(p for p in result.points if not p.is_baseline)
    assert point.diff == {
        "data_mix.code": {"baseline": 0.7, "value": 0.4},
        "data_mix.docs": {"baseline": 0.3, "value": 0.5},
    }
    assert point.config["data_mix"] == {"docs": 0.5, "code": 0.4}


def test_config_diff_reports_added_and_removed_keys_and_ignores_1_versus_1_0() -> None:
    baseline = {"a": {"b": 1, "c": 2}, "gone": True, "same": 1}
    config = {"a": {"b": 1, "c": 3}, "new": 4, "same": 1.0}

    assert config_diff(baseline, config) == {
        "a.c": {"baseline": 2, "value": 3},
        "gone": {"baseline": True, "value": None},
        "new": {"baseline": None, "value": 4},
    }


def test_every_run_is_priced_with_its_own_config() -> None:
    result = plan("axes: {top_k: [1, 2]}")

    model = TINY_MOE["compute_model"]
    for point in result.points:
        assert point.cost.flops == run_cost(model, point.config).flops
    top1, top2 = sorted(result.points, key=lambda p: p.config["top_k"])
    assert top2.cost.active_params > top1.cost.active_params
    assert top2.cost.total_params == top1.cost.total_params


def test_plan_totals_sum_its_runs_and_compare_with_the_budget() -> None:
    result = plan(WALKTHROUGH_SPEC, budget_accelerator_hours=1e-9)

    assert result.total_flops == sum(p.cost.flops for p in result.points)
    assert result.total_accelerator_hours == pytest.approx(
        sum(p.cost.accelerator_hours for p in result.points)
    )
    assert result.over_budget
    assert not plan(WALKTHROUGH_SPEC, budget_accelerator_hours=1e9).over_budget
    assert not plan(WALKTHROUGH_SPEC).over_budget
    assert result.axis_names == ["capacity_factor", "weight_decay"]


# Hash


def test_config_hash_ignores_key_order_at_every_depth() -> None:
    one = {"a": 1, "b": {"x": 1, "y": [1, 2]}}
    other = {"b": {"y": [1, 2], "x": 1}, "a": 1}

    assert config_hash(one) == config_hash(other)


def test_config_hash_treats_1_and_1_0_as_the_same_value() -> None:
    assert config_hash({"lr": 1, "mix": [2]}) == config_hash({"lr": 1.0, "mix": [2.0]})


@pytest.mark.parametrize(
    "other",
    [
        {"lr": 0.0011},
        {"lr": 0.001, "extra": 0},
        {"lr": "0.001"},
        {"lr": [0.001]},
        {"LR": 0.001},
    ],
)
def test_config_hash_differs_for_different_configs(other: dict[str, Any]) -> None:
    assert config_hash({"lr": 0.001}) != config_hash(other)


def test_config_hash_is_the_sha256_of_the_canonical_json() -> None:
    config = {"width": 64.0, "data_mix": {"web": 0.6, "code": 0.4}, "name": "ü"}

    expected_text = '{"data_mix":{"code":0.4,"web":0.6},"name":"ü","width":64}'
    assert canonical_json(config) == expected_text
    assert config_hash(config) == hashlib.sha256(expected_text.encode()).hexdigest()
    # printf '%s' '{"a":1}' | sha256sum
    assert config_hash({"a": 1.0}) == (
        "015abd7f5cc57a2dd94b7590f04ad8084273905ee33ec5cebeae62276a97f862"
    )


def test_plan_points_carry_the_hash_of_their_config() -> None:
    result = plan(WALKTHROUGH_SPEC)

    for point in result.points:
        assert point.config_hash == config_hash(point.config)
        assert len(point.config_hash) == 64


# Refused input


@pytest.mark.parametrize(
    ("spec_text", "kind"),
    [("- capacity_factor\n- top_k\n", "list"), ("just some words", "str"), ("42", "int")],
)
def test_spec_that_is_not_a_mapping_is_refused(spec_text: str, kind: str) -> None:
    message = spec_refusal(spec_text)

    assert "must be a mapping" in message
    assert kind in message


def test_spec_with_unknown_top_level_key_is_refused() -> None:
    message = spec_refusal("axis:\n  capacity_factor: [1.25]\nseed: [1]\n")

    assert "unknown top-level key 'axis'" in message
    assert "unknown top-level key 'seed'" in message
    assert "axes, scales, seeds" in message


def test_spec_with_alias_is_refused_quickly_without_expansion() -> None:
    started = time.perf_counter()
    message = spec_refusal(BILLION_LAUGHS)

    assert time.perf_counter() - started < 1.0
    assert "line 1: anchors and aliases are not allowed" in message


def test_spec_with_a_lone_anchor_is_refused() -> None:
    message = spec_refusal("axes:\n  capacity_factor: &cf [1.25]\n")

    assert "line 2: anchors and aliases are not allowed" in message


def test_baseline_with_alias_is_refused() -> None:
    with pytest.raises(PlanError) as caught:
        parse_overrides("a: &x 1\nb: *x\n")

    assert "anchors and aliases" in caught.value.errors["baseline"][0]


def test_spec_over_64_kib_is_refused() -> None:
    text = "axes:\n  capacity_factor: [1.25]\n" + "#" * (64 * 1024)

    message = spec_refusal(text)

    assert f"is {len(text)} bytes; the limit is 64 KiB" in message


def test_spec_of_exactly_64_kib_is_accepted() -> None:
    head = "axes:\n  capacity_factor: [1.25]\n#"
    text = head + "x" * (64 * 1024 - len(head))

    assert parse_spec(text).axes == {"capacity_factor": [1.25]}


def test_spec_of_64_kib_of_multibyte_text_counts_bytes_not_characters() -> None:
    text = "axes:\n  capacity_factor: [1.25]\n#" + "é" * (40 * 1024)  # 40 Ki chars, 80 KiB

    assert "the limit is 64 KiB" in spec_refusal(text)


def test_deeply_nested_spec_is_refused_quickly() -> None:
    text = "axes: " + "[" * 30_000 + "]" * 30_000

    started = time.perf_counter()
    message = spec_refusal(text)

    assert time.perf_counter() - started < 2.0
    assert "nested deeper than 32 levels" in message


def test_deeply_nested_block_sequence_is_refused() -> None:
    assert "nested deeper than 32 levels" in spec_refusal("- " * 30_000 + "1")


def test_spec_expanding_past_the_run_limit_is_refused_before_expanding() -> None:
    axes = "\n".join(f"  p{n}: [{', '.join(str(v) for v in range(10))}]" for n in range(10))

    started = time.perf_counter()
    message = spec_refusal(f"axes:\n{axes}\n")

    assert time.perf_counter() - started < 1.0  # 10**10 runs: expanding would never finish
    assert "expands to 10000000000 runs; the limit is 1024 per plan" in message


def test_plan_over_the_run_limit_names_the_count_and_the_limit() -> None:
    five = "[0.1, 0.2, 0.3, 0.4, 0.5]"
    spec_text = (
        f"axes:\n  learning_rate: {five}\n  weight_decay: {five}\n"
        "  num_experts: [1, 2, 4, 8, 16]\n  top_k: [1, 2, 3, 4, 5]\n"
        "  capacity_factor: [1, 2, 3, 4, 5]\n"
    )

    errors = refusal(spec_text)

    assert errors == {"ablation_spec": ["expands to 3125 runs; the limit is 1024 per plan"]}


def test_scales_and_seeds_count_towards_the_run_limit() -> None:
    seeds = ", ".join(str(seed) for seed in range(600))

    message = spec_refusal(f"axes:\n  top_k: [1, 2]\nseeds: [{seeds}]\n")

    assert "expands to 1200 runs" in message


def test_spec_of_exactly_the_run_limit_is_accepted() -> None:
    values = ", ".join(str(v) for v in range(32))

    spec = parse_spec(f"axes:\n  a: [{values}]\n  b: [{values}]\n")

    assert spec.grid_size == MAX_RUNS


def test_spec_one_over_the_run_limit_is_refused() -> None:
    message = spec_refusal(
        f"axes:\n  a: [{', '.join(map(str, range(41)))}]\n  b: [{', '.join(map(str, range(25)))}]\n"
    )

    assert "expands to 1025 runs" in message


@pytest.mark.parametrize(
    "spec_text",
    ["axes:\n  capacity_factor: 1.25\n", "axes:\n  capacity_factor: {a: 1}\n"],
)
def test_axis_values_that_are_not_a_list_are_refused(spec_text: str) -> None:
    message = spec_refusal(spec_text)

    assert "axes.capacity_factor: must be a non-empty list of values" in message


def test_axis_with_an_empty_list_is_refused() -> None:
    message = spec_refusal("axes:\n  capacity_factor: []\n")

    assert "axes.capacity_factor: must be a non-empty list of values" in message


@pytest.mark.parametrize("axes", ["[capacity_factor]", "[]", "capacity_factor", "0"])
def test_axes_that_are_not_a_mapping_are_refused(axes: str) -> None:
    message = spec_refusal(f"axes: {axes}\n")

    assert "'axes' must map parameter names to lists of values" in message


@pytest.mark.parametrize(
    "seeds",
    ["[one]", "[1.5]", "[-1]", "[true]", "['3']", "0", "3", "{a: 1}", "''", "[2147483648]"],
)
def test_seeds_that_are_not_32_bit_non_negative_integers_are_refused(seeds: str) -> None:
    message = spec_refusal(f"seeds: {seeds}\n")

    assert "'seeds' must be a list of integers from 0 to 2147483647" in message


def test_yaml_dates_stay_strings() -> None:
    assert parse_overrides("day: 2024-01-01\n") == {"day": "2024-01-01"}


@pytest.mark.parametrize("scales", ["small", "[1]", "[[small]]", "0"])
def test_scales_that_are_not_a_list_of_names_are_refused(scales: str) -> None:
    message = spec_refusal(f"scales: {scales}\n")

    assert "'scales' must be a list of scale names" in message


def test_empty_or_null_spec_keys_mean_nothing_to_vary() -> None:
    spec = parse_spec("axes:\nscales:\nseeds:\n")

    assert (spec.axes, spec.scales, spec.seeds) == ({}, [], [])


def test_repeated_seeds_and_scales_are_counted_once() -> None:
    spec = parse_spec("scales: [small, small]\nseeds: [1, 1, 2]\n")

    assert (spec.scales, spec.seeds) == (["small"], [1, 2])


def test_unknown_scale_is_refused_naming_it_and_the_defined_ones() -> None:
    errors = refusal("scales: [small, huge]")

    (message,) = errors["ablation_spec"]
    assert "unknown scale(s) huge" in message
    assert "small, medium, large" in message


def test_override_of_an_undeclared_parameter_suggests_the_close_match() -> None:
    errors = refusal("axes:\n  capacity_factr: [1.25, 1.5]\n")

    (message,) = errors["ablation_spec"]  # one message, not one per value
    assert "unknown parameter 'capacity_factr'" in message
    assert "did you mean 'capacity_factor'?" in message
    assert "tiny-moe v1" in message


def test_override_of_a_parameter_the_recipe_does_not_declare_is_refused() -> None:
    # depth is in the default config but not declared overridable
    errors = refusal("", {"depth": 8})

    (message,) = errors["baseline"]
    assert "baseline: unknown parameter 'depth'" in message


@pytest.mark.parametrize(
    ("axis", "value", "rule"),
    [
        ("weight_decay", "-1", "-1 is less than the minimum of 0"),
        ("width", "100", "100 is not one of [32, 64, 128, 256]"),
        ("top_k", "two", "'two' is not of type 'integer'"),
        ("learning_rate", "0", "0 is less than or equal to the minimum of 0"),
        ("steps", "1.5", "1.5 is not of type 'integer'"),
    ],
)
def test_axis_value_outside_the_schema_is_refused_naming_parameter_and_rule(
    axis: str, value: str, rule: str
) -> None:
    errors = refusal(f"axes:\n  {axis}: [{value}]\n")

    (message,) = errors["ablation_spec"]
    assert f"axes.{axis}: parameter '{axis}': {rule}" == message


def test_nested_value_outside_the_schema_names_the_nested_path() -> None:
    errors = refusal("axes:\n  data_mix:\n    - {docs: 2}\n")

    (message,) = errors["ablation_spec"]
    assert "parameter 'data_mix.docs': 2 is greater than the maximum of 1" in message


def test_baseline_value_outside_the_schema_is_refused() -> None:
    errors = refusal("", {"top_k": 9})

    assert errors == {
        "baseline": ["baseline: parameter 'top_k': 9 is greater than the maximum of 8"]
    }


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_non_finite_axis_value_is_refused(value: str) -> None:
    errors = refusal(f"axes:\n  learning_rate: [{value}]\n")

    assert (
        "parameter 'learning_rate': NaN and infinity are not allowed" in errors["ablation_spec"][0]
    )


def test_non_finite_value_nested_in_the_baseline_is_refused() -> None:
    errors = refusal("", {"data_mix": {"docs": float("nan")}})

    assert errors == {
        "baseline": ["baseline: parameter 'data_mix': NaN and infinity are not allowed"]
    }


@pytest.mark.parametrize("spec_text", ["axes: [1, 2", "axes:\n  a: 1\n b: 2\n", "axes: {a: [1]"])
def test_invalid_yaml_is_refused(spec_text: str) -> None:
    assert "is not valid YAML" in spec_refusal(spec_text)


def test_yaml_python_tags_are_refused() -> None:
    assert "is not valid YAML" in spec_refusal("axes: !!python/object/apply:os.system [ls]\n")


def test_baseline_and_spec_errors_are_reported_together() -> None:
    errors = refusal("axes:\n  top_k: [0]\n", {"weight_decay": 2})

    assert set(errors) == {"baseline", "ablation_spec"}
    assert "weight_decay" in errors["baseline"][0]
    assert "top_k" in errors["ablation_spec"][0]


def test_plan_error_message_names_every_field() -> None:
    error = PlanError({"baseline": ["bad a"], "ablation_spec": ["bad b", "bad c"]})

    assert str(error) == "baseline: bad a; ablation_spec: bad b; ablation_spec: bad c"


# Baseline overrides text


def test_overrides_parse_from_yaml_or_json() -> None:
    assert parse_overrides("capacity_factor: 1.25\n") == {"capacity_factor": 1.25}
    assert parse_overrides('{"data_mix": {"web": 0.5}}') == {"data_mix": {"web": 0.5}}
    assert parse_overrides("") == {}
    assert parse_overrides("  \n") == {}
    assert parse_overrides("~") == {}


@pytest.mark.parametrize("text", ["[1, 2]", "1.25", "capacity_factor"])
def test_overrides_that_are_not_a_mapping_are_refused(text: str) -> None:
    with pytest.raises(PlanError) as caught:
        parse_overrides(text, "baseline")

    assert caught.value.errors == {"baseline": ["must be a mapping of parameter names to values"]}
