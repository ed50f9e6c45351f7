"""Ablation specs and plans: parse a YAML spec, expand it, price every run.

Pure functions, no database: the web form, the API and approval all call
``build_plan`` and get the same answer, the same errors and the same hashes.

A spec is a YAML mapping with three optional keys::

    axes:                 # parameter -> list of values; the cartesian product is the grid
      capacity_factor: [1.0, 1.25]
    scales: [small, medium]   # names of the recipe's scales: the grid at each model size
    seeds: [0, 1]

Each run's config is the recipe default, deep-merged with the baseline overrides, the
scale's overrides, the grid point's overrides and the seed, in that order. The baseline
itself (at every scale and seed) is part of the plan, so results can be compared with it.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import hashlib
import itertools
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import yaml

from marin_site.untrusted import untrusted_problem
from runs.specs.compute import FormulaError, RunCost, run_cost

MAX_SPEC_BYTES = 64 * 1024
SLUG_PATTERN = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
MAX_RUNS = 1024
MAX_SEED = 2**31 - 1
MAX_YAML_DEPTH = 32
SPEC_KEYS = ("axes", "scales", "seeds")


class PlanError(ValueError):
    """A spec, baseline or override that cannot become a plan; ``errors`` says where."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{k}: {m}" for k, msgs in errors.items() for m in msgs))


@dataclass(frozen=True)
class RecipeSpec:
    """What a plan needs to know of a recipe (a model row or a frozen snapshot)."""

    name: str
    version: str
    default_config: dict[str, Any]
    parameter_schema: dict[str, Any]
    compute_model: dict[str, Any]
    scales: dict[str, dict[str, Any]] = field(default_factory=dict)

    def as_snapshot(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "default_config": self.default_config,
            "parameter_schema": self.parameter_schema,
            "compute_model": self.compute_model,
            "scales": self.scales,
        }


@dataclass(frozen=True)
class Spec:
    axes: dict[str, list[Any]]
    scales: list[str]
    seeds: list[int]

    @property
    def grid_size(self) -> int:
        return math.prod(len(values) for values in self.axes.values()) if self.axes else 1


@dataclass(frozen=True)
class PlanPoint:
    index: int
    scale: str
    seed: int | None
    overrides: dict[str, Any]
    config: dict[str, Any]
    config_hash: str
    is_baseline: bool
    diff: dict[str, dict[str, Any]]
    cost: RunCost


@dataclass(frozen=True)
class Plan:
    recipe: RecipeSpec
    baseline: dict[str, Any]
    spec: Spec
    points: list[PlanPoint]
    budget_accelerator_hours: float | None

    @property
    def run_count(self) -> int:
        return len(self.points)

    @property
    def total_flops(self) -> float:
        return sum(point.cost.flops for point in self.points)

    @property
    def total_accelerator_hours(self) -> float:
        return sum(point.cost.accelerator_hours for point in self.points)

    @property
    def over_budget(self) -> bool:
        budget = self.budget_accelerator_hours
        return budget is not None and self.total_accelerator_hours > budget

    @property
    def axis_names(self) -> list[str]:
        return list(self.spec.axes)


VERSION_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,31}$")


def version_ok(value: object) -> bool:
    return isinstance(value, str) and bool(VERSION_PATTERN.match(value))


def slug_ok(value: object) -> bool:
    return isinstance(value, str) and bool(SLUG_PATTERN.match(value))


def canonical_json(value: Any) -> str:
    """JSON with sorted keys, no spaces, and integral floats written as integers."""
    return json.dumps(_canonical(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _canonical(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    return value


def config_hash(config: Mapping[str, Any]) -> str:
    """The stable identity of a resolved config: SHA-256 of its canonical JSON."""
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()


def deep_merge(base: Mapping[str, Any], *overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Merge mappings left to right; nested mappings merge, everything else replaces."""
    result: dict[str, Any] = copy.deepcopy(dict(base))
    for override in overrides:
        for key, value in override.items():
            if isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
                result[key] = deep_merge(result[key], value)
            else:
                result[key] = copy.deepcopy(value)
    return result


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{path}."))
        else:
            flat[path] = value
    return flat


def config_diff(baseline: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, dict]:
    """Only the keys that differ: ``{"a.b": {"baseline": 1, "value": 2}}``."""
    old, new = flatten(baseline), flatten(config)
    return {
        key: {"baseline": old.get(key), "value": new.get(key)}
        for key in sorted(set(old) | set(new))
        if not _same(old.get(key), new.get(key))
    }


def _same(a: Any, b: Any) -> bool:
    """Equal as canonical JSON (so 1 and 1.0 are the same); scalars of one type compare fast."""
    if type(a) is type(b) and isinstance(a, str | int | float | bool | None):
        return bool(a == b)
    return canonical_json(a) == canonical_json(b)


class _NoAliasLoader(yaml.SafeLoader):
    """A safe loader for specs: anchors and aliases are refused before loading (no
    billion-laughs expansion), dates stay strings so every value is plain JSON, and a key
    written twice in one mapping is an error (YAML says keys are unique; "last wins" would
    silently drop a value the author wrote)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError as exc:  # an unhashable key, e.g. a list
                raise yaml.constructor.ConstructorError(
                    None, None, "a mapping key must be a plain value", key_node.start_mark
                ) from exc
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} appears twice", key_node.start_mark
                )
        return super().construct_mapping(node, deep=deep)


_NoAliasLoader.add_constructor(
    "tag:yaml.org,2002:timestamp",
    lambda loader, node: loader.construct_scalar(node),  # type: ignore[arg-type]
)


_OPENING_TOKENS = (
    yaml.BlockSequenceStartToken,
    yaml.BlockMappingStartToken,
    yaml.FlowSequenceStartToken,
    yaml.FlowMappingStartToken,
)
_CLOSING_TOKENS = (yaml.BlockEndToken, yaml.FlowSequenceEndToken, yaml.FlowMappingEndToken)


def _load_yaml(text: str, field_name: str) -> Any:
    if len(text.encode()) > MAX_SPEC_BYTES:
        raise PlanError({field_name: [f"is {len(text.encode())} bytes; the limit is 64 KiB"]})
    try:
        depth = 0
        for token in yaml.scan(text, Loader=_NoAliasLoader):
            if isinstance(token, yaml.AnchorToken | yaml.AliasToken):
                mark = token.start_mark
                raise PlanError(
                    {field_name: [f"line {mark.line + 1}: anchors and aliases are not allowed"]}
                )
            # Deep nesting makes PyYAML's scanner quadratic and its composer recurse
            # past Python's limit: stop at the first level no spec needs.
            depth += isinstance(token, _OPENING_TOKENS) - isinstance(token, _CLOSING_TOKENS)
            if depth > MAX_YAML_DEPTH:
                line = token.start_mark.line + 1
                message = f"line {line}: nested deeper than {MAX_YAML_DEPTH} levels"
                raise PlanError({field_name: [message]})
        data = yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        raise PlanError({field_name: [f"is not valid YAML: {exc}"]}) from exc
    except (ValueError, KeyError, TypeError, OverflowError) as exc:
        # A tag applied to a value it cannot read (`!!bool maybe`, `!!int x`), or an
        # integer of thousands of digits: PyYAML raises these outside its own errors.
        raise PlanError({field_name: [f"has a value YAML cannot read: {exc!s:.200}"]}) from exc
    problem = untrusted_problem(data)
    if problem:
        raise PlanError({field_name: [problem]})
    return data


def parse_spec(text: str) -> Spec:
    """Parse and shape-check an ablation spec; parameter names are checked later."""
    if not text or not text.strip():
        return Spec(axes={}, scales=[], seeds=[])
    data = _load_yaml(text, "ablation_spec")
    if data is None:
        return Spec(axes={}, scales=[], seeds=[])
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise PlanError({"ablation_spec": [f"must be a mapping with keys {SPEC_KEYS}, not {kind}"]})
    errors: list[str] = []
    for key in data:
        if key not in SPEC_KEYS:
            errors.append(f"unknown top-level key '{key}' (allowed: {', '.join(SPEC_KEYS)})")
    axes = {} if data.get("axes") is None else data["axes"]
    if not isinstance(axes, dict):
        errors.append("'axes' must map parameter names to lists of values")
        axes = {}
    for name, values in axes.items():
        if not isinstance(name, str):
            errors.append(f"axes: parameter name {name!r} must be a string")
        elif not isinstance(values, list) or not values:
            errors.append(f"axes.{name}: must be a non-empty list of values")
    scales = [] if data.get("scales") is None else data["scales"]
    if not isinstance(scales, list) or not all(isinstance(s, str) for s in scales):
        errors.append("'scales' must be a list of scale names")
        scales = []
    seeds = [] if data.get("seeds") is None else data["seeds"]
    if not isinstance(seeds, list) or not all(
        isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= MAX_SEED for s in seeds
    ):
        errors.append(f"'seeds' must be a list of integers from 0 to {MAX_SEED}")
        seeds = []
    if errors:
        raise PlanError({"ablation_spec": errors})
    spec = Spec(
        axes={name: list(values) for name, values in axes.items()},
        scales=list(dict.fromkeys(scales)),
        seeds=list(dict.fromkeys(seeds)),
    )
    count = spec.grid_size * max(1, len(spec.scales)) * max(1, len(spec.seeds))
    if count > MAX_RUNS:
        raise PlanError(
            {"ablation_spec": [f"expands to {count} runs; the limit is {MAX_RUNS} per plan"]}
        )
    return spec


def parse_overrides(text: str, field_name: str = "baseline") -> dict[str, Any]:
    """Parse baseline overrides written as YAML or JSON (a mapping, possibly empty)."""
    if not text or not text.strip():
        return {}
    data = _load_yaml(text, field_name)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise PlanError({field_name: ["must be a mapping of parameter names to values"]})
    return data


def _schema_errors(recipe: RecipeSpec, overrides: Mapping[str, Any], where: str) -> list[str]:
    declared = list((recipe.parameter_schema.get("properties") or {}).keys())
    errors = []
    for name in overrides:
        if name not in declared:
            hint = difflib.get_close_matches(str(name), declared, n=1)
            suggestion = f"; did you mean '{hint[0]}'?" if hint else ""
            errors.append(
                f"{where}: unknown parameter '{name}': recipe {recipe.name} v{recipe.version} "
                f"declares {', '.join(declared) or 'no parameters'}{suggestion}"
            )
    if errors:
        return errors
    errors = [
        f"{where}: parameter '{name}': NaN and infinity are not allowed"
        for name, value in overrides.items()
        if not _finite(value)
    ]
    schema = {k: v for k, v in recipe.parameter_schema.items() if k != "required"}
    validator = jsonschema.Draft202012Validator(schema)
    for error in sorted(validator.iter_errors(dict(overrides)), key=lambda e: list(e.path)):
        path = ".".join(str(part) for part in error.absolute_path) or "(value)"
        errors.append(f"{where}: parameter '{path}': {error.message}")
    return errors


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, Mapping):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_finite(v) for v in value)
    return True


def check_overrides(recipe: RecipeSpec, overrides: Mapping[str, Any], field_name: str) -> None:
    errors = _schema_errors(recipe, overrides, field_name)
    if errors:
        raise PlanError({field_name: errors})


def _points(spec: Spec) -> Iterable[dict[str, Any]]:
    names = list(spec.axes)
    for values in itertools.product(*(spec.axes[name] for name in names)):
        yield dict(zip(names, values, strict=True))


def build_plan(
    *,
    recipe: RecipeSpec,
    baseline: Mapping[str, Any],
    spec_text: str,
    budget_accelerator_hours: float | None = None,
) -> Plan:
    """Validate everything and expand the spec into priced, deduplicated plan points."""
    errors: dict[str, list[str]] = {}
    try:
        check_overrides(recipe, baseline, "baseline")
    except PlanError as exc:
        errors.update(exc.errors)
    try:
        spec = parse_spec(spec_text)
    except PlanError as exc:
        raise PlanError({**errors, **exc.errors}) from exc
    spec_errors: list[str] = []
    for name, values in spec.axes.items():
        for value in values:
            spec_errors += _schema_errors(recipe, {name: value}, f"axes.{name}")
            if spec_errors and spec_errors[-1].startswith(f"axes.{name}: unknown"):
                break
    unknown_scales = [s for s in spec.scales if s not in recipe.scales]
    if unknown_scales:
        spec_errors.append(
            f"unknown scale(s) {', '.join(unknown_scales)}: recipe {recipe.name} defines "
            f"{', '.join(recipe.scales) or 'no scales'}"
        )
    if spec_errors:
        errors["ablation_spec"] = list(dict.fromkeys(spec_errors))
    if errors:
        raise PlanError(errors)

    points: list[PlanPoint] = []
    seen: dict[str, int] = {}
    for scale in spec.scales or [""]:
        scale_overrides = recipe.scales.get(scale, {}) if scale else {}
        seeds: list[int | None] = list(spec.seeds) or [None]
        for seed in seeds:
            seed_override = {} if seed is None else {"seed": seed}
            base_config = deep_merge(
                recipe.default_config, baseline, scale_overrides, seed_override
            )
            base_hash = config_hash(base_config)
            grid: list[tuple[dict[str, Any], dict[str, Any]]] = [({}, base_config)] + [
                (point, deep_merge(base_config, point, seed_override))  # the seed wins
                for point in _points(spec)
            ]
            for overrides, config in grid:
                digest = config_hash(config)
                if digest in seen:
                    earlier = points[seen[digest]]
                    if overrides and not earlier.overrides:  # name the grid point it equals
                        points[seen[digest]] = dataclasses.replace(earlier, overrides=overrides)
                    continue
                try:
                    cost = run_cost(recipe.compute_model, config)
                except FormulaError as exc:
                    raise PlanError({"recipe": [f"compute model: {exc}"]}) from exc
                seen[digest] = len(points)
                points.append(
                    PlanPoint(
                        index=len(points),
                        scale=scale,
                        seed=seed,
                        overrides=overrides,
                        config=config,
                        config_hash=digest,
                        is_baseline=digest == base_hash,
                        diff=config_diff(base_config, config),
                        cost=cost,
                    )
                )
    if len(points) > MAX_RUNS:
        raise PlanError(
            {"ablation_spec": [f"expands to {len(points)} runs; the limit is {MAX_RUNS} per plan"]}
        )
    return Plan(
        recipe=recipe,
        baseline=dict(baseline),
        spec=spec,
        points=points,
        budget_accelerator_hours=budget_accelerator_hours,
    )
