"""The compute model: FLOPs, accelerator-hours, and a formula evaluator that runs no code."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from runs.recipes.demo import MARIN_MOE, TINY_MOE
from runs.specs.compute import FormulaError, evaluate, run_cost, validate_compute_model

NUMERIC_MODEL = {
    "total_params": 535e9,
    "active_params": 23e9,
    "tokens": 1e12,
    "peak_flops_per_accelerator": 4.59e14,
    "assumed_mfu": 0.4,
    "accelerator": "TPU v5p chip",
}


def model(**changes: Any) -> dict[str, Any]:
    return {**copy.deepcopy(TINY_MOE["compute_model"]), **changes}


# FLOPs and accelerator-hours


def test_flops_are_six_times_active_params_times_tokens_for_numbers() -> None:
    cost = run_cost(NUMERIC_MODEL, {})

    assert cost.flops == 6 * 23e9 * 1e12
    assert cost.active_params == 23e9
    assert cost.total_params == 535e9
    assert cost.tokens == 1e12


def test_accelerator_hours_are_flops_over_peak_times_mfu_in_hours() -> None:
    cost = run_cost(NUMERIC_MODEL, {})

    assert cost.accelerator_hours == pytest.approx(6 * 23e9 * 1e12 / (4.59e14 * 0.4) / 3600)
    assert cost.accelerator_hours == pytest.approx(208_787.2, rel=1e-6)


def test_flops_from_formulas_over_the_config() -> None:
    config = TINY_MOE["default_config"]  # width 64, depth 2, top_k 1, 4 experts, vocab 256, seq 64

    cost = run_cost(TINY_MOE["compute_model"], config)

    # Per block: attention 4·w², the router experts·w, the experts' 8·w² each (top_k active),
    # two norms; then embeddings in and out, positions (seq_len 64) and the final norm.
    block_shared = 4 * 64**2 + 4 * 64 + 2 * 64
    outside = 2 * 256 * 64 + 64 * 64 + 64
    active = 2 * (block_shared + 1 * 8 * 64**2) + outside
    total = 2 * (block_shared + 4 * 8 * 64**2) + outside
    tokens = 200 * 16 * 64
    assert (cost.active_params, cost.total_params, cost.tokens) == (active, total, tokens)
    assert cost.flops == 6 * active * tokens
    assert cost.accelerator_hours == pytest.approx(6 * active * tokens / (1e11 * 0.2) / 3600)


def test_flops_follow_the_config_they_are_given() -> None:
    config = {**TINY_MOE["default_config"], "top_k": 2, "steps": 400}

    wider = run_cost(TINY_MOE["compute_model"], config)
    base = run_cost(TINY_MOE["compute_model"], TINY_MOE["default_config"])

    assert wider.tokens == 2 * base.tokens
    assert wider.active_params == base.active_params + 2 * 8 * 64**2
    assert wider.total_params == base.total_params


def test_marin_scale_prices_the_23b_active_run() -> None:
    config = {**MARIN_MOE["default_config"], **MARIN_MOE["scales"]["23b"]}

    cost = run_cost(MARIN_MOE["compute_model"], config)

    assert cost.flops == pytest.approx(6 * 23e9 * 460e9)
    assert cost.accelerator_hours == pytest.approx(6 * 23e9 * 460e9 / (4.59e14 * 0.4) / 3600)


def test_total_params_are_optional() -> None:
    numbers = {k: v for k, v in NUMERIC_MODEL.items() if k != "total_params"}

    assert run_cost(numbers, {}).total_params is None


def test_cost_formula_shows_the_arithmetic() -> None:
    cost = run_cost(NUMERIC_MODEL, {})

    assert cost.formula.startswith("6 × N_active × D = 6 × 2.3e+10 × 1e+12 = 1.38e+23 FLOPs")
    assert "MFU 0.4" in cost.formula
    assert cost.formula.endswith("= 2.09e+05 accelerator-hours")


def test_cost_with_a_formula_over_an_unknown_name_is_refused() -> None:
    with pytest.raises(FormulaError, match="unknown name 'hidden'"):
        run_cost(model(active_params="hidden * 2"), TINY_MOE["default_config"])


def test_cost_that_overflows_to_infinity_is_refused() -> None:
    huge = {**NUMERIC_MODEL, "active_params": 1e200, "tokens": 1e200}

    with pytest.raises(FormulaError, match="not a finite number"):
        run_cost(huge, {})


# The formula evaluator


@pytest.mark.parametrize(
    ("formula", "expected"),
    [
        (7, 7.0),
        (2.5, 2.5),
        ("12 * depth * width ** 2", 12 * 2 * 64**2),
        ("depth + width * 2", 130.0),
        ("(depth + width) * 2", 132.0),
        ("-depth + +width", 62.0),
        ("width / 3", 64 / 3),
        ("width // 3", 21.0),
        ("width % 10", 4.0),
        ("1e9 * depth", 2e9),
        ("min(depth, width)", 2.0),
        ("max(depth, width, 100)", 100.0),
        ("ceil(width / 3)", 22.0),
        ("2 ** 64", 2.0**64),
    ],
)
def test_formula_evaluates_arithmetic_over_config_names(formula: Any, expected: float) -> None:
    assert evaluate(formula, {"depth": 2, "width": 64}) == pytest.approx(expected)


@pytest.mark.parametrize(
    "formula",
    [
        "__import__('os')",
        "__import__('os').system('true')",
        "open('/etc/passwd')",
        "eval('1')",
        "print(1)",
        "width.real",
        "().__class__.__bases__",
        "sizes[0]",
        "lambda: 1",
        "(lambda x: x)(1)",
        "[1, 2]",
        "{'a': 1}",
        "'abc'",
        "width if width else 1",
        "width == 64",
        "width and depth",
        "not width",
        "~width",
        "width @ depth",
        "width << 2",
        "min(*sizes)",
        "max(width, key=abs)",
        "[x for x in (1, 2)]",
        "(y := 3)",
        "f'{width}'",
        "1j",
        "True",
    ],
)
def test_formula_refuses_anything_but_arithmetic(formula: str) -> None:
    with pytest.raises(FormulaError, match=r"not allowed in a formula|not numbers"):
        evaluate(formula, {"width": 64, "depth": 2, "sizes": [1, 2]})


@pytest.mark.parametrize("name", ["hidden", "__builtins__", "os", "min_width"])
def test_formula_refuses_names_that_are_not_config_keys(name: str) -> None:
    with pytest.raises(FormulaError, match=f"unknown name '{name}'"):
        evaluate(f"{name} * 2", {"width": 64})


@pytest.mark.parametrize("value", ["sixty-four", [64], {"a": 1}, None, True])
def test_formula_refuses_config_values_that_are_not_numbers(value: Any) -> None:
    with pytest.raises(FormulaError, match=r"'width' is .*, not a number"):
        evaluate("width * 2", {"width": value})


@pytest.mark.parametrize("formula", ["2 ** 65", "10 ** 10 ** 10", "2 ** -65", "9 ** (width * 2)"])
def test_formula_refuses_huge_exponents(formula: str) -> None:
    with pytest.raises(FormulaError, match="exponents above 64 are not allowed"):
        evaluate(formula, {"width": 64})


@pytest.mark.parametrize(
    ("formula", "message"),
    [
        ("(10 ** 60) ** 60", "Numerical result out of range"),
        ("1 / 0", "division by zero"),
        ("width % 0", "modulo"),
        ("0 ** -1", "cannot be raised to a negative power"),
        ("1e308 * 10", "not a finite number"),
        ("1e400", "not a finite number"),
        ("(-8) ** 0.5", "is not a real number"),
        ("min()", "min expected at least 1 argument"),
        ("ceil(1, 2)", "ceil"),
        ("ceil(1e400)", "cannot convert float infinity"),
    ],
)
def test_formula_arithmetic_errors_are_formula_errors(formula: str, message: str) -> None:
    with pytest.raises(FormulaError, match=message):
        evaluate(formula, {"width": 64})


def test_formula_that_does_not_parse_is_refused() -> None:
    with pytest.raises(FormulaError, match="cannot parse 'width \\*'"):
        evaluate("width *", {"width": 64})


def test_formula_over_500_characters_is_refused() -> None:
    with pytest.raises(FormulaError, match="under 500 characters"):
        evaluate("1 + " * 125 + "1", {})


@pytest.mark.parametrize("expression", [True, None, [1], {"a": 1}])
def test_expression_that_is_neither_number_nor_string_is_refused(expression: Any) -> None:
    with pytest.raises(FormulaError):
        evaluate(expression, {})


# Validating a compute model


def test_demo_compute_models_are_valid() -> None:
    assert validate_compute_model(TINY_MOE["compute_model"]) == []
    assert validate_compute_model(MARIN_MOE["compute_model"]) == []
    assert validate_compute_model(NUMERIC_MODEL) == []


@pytest.mark.parametrize("value", [None, [], "6 * N * D", 42])
def test_compute_model_that_is_not_an_object_is_refused(value: Any) -> None:
    assert validate_compute_model(value) == ["the compute model must be a JSON object"]


def test_compute_model_missing_keys_are_named() -> None:
    errors = validate_compute_model({"total_params": 1e9, "accelerator": "GPU"})

    assert errors == [
        "'active_params' is required",
        "'assumed_mfu' is required",
        "'peak_flops_per_accelerator' is required",
        "'tokens' is required",
    ]


def test_compute_model_unknown_key_is_named() -> None:
    assert validate_compute_model(model(price_per_hour=3)) == ["unknown key 'price_per_hour'"]


@pytest.mark.parametrize("mfu", [1.5, 2, 100])
def test_compute_model_mfu_above_one_is_refused(mfu: float) -> None:
    assert validate_compute_model(model(assumed_mfu=mfu)) == [
        "'assumed_mfu' is a fraction of peak and must be at most 1"
    ]


def test_compute_model_mfu_of_exactly_one_is_accepted() -> None:
    assert validate_compute_model(model(assumed_mfu=1)) == []


@pytest.mark.parametrize("key", ["assumed_mfu", "peak_flops_per_accelerator"])
@pytest.mark.parametrize("value", [0, -0.5])
def test_compute_model_rates_must_be_positive(key: str, value: float) -> None:
    assert validate_compute_model(model(**{key: value})) == [f"'{key}' must be positive"]


@pytest.mark.parametrize("value", ["fast", "1e15", True, None, [1e15]])
def test_compute_model_non_numeric_peak_is_refused(value: Any) -> None:
    assert validate_compute_model(model(peak_flops_per_accelerator=value)) == [
        "'peak_flops_per_accelerator' must be a number"
    ]


def test_compute_model_formula_that_does_not_parse_is_refused() -> None:
    assert validate_compute_model(model(tokens="steps * * batch_size")) == [
        "'tokens' is not a valid formula: 'steps * * batch_size'"
    ]


@pytest.mark.parametrize("value", [True, [1], {"a": 1}])
def test_compute_model_sizes_must_be_numbers_or_formulas(value: Any) -> None:
    assert validate_compute_model(model(total_params=value)) == [
        "'total_params' must be a number or a formula"
    ]
