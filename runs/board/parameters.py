"""A track's parameters checked by its rule (``TrackRule``): ``parameters_clean``, which checks a track's parameters and says in words what is wrong.
The speedrun rule's parameters are the verdict rule's (``runs.verdicts``); the others are
the board's own, declared with the same ``Param``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runs.board.models import TrackRule
from runs.verdicts.base import Param, Refusal, Rule
from runs.verdicts.gates import MARIN_ALPHA, MARIN_ASYMPTOTE
from runs.verdicts.rules import rule_get

# The board's own parameters for the rules that rank runs against a pinned reference.
_BOARD_PARAMS: dict[str, tuple[Param, ...]] = {
    TrackRule.LOWEST: (),
    TrackRule.EFFECTIVE_SPEEDUP: (
        Param(
            "asymptote", MARIN_ASYMPTOTE, "the pinned irreducible loss L_inf", low=0.0, high=100.0
        ),
        Param("alpha", MARIN_ALPHA, "the fixed exponent", low=0.0, high=3.0, low_open=True),
        Param(
            "baseline_budget",
            None,
            "the baseline's training FLOPs",
            low=0.0,
            high=1e30,
            low_open=True,
        ),
        Param("baseline_loss", None, "the baseline's final loss", low=0.0, high=100.0),
    ),
    TrackRule.PROJECTED_LOSS: (
        Param(
            "asymptote", MARIN_ASYMPTOTE, "the pinned irreducible loss L_inf", low=0.0, high=100.0
        ),
        Param("budget", 1e21, "the budget (FLOPs) projected to", low=0.0, high=1e30, low_open=True),
    ),
}


def parameters_clean(rule: str, given: Any) -> dict[str, Any]:
    """The track's parameters checked by its rule, defaults filled in; raises ``ValueError``
    naming the parameter and what it must be."""
    if given in (None, ""):
        given = {}
    if not isinstance(given, Mapping):
        raise ValueError('the parameters must be a JSON object, e.g. {"threshold": 1.3}')
    if rule not in TrackRule.values:
        raise ValueError(
            f"{str(rule)[:40]!r} is not a rule; the rules are {', '.join(TrackRule.values)}"
        )
    params = _BOARD_PARAMS.get(rule)
    checker = rule_get(rule) if params is None else Rule(rule, 1, rule, params, (), _no_compute)
    missing = [p.name for p in checker.params if p.default is None and p.name not in given]
    if missing:
        raise ValueError(f"{missing[0]}: the rule {rule} needs it (a number)")
    try:
        cleaned = checker.parameters_clean(given)
    except Refusal as refusal:
        raise ValueError(str(refusal)) from refusal
    if rule == TrackRule.EFFECTIVE_SPEEDUP and cleaned["baseline_loss"] <= cleaned["asymptote"]:
        raise ValueError(
            f"baseline_loss: {cleaned['baseline_loss']:g} must be above the asymptote "
            f"{cleaned['asymptote']:g}"
        )
    return cleaned


def _no_compute(params: dict[str, Any], data: Mapping[str, Any]) -> Any:
    raise NotImplementedError  # parameters only: the board computes its own scores
