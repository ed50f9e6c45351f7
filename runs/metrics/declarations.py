"""What a recipe says about its metrics: key, unit, direction, display name, whether it is a
run-table column and a summary row, its warm-up, and the unit the trainer logs it in.

    [{"key": "throughput/mfu", "unit": "percent", "direction": "higher",
      "display": "MFU", "column": true, "summary": true}]

``unit`` is how the key is shown; ``logged_as`` (fraction or percent, for a fraction or
percent key) is how the trainer logs it when that differs. Values are stored as the trainer
logged them, so a corrected declaration re-reads every stored value under the new unit:
``runs.metrics.display`` converts when it shows them, on every page, chart and answer.
Levanter logs ``throughput/mfu`` in percent (``unit: percent``); a trainer logging 0.25 for
25 % declares ``unit: percent, logged_as: fraction``. At ingest (``metrics_ingest``, every
door) a key whose values lie outside the range of the unit it is logged in is stored and
flagged (``runs.metrics.flags``): the declaration may be the mistake.

Declarations are checked against ``DECLARATIONS_SCHEMA`` when a recipe is saved.
``warmup_steps`` is the steady-state warm-up of a throughput key (``runs.metrics.steady``:
its median skips those steps; it overrides the compute model's ``steady_state_warmup_steps``).
Keys a recipe does not declare are kept and shown as logged, under "other metrics".
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any

import jsonschema
from django.core.exceptions import ValidationError
from django.db import connection

from runs.models import Recipe, Run
from runs.specs.compute import MAX_WARMUP_STEPS

UNITS = (
    "",
    "fraction",
    "percent",
    "tokens/s",
    "seconds",
    "tokens",
    "count",
    "flops",
    "bytes",
    "nats",
    "bits/byte",
)
DIRECTIONS = ("lower", "higher", "")
MAX_DECLARATIONS = 200
UNIT_RANGES = {"fraction": (0.0, 1.0), "percent": (0.0, 100.0)}

DECLARATIONS_SCHEMA: dict[str, Any] = {
    "type": "array",
    "maxItems": MAX_DECLARATIONS,
    "items": {
        "type": "object",
        "additionalProperties": False,
        "required": ["key"],
        "properties": {
            "key": {
                "type": "string",
                "pattern": r"^[A-Za-z0-9_][A-Za-z0-9_./@:+-]{0,199}$",
            },
            "unit": {"enum": list(UNITS)},
            "direction": {"enum": list(DIRECTIONS)},
            "display": {"type": "string", "maxLength": 100},
            "column": {"type": "boolean"},
            "summary": {"type": "boolean"},
            "warmup_steps": {"type": "integer", "minimum": 0, "maximum": MAX_WARMUP_STEPS},
            "logged_as": {"enum": ["fraction", "percent"]},
        },
    },
}


@dataclass(frozen=True, slots=True)
class MetricDeclaration:
    key: str
    unit: str = ""
    direction: str = ""
    display: str = ""
    column: bool = False
    summary: bool = True
    warmup_steps: int | None = None  # steady-state keys: runs.metrics.steady skips these steps
    logged_as: str = ""


def declarations_validate(data: Any) -> list[str]:
    """Problems with a recipe's ``metrics`` field, each naming the entry; [] when fine."""
    validator = jsonschema.Draft202012Validator(DECLARATIONS_SCHEMA)
    problems = [
        f"{'/'.join(str(p) for p in error.absolute_path) or 'metrics'}: {error.message}"
        for error in validator.iter_errors(data)
    ]
    if problems:
        return problems[:20]
    keys = [item["key"] for item in data]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        return [f"each key is declared once; repeated: {', '.join(repeated)}"]
    bad_logged = [
        item["key"]
        for item in data
        if item.get("logged_as") and item.get("unit") not in {"fraction", "percent"}
    ]
    if bad_logged:
        return [f"logged_as applies to fraction and percent units only: {', '.join(bad_logged)}"]
    return []


def declarations_parse(data: Any) -> dict[str, MetricDeclaration]:
    """Declarations by key, in declared order; entries that do not check are left out."""
    if not isinstance(data, list) or declarations_validate(data):
        return {}
    return {item["key"]: MetricDeclaration(**item) for item in data}


# --- at ingest ----------------------------------------------------------------------------

_CACHE_SECONDS = 60.0
_by_run: dict[int, tuple[float, dict[str, MetricDeclaration]]] = {}


def declarations_for_run(*, run_id: int) -> dict[str, MetricDeclaration]:
    """The declarations of a run's recipe, kept a minute in this process: every metrics
    batch asks, and a recipe's declarations change rarely."""
    now = time.monotonic()
    cached = _by_run.get(run_id)
    if cached is not None and now - cached[0] < _CACHE_SECONDS:
        return cached[1]
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT r.metrics FROM {Recipe._meta.db_table} r JOIN {Run._meta.db_table} u "  # noqa: S608
            "ON u.recipe_name = r.name AND u.recipe_version = r.version WHERE u.id = %s",
            [run_id],
        )
        row = cursor.fetchone()
    raw = row[0] if row else None
    if isinstance(raw, str):  # SQLite hands JSON back as text through a raw cursor
        raw = json.loads(raw)
    declarations = declarations_parse(raw or [])
    if len(_by_run) > 10_000:
        _by_run.clear()
    _by_run[run_id] = (now, declarations)
    return declarations


def declarations_forget() -> None:
    """Drop the cache (a recipe's declarations changed; tests)."""
    _by_run.clear()


def logged_unit(declaration: MetricDeclaration) -> str:
    """The unit the trainer logs a key in, and its stored values are in."""
    return declaration.logged_as or declaration.unit


def unit_check(*, declaration: MetricDeclaration, steps: list[int], values: list[float]) -> str:
    """A problem with one key's values of a batch ("" when none): a fraction or percent
    key's values must lie in the range of the unit it is logged in. Nothing is converted."""
    unit = logged_unit(declaration)
    bounds = UNIT_RANGES.get(unit)
    if bounds is None or (bounds[0] <= min(values) and max(values) <= bounds[1]):
        return ""
    bad = _first_outside(steps, values, bounds)
    hint = (
        " (declare logged_as: percent if the trainer logs it in percent)"
        if unit == "fraction" and 0.0 <= bad[1] <= 100.0
        else ""
    )
    return (
        f"{declaration.key} is logged as a {unit} ({bounds[0]:g}-{bounds[1]:g}); "
        f"{bad[1]!r} at step {bad[0]} is not{hint}"
    )


def _first_outside(
    steps: list[int], values: list[float], bounds: tuple[float, float]
) -> tuple[int, float]:
    """The lowest step whose value lies outside ``bounds``."""
    outside = [
        (s, v) for s, v in zip(steps, values, strict=True) if not bounds[0] <= v <= bounds[1]
    ]
    return min(outside) if outside else (steps[0], values[0])


def summary_convert(
    *, declarations: dict[str, MetricDeclaration], summary: dict[str, float]
) -> tuple[dict[str, float], list[str]]:
    """A reported summary as logged; values outside their logged unit's range are left out
    and named in the problems."""
    out: dict[str, float] = {}
    problems: list[str] = []
    for key, value in summary.items():
        declaration = declarations.get(key)
        if declaration is None or not math.isfinite(value):
            out[key] = value
            continue
        problem = unit_check(declaration=declaration, steps=[0], values=[value])
        if problem:
            problems.append(problem.replace(" at step 0", ""))
        else:
            out[key] = value
    return out, problems


@dataclass(frozen=True, slots=True)
class UnitMisfit:
    """A key of a batch whose values do not fit the unit it is declared logged in."""

    key: str
    reason: str
    step: int  # the first step (in batch order) whose value does not fit
    value: float
    unit: str
    points: int  # how many of the key's points do not fit


def declarations_misfits(
    *, run_id: int, keys: list[str], steps: list[int], values: list[float]
) -> list[UnitMisfit]:
    """The fraction and percent keys of a batch whose values lie outside their logged
    unit's range: one per key (its points are stored, and flagged by the caller)."""
    declarations = declarations_for_run(run_id=run_id)
    wanted = {k for k, d in declarations.items() if logged_unit(d) in UNIT_RANGES}
    if not wanted:
        return []
    positions: dict[str, list[int]] = {}
    for index, key in enumerate(keys):
        if key in wanted:
            positions.setdefault(key, []).append(index)
    misfits: list[UnitMisfit] = []
    for key, indices in positions.items():
        declaration = declarations[key]
        key_steps = [steps[i] for i in indices]
        key_values = [values[i] for i in indices]
        problem = unit_check(declaration=declaration, steps=key_steps, values=key_values)
        if problem:
            bounds = UNIT_RANGES[logged_unit(declaration)]
            step, value = _first_outside(key_steps, key_values, bounds)
            outside = sum(not bounds[0] <= v <= bounds[1] for v in key_values)
            misfits.append(UnitMisfit(key, problem, step, value, logged_unit(declaration), outside))
    return misfits


def value_fits(declaration: MetricDeclaration | None, low: float, high: float) -> bool:
    """Whether stored values from ``low`` to ``high`` fit a declaration (an undeclared key,
    or one whose unit has no range, fits anything)."""
    if declaration is None:
        return True
    bounds = UNIT_RANGES.get(logged_unit(declaration))
    return bounds is None or (bounds[0] <= low and high <= bounds[1])


def declarations_or_error(data: Any) -> None:
    problems = declarations_validate(data)
    if problems:
        raise ValidationError({"metrics": problems})
