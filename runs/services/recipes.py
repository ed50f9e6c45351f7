"""Writes for recipes: checks, create, edit, load from a file, and their history; and
whether an executor may take a recipe's runs. Business rules live here, not in views or
serializers."""

from __future__ import annotations

from typing import Any

import jsonschema
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import ValidationError
from django.db import transaction

from marin_site.doors import Door
from marin_site.events import Verb
from runs.executors import EXECUTORS, pool_name
from runs.executors.iris import resources_problems
from runs.metrics.declarations import declarations_forget, declarations_validate
from runs.metrics.flags import flags_recheck
from runs.models import Recipe, RecipeEvent
from runs.pools.models import Pool
from runs.pools.services import labels_clean, labels_problem
from runs.specs.ablation import slug_ok, version_ok
from runs.specs.commands import command_store, launch_problems
from runs.specs.compute import FormulaError, run_cost, validate_compute_model
from runs.validators import allowed_executors
from runs.verdicts.rules import declared_rules_problems

RECIPE_FIELDS = (
    "name",
    "version",
    "title",
    "description",
    "command_template",
    "launch",
    "default_config",
    "parameter_schema",
    "compute_model",
    "scales",
    "executor",
    "metrics",
    "time_limit_seconds",
    "requires_labels",
    "verdict_rules",
    "resources",
    "is_active",
)

MAX_TIME_LIMIT_SECONDS = 90 * 24 * 3600  # a two-week run is normal; a quarter is the cap


def recipe_validate(*, data: dict[str, Any]) -> None:
    """Check a recipe's schema, defaults, scales and compute model; raise ValidationError."""
    errors: dict[str, list[str]] = {}
    if "name" in data and not slug_ok(data["name"]):
        errors["name"] = ["must be a slug: lowercase letters, digits and '-', at most 63"]
    if "version" in data and not version_ok(data["version"]):
        errors["version"] = [
            "must be letters, digits, '.', '_' or '-' (at most 32, no '/'): it is part of URLs"
        ]
    schema = data.get("parameter_schema")
    if not isinstance(schema, dict):
        errors["parameter_schema"] = ["must be a JSON object (a JSON Schema)"]
    else:
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as exc:
            errors["parameter_schema"] = [f"is not a valid JSON Schema: {exc.message}"]
        if not isinstance(schema.get("properties"), dict):
            errors.setdefault("parameter_schema", []).append(
                "must declare the overridable parameters under 'properties'"
            )
    default_config = data.get("default_config")
    if not isinstance(default_config, dict):
        errors["default_config"] = ["must be a JSON object"]
    scales = data.get("scales") or {}
    if not isinstance(scales, dict) or not all(
        isinstance(v, dict) and slug_ok(k) for k, v in scales.items()
    ):
        errors["scales"] = ["must map scale names (lowercase, digits, '-') to config overrides"]
    compute_errors = validate_compute_model(data.get("compute_model"))
    if compute_errors:
        errors["compute_model"] = compute_errors
    for name, problems in (
        ("metrics", declarations_validate(data.get("metrics") or [])),
        ("verdict_rules", declared_rules_problems(data.get("verdict_rules") or [])),
    ):
        if problems:
            errors[name] = problems
    for field, messages in launch_problems(
        command=data.get("command_template"),
        launch_data=data.get("launch"),
        default_config=default_config if isinstance(default_config, dict) else {},
    ).items():
        errors.setdefault(field, []).extend(messages)
    requires_labels = _requires_labels(data, errors)
    for field, messages in _where_problems(data, requires_labels).items():
        errors.setdefault(field, []).extend(messages)
    if resource_problems := resources_problems(data.get("resources")):
        errors["resources"] = resource_problems
    time_limit = data.get("time_limit_seconds")
    if time_limit is not None and (
        type(time_limit) is not int or not 60 <= time_limit <= MAX_TIME_LIMIT_SECONDS
    ):
        errors["time_limit_seconds"] = [
            f"must be whole seconds from 60 to {MAX_TIME_LIMIT_SECONDS} (90 days), or empty"
        ]
    if errors:
        raise ValidationError(errors)
    assert isinstance(schema, dict)
    assert isinstance(default_config, dict)
    declared = {k: v for k, v in default_config.items() if k in schema["properties"]}
    validator = jsonschema.Draft202012Validator({**schema, "required": []})
    problems = [
        f"'{'.'.join(map(str, e.absolute_path))}': {e.message}"
        for e in validator.iter_errors(declared)
    ]
    if problems:
        raise ValidationError({"default_config": problems})
    for scale, overrides in {"": {}, **scales}.items():
        try:
            run_cost(data["compute_model"], {**default_config, **overrides})
        except FormulaError as exc:
            where = f" at scale '{scale}'" if scale else ""
            raise ValidationError({"compute_model": [f"{exc}{where}"]}) from exc


def _stored(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` as stored: a command given as a list of arguments kept as its words, and no
    launch options as an empty mapping."""
    stored = dict(data)
    if "command_template" in stored:
        stored["command_template"] = command_store(stored["command_template"])
    if "launch" in stored and stored["launch"] is None:
        stored["launch"] = {}
    return stored


def _requires_labels(data: dict[str, Any], errors: dict[str, list[str]]) -> list[str]:
    """The recipe's ``requires_labels``, checked (a problem goes to ``errors``)."""
    try:
        return labels_clean(data.get("requires_labels"), "requires_labels")
    except ValidationError as exc:
        errors.update(exc.message_dict)
        return []


def recipe_event_record(
    *,
    recipe: Recipe,
    actor: User | AnonymousUser | None,
    verb: Verb,
    door: str,
    message: str = "",
) -> RecipeEvent:
    """A row of the recipe's history: who created or changed it, through which door."""
    user = actor if isinstance(actor, User) and actor.is_authenticated else None
    event = RecipeEvent.build(
        recipe=recipe,
        actor=user,
        actor_label=user.get_username() if user else "",
        verb=verb,
        door=door,
        message=message,
    )
    event.save(force_insert=True)
    return event


@transaction.atomic
def recipe_create(
    *, actor: User | AnonymousUser | None, data: dict[str, Any], door: str = Door.WEB
) -> Recipe:
    recipe_validate(data=data)
    data = _stored(data)
    recipe = Recipe(**{k: v for k, v in data.items() if k in RECIPE_FIELDS})
    recipe.created_by = actor if isinstance(actor, User) else None
    recipe.full_clean()
    recipe.save()
    recipe_event_record(recipe=recipe, actor=actor, verb=Verb.CREATED, door=door)
    return recipe


@transaction.atomic
def recipe_update(
    *,
    recipe: Recipe,
    data: dict[str, Any],
    actor: User | AnonymousUser | None = None,
    door: str = Door.WEB,
) -> Recipe:
    """Edit a recipe in place. Frozen plans keep their own snapshot, so nothing moves under them.

    The change is recorded in the recipe's history (which fields changed, by whom)."""
    merged = {field: getattr(recipe, field) for field in RECIPE_FIELDS} | data
    recipe_validate(data=merged)
    merged = _stored(merged)
    changed = sorted(field for field in RECIPE_FIELDS if getattr(recipe, field) != merged[field])
    for field in RECIPE_FIELDS:
        setattr(recipe, field, merged[field])
    recipe.full_clean()
    recipe.save()
    declarations_forget()
    if "metrics" in changed:  # stored values are read again under the corrected declarations
        flags_recheck(recipe=recipe, door=door)
    if changed:
        recipe_event_record(
            recipe=recipe,
            actor=actor,
            verb=Verb.EDITED,
            door=door,
            message="Changed " + ", ".join(changed),
        )
    return recipe


@transaction.atomic
def recipe_load(*, actor: User | AnonymousUser | None, data: dict[str, Any]) -> tuple[Recipe, str]:
    """Make the recipe ``data`` names (by name and version) be ``data``: a recipe file's fields,
    those it leaves out at their defaults. Says what it did: ``created``, ``updated`` or
    ``unchanged``; loading the same data twice changes nothing."""
    defaults = {field.name: field.get_default() for field in Recipe._meta.concrete_fields}
    wanted = {field: data.get(field, defaults[field]) for field in RECIPE_FIELDS}
    recipe_validate(data=wanted)
    wanted = _stored(wanted)
    recipe = (
        Recipe.objects.select_for_update()
        .filter(name=wanted["name"], version=wanted["version"])
        .first()
    )
    if recipe is None:
        return recipe_create(actor=actor, data=wanted), "created"
    if all(getattr(recipe, field) == wanted[field] for field in RECIPE_FIELDS):
        return recipe, "unchanged"
    return recipe_update(recipe=recipe, data=wanted), "updated"


def _where_problems(data: dict[str, Any], requires_labels: list[str]) -> dict[str, list[str]]:
    """Why the recipe's ``executor`` and its ``launch.executors`` cannot be saved, by field."""
    problems: dict[str, list[str]] = {}
    if problem := executor_problem(
        executor=data.get("executor") or "",
        recipe_name=data.get("name"),
        requires_labels=requires_labels,
    ):
        problems["executor"] = [problem]
    if listed := allowed_executors_problems(data):
        problems["launch"] = listed
    return problems


def allowed_executors_problems(data: dict[str, Any]) -> list[str]:
    """Why a recipe's ``launch.executors`` cannot be saved: a name that is no executor of
    the site, or a recipe ``executor`` outside the list. A pool is named by ``pool:<name>``;
    whether it exists is asked at approval, as for a launch's own choice."""
    allowed = allowed_executors(data.get("launch"))
    problems = [
        f"executors: '{name[:60]}' is no executor; use {', '.join(EXECUTORS)} or pool:<name>"
        for name in allowed
        if name not in EXECUTORS and not pool_name(name)
    ]
    own = data.get("executor") or ""
    if allowed and own and own not in allowed:
        problems.append(
            f"executors: the recipe's own executor '{own[:60]}' is not in the list "
            f"({', '.join(allowed)})"
        )
    return problems


def allowed_executor_problem(recipe: Recipe, executor: str) -> str:
    """Why a launch of ``recipe`` may not go to ``executor`` (not in its ``launch.executors``),
    or "" when it may (no list: any)."""
    allowed = allowed_executors(recipe.launch)
    if not allowed or executor in allowed:
        return ""
    return (
        f"recipe '{recipe.name}' may run only on {', '.join(allowed)} (its launch.executors), "
        f"not on '{executor[:60]}'"
    )


def executor_problem(
    *, executor: str, recipe_name: Any = None, requires_labels: list[str] | None = None
) -> str:
    """Why runs cannot be sent to ``executor`` (for ``recipe_name``, whose runs need a pool
    with ``requires_labels``), or "" when they can. Only pools have labels: a recipe that
    requires some runs on a pool."""
    if not executor:
        return ""
    if executor in EXECUTORS:
        if requires_labels:
            return (
                f"only a pool has labels: runs requiring {', '.join(requires_labels)} "
                f"(requires_labels) cannot go to '{executor}'"
            )
        return ""
    name = pool_name(executor)
    if not name:
        return f"'{executor[:60]}' is no executor; use local, ray, iris or pool:<name>"
    pool = Pool.objects.filter(name=name).first()
    if pool is None:
        return f"there is no pool named '{name}'"
    if pool.retired_at is not None:
        return f"pool '{name}' is retired"
    if isinstance(recipe_name, str) and not pool.may_run(recipe_name):
        return f"pool '{name}' may not run recipe '{recipe_name}'"
    if requires_labels:
        return labels_problem(pool=pool, required=requires_labels, recipe_name=str(recipe_name))
    return ""


def launch_labels_problem(recipe: Recipe, executor: str) -> str:
    """Why a plan of ``recipe`` (which requires pool labels) cannot be launched on
    ``executor``, or "": only a pool with those labels (or with an agent having them) can."""
    name = pool_name(executor)
    if not name:
        return (
            f"recipe '{recipe.name}' requires pool labels ({', '.join(recipe.requires_labels)}: "
            f"requires_labels), so its runs go to a pool having them, not to '{executor[:60]}'"
        )
    pool = Pool.objects.filter(name=name).first()
    if pool is None:
        return f"there is no pool named '{name}'"
    return labels_problem(pool=pool, required=recipe.requires_labels, recipe_name=recipe.name)
