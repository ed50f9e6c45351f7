"""The compute model of a recipe: training FLOPs and accelerator-hours of one run.

A recipe states total and active parameters and tokens per run, each either a number or a
formula over the run's resolved config (``12 * depth * width ** 2``). Formulas are parsed
with ``ast`` and evaluated by a small arithmetic interpreter: names resolve to config
values, nothing else (no calls, attributes or subscripts), so a formula can never run code.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

MAX_FORMULA_LENGTH = 500
COMPUTE_MODEL_KEYS = {
    "total_params",
    "active_params",
    "tokens",
    "peak_flops_per_accelerator",
    "assumed_mfu",
    "accelerator",
    "steady_state_warmup_steps",  # runs.metrics.steady: throughput summaries skip these steps
}
WARMUP_KEY = "steady_state_warmup_steps"
MAX_WARMUP_STEPS = 10**12
REQUIRED_COMPUTE_KEYS = {"active_params", "tokens", "peak_flops_per_accelerator", "assumed_mfu"}

_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[float], float]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_FUNCTIONS: dict[str, Callable[..., float]] = {"min": min, "max": max, "ceil": math.ceil}


class FormulaError(ValueError):
    """A compute-model formula that cannot be parsed or evaluated."""


def _apply(function: Callable[..., Any], args: list[float], node: ast.AST) -> float:
    """One arithmetic step; whatever goes wrong in it (1 / 0, min(), ceil(inf)) is a FormulaError."""
    try:
        result = function(*args)
    except (ArithmeticError, TypeError, ValueError) as exc:
        raise FormulaError(f"'{ast.unparse(node)}': {exc}") from exc
    if isinstance(result, complex):  # a negative number to a fractional power
        raise FormulaError(f"'{ast.unparse(node)}' is not a real number")
    return float(result)


def _evaluate(node: ast.AST, names: Mapping[str, Any]) -> float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, names)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        if isinstance(node.value, bool):
            raise FormulaError("booleans are not numbers in a formula")
        return float(node.value)
    if isinstance(node, ast.Name):
        if node.id not in names:
            raise FormulaError(f"unknown name '{node.id}' (not a key of the config)")
        value = names[node.id]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise FormulaError(f"'{node.id}' is {value!r}, not a number")
        return float(value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left, names), _evaluate(node.right, names)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise FormulaError("exponents above 64 are not allowed")
        return _apply(_BINARY[type(node.op)], [left, right], node)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand, names))
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCTIONS
        and not node.keywords
    ):
        args = [_evaluate(arg, names) for arg in node.args]
        return _apply(_FUNCTIONS[node.func.id], args, node)
    raise FormulaError(f"'{ast.unparse(node)}' is not allowed in a formula")


def evaluate(expression: float | int | str, config: Mapping[str, Any]) -> float:
    """Evaluate a number or a formula over a config's top-level numeric keys."""
    if isinstance(expression, bool):
        raise FormulaError("a boolean is not a number")
    if isinstance(expression, int | float):
        return float(expression)
    if not isinstance(expression, str) or len(expression) > MAX_FORMULA_LENGTH:
        raise FormulaError("a formula must be a number or a string under 500 characters")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise FormulaError(f"cannot parse '{expression}': {exc.msg}") from exc
    result = _evaluate(tree, config)
    if not math.isfinite(result):
        raise FormulaError(f"'{expression}' is {result}, not a finite number")
    return result


def warmup_problems(value: Any) -> list[str]:
    """What is wrong with a declared steady-state warm-up (nothing when fine or absent)."""
    if value is None:
        return []
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_WARMUP_STEPS:
        return [f"'{WARMUP_KEY}' must be a whole number of steps from 0 to {MAX_WARMUP_STEPS}"]
    return []


def validate_compute_model(model: Any) -> list[str]:
    """Return what is wrong with a compute model (an empty list when it is fine)."""
    if not isinstance(model, dict):
        return ["the compute model must be a JSON object"]
    errors = [f"unknown key '{key}'" for key in sorted(set(model) - COMPUTE_MODEL_KEYS)]
    errors += [f"'{key}' is required" for key in sorted(REQUIRED_COMPUTE_KEYS - set(model))]
    for key in ("peak_flops_per_accelerator", "assumed_mfu"):
        value = model.get(key)
        if key in model and (isinstance(value, bool) or not isinstance(value, int | float)):
            errors.append(f"'{key}' must be a number")
        elif key in model and value is not None and value <= 0:
            errors.append(f"'{key}' must be positive")
    mfu = model.get("assumed_mfu")
    if isinstance(mfu, int | float) and not isinstance(mfu, bool) and mfu > 1:
        errors.append("'assumed_mfu' is a fraction of peak and must be at most 1")
    errors += warmup_problems(model.get(WARMUP_KEY))
    for key in ("total_params", "active_params", "tokens"):
        value = model.get(key)
        if value is None:
            continue
        if isinstance(value, str):
            try:
                ast.parse(value, mode="eval")
            except SyntaxError:
                errors.append(f"'{key}' is not a valid formula: {value!r}")
        elif isinstance(value, bool) or not isinstance(value, int | float):
            errors.append(f"'{key}' must be a number or a formula")
    return errors


@dataclass(frozen=True)
class RunCost:
    active_params: float
    total_params: float | None
    tokens: float
    flops: float
    accelerator_hours: float
    formula: str


def run_cost(model: Mapping[str, Any], config: Mapping[str, Any]) -> RunCost:
    """Training FLOPs (6 x active parameters x tokens) and accelerator-hours of one run."""
    active = evaluate(model["active_params"], config)
    tokens = evaluate(model["tokens"], config)
    total = evaluate(model["total_params"], config) if "total_params" in model else None
    flops = 6.0 * active * tokens
    peak = float(model["peak_flops_per_accelerator"])
    mfu = float(model["assumed_mfu"])
    hours = flops / (peak * mfu) / 3600.0
    if not math.isfinite(flops):
        raise FormulaError(f"6 × {active:.3g} × {tokens:.3g} FLOPs is not a finite number")
    formula = (
        f"6 × N_active × D = 6 × {active:.3g} × {tokens:.3g} = {flops:.3g} FLOPs; "
        f"÷ ({peak:.3g} FLOP/s × MFU {mfu:g}) = {hours:.3g} accelerator-hours"
    )
    return RunCost(active, total, tokens, flops, hours, formula)
