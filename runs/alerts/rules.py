"""Which alert rules watch a run: defaults derived from its recipe's metric declarations,
replaced or switched off by stored rules (a recipe's, then the run's own).

Defaults, per declared key:

- a ``lower``-is-better key in ``nats`` or ``bits/byte`` (the losses): a spike rule;
- a ``higher``-is-better throughput key (``tokens/s``, or MFU as a ``percent``/``fraction``):
  a sustained-drop rule, skipping the key's declared warm-up;
- a ``lower``-is-better ``fraction`` (MoE's drop fraction): a sustained-rise rule;

and for every run a silence rule (no heartbeat) and a NaN rule on every key (``*``). A
recipe that declares nothing still gets a spike rule on ``train/loss``.

Rules are read at every metrics batch, so a run's rules are kept a minute in the process
(``rules_forget`` drops them when a rule is saved here; another process sees the change
within that minute).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db.models import Q

from marin_site import fragments
from runs.alerts.models import AlertKind, AlertRule
from runs.metrics import declarations as metric_declarations

ALL_KEYS = "*"

# kind -> parameter -> (type, low, high, default); ``None`` as default: from the declaration.
PARAMETERS: dict[str, dict[str, tuple[type, float, float, Any]]] = {
    AlertKind.SPIKE: {
        "window": (int, 10, 2000, 50),  # points of the rolling median
        "k": (float, 1.0, 1000.0, 6.0),  # robust deviations (1.4826 x MAD) above it to open
        "k_close": (float, 0.0, 1000.0, 3.0),  # ... below which a point counts as calm
        "calm_points": (int, 1, 10_000, 5),  # calm points in a row to close
        "min_points": (int, 5, 2000, 20),  # history needed before judging
    },
    AlertKind.DROP: {
        "fraction": (float, 0.001, 0.999, 0.2),  # opens below (1 - fraction) x baseline
        "recent": (int, 1, 1000, 20),  # points whose median is compared
        "baseline": (int, 5, 5000, 200),  # points before them: the baseline's median
        "calm_points": (int, 1, 10_000, 5),
        "warmup_steps": (int, 0, 10**9, None),
    },
    AlertKind.RISE: {
        "amount": (float, 1e-9, 1e12, 0.05),  # opens above baseline + amount
        "recent": (int, 1, 1000, 20),
        "baseline": (int, 5, 5000, 200),
        "calm_points": (int, 1, 10_000, 5),
        "warmup_steps": (int, 0, 10**9, None),
    },
    AlertKind.SILENCE: {
        "seconds": (int, 10, 7 * 24 * 3600, 120),  # no heartbeat for this long
    },
    AlertKind.NAN: {},
}
KEYED_KINDS = frozenset({AlertKind.SPIKE, AlertKind.DROP, AlertKind.RISE})


@dataclass(frozen=True, slots=True)
class Rule:
    kind: str
    key: str
    params: dict[str, Any] = field(default_factory=dict)


def params_check(*, kind: str, key: str, params: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """A rule's parameters with defaults filled in, and the problems by field name
    (``params.<name>``, ``key``, ``kind``); the problems are empty when it is fine."""
    problems: dict[str, str] = {}
    spec = PARAMETERS.get(kind)
    if spec is None:
        return {}, {"kind": f"must be one of {', '.join(PARAMETERS)}"}
    if kind in KEYED_KINDS and (not key or key == ALL_KEYS):
        problems["key"] = f"a {kind} rule watches one metric key"
    elif kind == AlertKind.SILENCE and key:
        problems["key"] = "a silence rule watches the heartbeat: leave the key blank"
    elif kind == AlertKind.NAN and key not in {"", ALL_KEYS} and not good_key(key):
        problems["key"] = "a metric key, or * for every key"
    elif key and key != ALL_KEYS and not good_key(key):
        problems["key"] = "1-200 characters of letters, digits and _./@:+-"
    if not isinstance(params, dict):
        problems["params"] = "must be an object"
        return {}, problems
    unknown = sorted(set(params) - set(spec))
    if unknown:
        known = ", ".join(spec) or "none"
        problems["params"] = f"unknown parameter(s) {', '.join(unknown)}; known: {known}"
    out: dict[str, Any] = {}
    for name, (kind_of, low, high, default) in spec.items():
        value = params.get(name, default)
        if value is None:
            out[name] = None
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            problems[f"params.{name}"] = f"must be a number from {low:g} to {high:g}"
            continue
        if kind_of is int and not float(value).is_integer():
            problems[f"params.{name}"] = f"must be a whole number from {low:g} to {high:g}"
            continue
        if not (math.isfinite(value) and low <= value <= high):
            problems[f"params.{name}"] = f"must be from {low:g} to {high:g}"
            continue
        out[name] = kind_of(value)
    if kind == AlertKind.SPIKE and not problems:
        if out["k_close"] > out["k"]:
            problems["params.k_close"] = "must be at most k (hysteresis: closing is harder)"
        if out["min_points"] > out["window"]:
            problems["params.min_points"] = "must be at most the window"
    return out, problems


def good_key(key: str) -> bool:
    from runs.metrics.parse import METRIC_KEY

    return bool(METRIC_KEY.match(key))


def rules_default(
    declarations: dict[str, metric_declarations.MetricDeclaration],
) -> dict[tuple[str, str], Rule]:
    """The rules a recipe gets without any stored rule, from its metric declarations."""
    rules: dict[tuple[str, str], Rule] = {}

    def add(kind: str, key: str, **overrides: Any) -> None:
        params, _ = params_check(kind=kind, key=key, params={})
        params.update({k: v for k, v in overrides.items() if v is not None})
        rules[(kind, key)] = Rule(kind, key, params)

    for declaration in declarations.values():
        warmup = declaration.warmup_steps or 0
        if declaration.direction == "lower" and declaration.unit in {"nats", "bits/byte"}:
            add(AlertKind.SPIKE, declaration.key)
        elif declaration.direction == "higher" and declaration.unit in {
            "tokens/s",
            "percent",
            "fraction",
        }:
            add(AlertKind.DROP, declaration.key, warmup_steps=warmup)
        elif declaration.direction == "lower" and declaration.unit == "fraction":
            add(AlertKind.RISE, declaration.key, warmup_steps=warmup)
    if not declarations:
        add(AlertKind.SPIKE, "train/loss")
    add(AlertKind.SILENCE, "")
    add(AlertKind.NAN, ALL_KEYS)
    return rules


# A run's merged rules are kept by this process. With a shared cache they are kept under the
# rules' version (``RULES_VERSION``, replaced after any rule or recipe is written: the table of
# runs/invalidation.py), so an edit holds at every process's next batch; with none (the
# embedded default, one machine) for at most ``_CACHE_SECONDS``.
RULES_VERSION = ("alert-rules", 0)
_CACHE_SECONDS = 5.0
_by_run: dict[int, tuple[float, str, tuple[Rule, ...]]] = {}


def _rules_version() -> str:
    return fragments.version_current(*RULES_VERSION) if settings.SHARED_CACHE else ""


_facts: dict[int, tuple[int, str, str]] = {}


def run_facts(*, run_id: int) -> tuple[int, str, str]:
    """A run's plan id, recipe name and version: they never change, so they are kept. (The
    metrics door loads a run with only what its token check needs.)"""
    facts = _facts.get(run_id)
    if facts is None:
        from runs.models import Run

        facts = Run.objects.values_list("plan_id", "recipe_name", "recipe_version").get(pk=run_id)
        if len(_facts) > 100_000:
            _facts.clear()
        _facts[run_id] = facts
    return facts


def rules_for_run(*, run_id: int) -> tuple[Rule, ...]:
    """The enabled rules of a run: defaults, then its recipe's stored rules, then its own."""
    now = time.monotonic()
    version = _rules_version()
    cached = _by_run.get(run_id)
    if (
        cached is not None
        and cached[1] == version
        and (version or now - cached[0] < _CACHE_SECONDS)
    ):
        return cached[2]
    _plan, recipe_name, recipe_version = run_facts(run_id=run_id)
    merged = rules_default(metric_declarations.declarations_for_run(run_id=run_id))
    stored = sorted(
        AlertRule.objects.filter(
            Q(run_id=run_id) | Q(recipe__name=recipe_name, recipe__version=recipe_version)
        ).values_list("run_id", "kind", "key", "params", "enabled"),
        key=lambda row: row[0] is not None,  # the recipe's first, the run's own last
    )
    for _run, kind, key, params, enabled in stored:
        checked, problems = params_check(kind=kind, key=key, params=params or {})
        if not enabled:
            merged.pop((kind, key), None)
            continue
        if problems:
            continue  # stored before a range changed: the default stays
        default = merged.get((kind, key))
        if default is not None:  # a stored None (warm-up) keeps the declaration's value
            checked = {k: (default.params.get(k) if v is None else v) for k, v in checked.items()}
        merged[(kind, key)] = Rule(kind, key, checked)
    result = tuple(merged.values())
    if len(_by_run) > 10_000:
        _by_run.clear()
    _by_run[run_id] = (now, version, result)
    return result


def rules_forget() -> None:
    """Drop the cache (a rule or a recipe changed; tests)."""
    _by_run.clear()
