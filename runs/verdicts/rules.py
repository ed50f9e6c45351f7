"""The registry of verdict rules: each named, versioned, with its declared parameters.

A recipe declares which of these it supports (``verdict_rules`` in its file), a proposal's
preregistration names one with its parameters, and every door (``manage.py verdict_check``,
``POST /api/v1/verdicts/check/``, the proposal page, the result comment) computes through
``verdict_compute`` here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from runs.verdicts.base import Refusal, Rule, Verdict
from runs.verdicts.gates import EFFECTIVE_SPEEDUP_RULE, PINNED_REFIT_RULE
from runs.verdicts.ladder import LADDER_RULE
from runs.verdicts.speedrun import SCALING_RULE, THRESHOLD_RULE

RULES: dict[str, Rule] = {
    rule.name: rule
    for rule in (
        LADDER_RULE,
        EFFECTIVE_SPEEDUP_RULE,
        PINNED_REFIT_RULE,
        THRESHOLD_RULE,
        SCALING_RULE,
    )
}


def rule_get(kind: Any) -> Rule:
    """The rule named ``kind``; refused, naming the known ones, when there is none."""
    if not isinstance(kind, str) or kind not in RULES:
        shown = repr(kind)[:80]
        raise Refusal(
            rule=str(kind)[:80] if isinstance(kind, str) else "?",
            field="rule.kind",
            problem=f"{shown} is not a rule; the rules are {', '.join(sorted(RULES))}",
        )
    return RULES[kind]


def rule_parameters(spec: Any) -> tuple[Rule, dict[str, Any]]:
    """A preregistered rule (``{"kind": ..., <parameters>}``) checked: the rule, and its
    parameters with the defaults filled in. A version other than the rule's is refused."""
    if not isinstance(spec, Mapping):
        raise Refusal(rule="?", field="rule", problem='must be an object with a "kind"')
    rule = rule_get(spec.get("kind"))
    version = spec.get("version", rule.version)
    if version != rule.version:
        raise Refusal(
            rule=rule.name,
            field="rule.version",
            problem=f"{version!r} is not a version of this rule (it is at {rule.version})",
        )
    return rule, rule.parameters_clean(spec)


def verdict_compute(payload: Any) -> Verdict:
    """The verdict of ``{"rule": {...}, <the rule's inputs>}``; raises ``Refusal``."""
    if not isinstance(payload, Mapping):
        raise Refusal(rule="?", field="", problem="the input must be a JSON object")
    rule, params = rule_parameters(payload.get("rule"))
    return verdict_run(rule=rule, params=params, data=payload)


def verdict_run(*, rule: Rule, params: dict[str, Any], data: Mapping[str, Any]) -> Verdict:
    """``rule`` on ``data`` with parameters already checked; raises ``Refusal``, never an
    arithmetic error."""
    try:
        with np.errstate(all="ignore"):
            return rule.compute(params, data)
    except (OverflowError, ZeroDivisionError, FloatingPointError, np.linalg.LinAlgError) as exc:
        # Figures so far apart that the arithmetic leaves the floating-point range: refused
        # in words, never a 500.
        raise Refusal(
            rule=rule.name,
            field="",
            problem=f"the figures are out of the range this arithmetic can carry ({exc})",
        ) from exc


def rules_catalogue() -> list[dict[str, Any]]:
    """Every rule with its parameters (default and range) and inputs: for docs and the API."""
    return [
        {
            "kind": rule.name,
            "version": rule.version,
            "title": rule.title,
            "parameters": [
                {
                    "name": p.name,
                    "default": p.default,
                    "range": p.range_text(),
                    "description": p.description,
                }
                for p in rule.params
            ],
            "inputs": list(rule.inputs),
        }
        for rule in RULES.values()
    ]


def declared_rules_problems(declared: Any) -> list[str]:
    """What is wrong with a recipe's ``verdict_rules`` (a list of ``{kind, <parameters>}``)."""
    if not isinstance(declared, list):
        return ["must be a list of {kind, parameters...}"]
    problems = []
    kinds = []
    for i, spec in enumerate(declared[:32]):
        try:
            rule, _ = rule_parameters(spec)
            kinds.append(rule.name)
        except Refusal as refusal:
            problems.append(f"[{i}]: {refusal}")
    if len(declared) > 32:
        problems.append("at most 32 rules")
    if len(set(kinds)) != len(kinds):
        problems.append("names a rule twice")
    return problems


def preregistered_rule(*, spec: Any, declared: Any) -> dict[str, Any]:
    """A proposal's preregistered rule, checked against what its recipe declares, with every
    parameter written out (the recipe's values, then the rule's defaults, under the
    proposal's own): what is frozen at approval. Raises ``Refusal``."""
    if not isinstance(spec, Mapping):
        raise Refusal(rule="?", field="rule", problem='must be an object with a "kind"')
    rule = rule_get(spec.get("kind"))
    offered = {d.get("kind"): d for d in declared or [] if isinstance(d, Mapping)}
    if offered and rule.name not in offered:
        raise Refusal(
            rule=rule.name,
            field="rule.kind",
            problem=f"the recipe declares only {', '.join(sorted(map(str, offered)))}",
        )
    merged = {**offered.get(rule.name, {}), **spec}
    _, params = rule_parameters(merged)
    return {"kind": rule.name, "version": rule.version, **params}
