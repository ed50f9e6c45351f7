"""What every verdict rule is made of: its declared parameters (with their ranges), the
inputs it reads, the refusal it raises, and the verdict it returns with its arithmetic.

A rule is a pure function over numbers: no database, no Django (an import-linter contract
in pyproject.toml holds this module, ``gates`` and ``speedrun`` to it). Refusals name the
field and the rule in words, so every door (the command, the API, the pages) can show them
as they are.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# A refit, a fit or a list of scales is refused past this many points: a plan has at most
# 1024 runs (docs/results.md), a verdict never reads more.
MAX_POINTS = 1024


class Refusal(ValueError):
    """The input cannot give a verdict under this rule; ``field`` says where, in words."""

    def __init__(self, *, rule: str, field: str, problem: str) -> None:
        self.rule = rule
        self.field = field
        self.problem = problem
        super().__init__(
            f"{field}: {problem} (rule {rule})" if field else f"{problem} (rule {rule})"
        )

    def as_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "field": self.field, "detail": str(self)}


@dataclass(frozen=True)
class Param:
    """One declared parameter: a number in ``[low, high]`` (bounds included unless said),
    or a list of such numbers (``many``), or one of ``choices``."""

    name: str
    default: Any
    description: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    many: bool = False
    choices: tuple[str, ...] = ()
    max_items: int = 16
    integer: bool = False

    def range_text(self) -> str:
        if self.choices:
            return "one of " + ", ".join(self.choices)
        left = "(" if self.low_open else "["
        low = "-inf" if self.low is None else f"{self.low:g}"
        high = "inf" if self.high is None else f"{self.high:g}"
        kind = "whole number" if self.integer else "number"
        shape = f"a list of {kind}s, each in " if self.many else f"a {kind} in "
        return f"{shape}{left}{low}, {high}]"

    def _number(self, value: Any, *, rule: str, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Refusal(rule=rule, field=where, problem=f"must be {self.range_text()}")
        number = float(value)
        if not math.isfinite(number):
            raise Refusal(rule=rule, field=where, problem="must be a finite number")
        if self.integer and not number.is_integer():
            raise Refusal(rule=rule, field=where, problem=f"must be {self.range_text()}")
        too_low = self.low is not None and (
            number <= self.low if self.low_open else number < self.low
        )
        too_high = self.high is not None and number > self.high
        if too_low or too_high:
            raise Refusal(
                rule=rule, field=where, problem=f"{number:g} is outside {self.range_text()}"
            )
        return number

    def clean(self, value: Any, *, rule: str) -> Any:
        where = f"rule.{self.name}"
        if self.choices:
            if value not in self.choices:
                raise Refusal(rule=rule, field=where, problem=f"must be {self.range_text()}")
            return value
        if self.many:
            if not isinstance(value, list) or not value or len(value) > self.max_items:
                raise Refusal(
                    rule=rule,
                    field=where,
                    problem=f"must be a list of 1 to {self.max_items} numbers",
                )
            return [
                self._number(item, rule=rule, where=f"{where}[{i}]") for i, item in enumerate(value)
            ]
        return self._number(value, rule=rule, where=where)


@dataclass
class Verdict:
    """A rule's answer: ``result`` in the shape its door promises, ``steps`` the arithmetic in
    words (one line each), ``inputs`` what was read, ``passed`` when the rule decides."""

    rule: str
    version: int
    parameters: dict[str, Any]
    result: dict[str, Any]
    steps: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    passed: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "version": self.version,
            "parameters": self.parameters,
            "inputs": list(self.inputs),
            "steps": list(self.steps),
            "result": self.result,
            "passed": self.passed,
        }


@dataclass(frozen=True)
class Rule:
    """A named, versioned rule: its parameters, the inputs it reads (``inputs``, in words, for
    the docs and the pages) and ``compute(params, data) -> Verdict``."""

    name: str
    version: int
    title: str
    params: tuple[Param, ...]
    inputs: tuple[str, ...]
    compute: Callable[[dict[str, Any], Mapping[str, Any]], Verdict]

    def parameters_clean(self, given: Mapping[str, Any] | None) -> dict[str, Any]:
        """The declared parameters from ``given`` (defaults for the missing), each in range;
        an undeclared name is refused, never ignored."""
        given = dict(given or {})
        given.pop("kind", None)
        given.pop("version", None)
        known = {p.name for p in self.params}
        unknown = sorted(set(given) - known)
        if unknown:
            declared = ", ".join(sorted(known)) or "none"
            raise Refusal(
                rule=self.name,
                field=f"rule.{unknown[0]}",
                problem=f"is not a parameter of this rule (declared: {declared})",
            )
        return {p.name: p.clean(given.get(p.name, p.default), rule=self.name) for p in self.params}

    def run(self, given: Mapping[str, Any] | None, data: Mapping[str, Any]) -> Verdict:
        return self.compute(self.parameters_clean(given), data)


# --- reading inputs: every refusal names the field -------------------------------------------


def number_at(
    data: Mapping[str, Any],
    key: str,
    *,
    rule: str,
    where: str,
    positive: bool = False,
    above: float | None = None,
    above_what: str = "",
) -> float:
    """``data[key]`` as a finite number; refused when missing, not a number, not positive
    (``positive``) or not above ``above`` (the asymptote)."""
    field_name = f"{where}.{key}" if where else key
    if key not in data or data[key] is None:
        raise Refusal(rule=rule, field=field_name, problem="is missing")
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Refusal(rule=rule, field=field_name, problem="must be a number")
    number = float(value)
    if not math.isfinite(number):
        raise Refusal(rule=rule, field=field_name, problem="must be a finite number")
    if positive and number <= 0:
        raise Refusal(rule=rule, field=field_name, problem=f"must be above zero (got {number:g})")
    if above is not None and number <= above:
        raise Refusal(
            rule=rule,
            field=field_name,
            problem=f"{number:g} is at or below {above_what} {above:g}: the law never reaches it",
        )
    return number


def list_at(data: Mapping[str, Any], key: str, *, rule: str, minimum: int = 1) -> Sequence[Any]:
    value = data.get(key) if isinstance(data, Mapping) else None
    if not isinstance(value, list):
        raise Refusal(rule=rule, field=key, problem="must be a list")
    if len(value) > MAX_POINTS:
        raise Refusal(rule=rule, field=key, problem=f"has more than {MAX_POINTS} items")
    if len(value) < minimum:
        raise Refusal(
            rule=rule,
            field=key,
            problem=f"has {len(value)} item(s); this rule needs at least {minimum}",
        )
    for i, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise Refusal(rule=rule, field=f"{key}[{i}]", problem="must be an object")
    return value


def mapping_at(data: Mapping[str, Any], key: str, *, rule: str, where: str) -> Mapping[str, Any]:
    value = data.get(key)
    if not isinstance(value, Mapping):
        raise Refusal(rule=rule, field=f"{where}.{key}", problem="must be an object")
    return value


def name_at(data: Mapping[str, Any], *, rule: str, where: str, fallback: str) -> str:
    value = data.get("name", fallback)
    if not isinstance(value, str) or not value or len(value) > 200:
        raise Refusal(
            rule=rule, field=f"{where}.name", problem="must be text of 1 to 200 characters"
        )
    return value


def g(value: float, digits: int = 6) -> str:
    """A number in the arithmetic lines: six significant digits (``3.82e+17``, ``1.12995``)."""
    return f"{value:.{digits}g}"
