"""Writes for recipes and plans. Business rules live here, not in views or serializers."""

from __future__ import annotations

from typing import Any

import jsonschema
from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from marin_site.doors import Door
from marin_site.events import MESSAGE_MAX
from runs.compute import FormulaError, run_cost, validate_compute_model
from runs.metric_declarations import declarations_forget, declarations_validate
from runs.models import Plan, PlanEntry, PlanLaunch, Recipe, RecipeEvent
from runs.plans import Plan as PlanPreview
from runs.plans import PlanError, RecipeSpec, build_plan, slug_ok, version_ok
from runs.pools.services import labels_clean, labels_problem

RECIPE_FIELDS = (
    "name",
    "version",
    "title",
    "description",
    "command_template",
    "default_config",
    "parameter_schema",
    "compute_model",
    "scales",
    "executor",
    "metrics",
    "time_limit_seconds",
    "requires_labels",
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
    metric_errors = declarations_validate(data.get("metrics") or [])
    if metric_errors:
        errors["metrics"] = metric_errors
    requires_labels = _requires_labels(data, errors)
    if problem := executor_problem(
        executor=data.get("executor") or "",
        recipe_name=data.get("name"),
        requires_labels=requires_labels,
    ):
        errors["executor"] = [problem]
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
    verb: str,
    door: str,
    message: str = "",
) -> RecipeEvent:
    """A row of the recipe's history: who created or changed it, through which door."""
    user = actor if isinstance(actor, User) and actor.is_authenticated else None
    return RecipeEvent.objects.create(
        recipe=recipe,
        actor=user,
        actor_label=user.get_username() if user else "",
        verb=verb,
        door=door,
        message=message[:MESSAGE_MAX],
    )


@transaction.atomic
def recipe_create(
    *, actor: User | AnonymousUser | None, data: dict[str, Any], door: str = Door.WEB
) -> Recipe:
    recipe_validate(data=data)
    recipe = Recipe(**{k: v for k, v in data.items() if k in RECIPE_FIELDS})
    recipe.created_by = actor if isinstance(actor, User) else None
    recipe.full_clean()
    recipe.save()
    recipe_event_record(recipe=recipe, actor=actor, verb="created", door=door)
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
    changed = sorted(field for field in RECIPE_FIELDS if getattr(recipe, field) != merged[field])
    for field in RECIPE_FIELDS:
        setattr(recipe, field, merged[field])
    recipe.full_clean()
    recipe.save()
    declarations_forget()
    if changed:
        recipe_event_record(
            recipe=recipe,
            actor=actor,
            verb="edited",
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


def executor_problem(
    *, executor: str, recipe_name: Any = None, requires_labels: list[str] | None = None
) -> str:
    """Why runs cannot be sent to ``executor`` (for ``recipe_name``, whose runs need a pool
    with ``requires_labels``), or "" when they can. Only pools have labels: a recipe that
    requires some runs on a pool."""
    from runs.executors import EXECUTORS, pool_name
    from runs.pools.models import Pool

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
        return f"'{executor[:60]}' is no executor; use local, ray or pool:<name>"
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
    from runs.executors import pool_name
    from runs.pools.models import Pool

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


def plan_build(
    *,
    recipe: Recipe | RecipeSpec,
    baseline: dict[str, Any],
    spec_text: str,
    budget_accelerator_hours: float | None,
) -> PlanPreview:
    """Expand and price a plan without storing it; errors as a ValidationError by field."""
    spec = recipe.as_spec() if isinstance(recipe, Recipe) else recipe
    try:
        return build_plan(
            recipe=spec,
            baseline=baseline,
            spec_text=spec_text,
            budget_accelerator_hours=budget_accelerator_hours,
        )
    except PlanError as exc:
        raise ValidationError(exc.errors) from exc


@transaction.atomic
def plan_freeze(
    *,
    recipe: Recipe,
    baseline: dict[str, Any],
    spec_text: str,
    budget_accelerator_hours: float | None,
) -> Plan:
    """Store the plan as it stands now; later edits to the recipe do not change it."""
    preview = plan_build(
        recipe=recipe,
        baseline=baseline,
        spec_text=spec_text,
        budget_accelerator_hours=budget_accelerator_hours,
    )
    plan = Plan.objects.create(
        recipe=recipe,
        recipe_snapshot=preview.recipe.as_snapshot(),
        baseline=preview.baseline,
        spec_text=spec_text,
        spec={
            "axes": preview.spec.axes,
            "scales": preview.spec.scales,
            "seeds": preview.spec.seeds,
        },
        budget_accelerator_hours=budget_accelerator_hours,
        run_count=preview.run_count,
        total_flops=preview.total_flops,
        total_accelerator_hours=preview.total_accelerator_hours,
    )
    PlanEntry.objects.bulk_create(
        PlanEntry(
            plan=plan,
            index=point.index,
            scale=point.scale,
            seed=point.seed,
            overrides=point.overrides,
            config=point.config,
            config_hash=point.config_hash,
            is_baseline=point.is_baseline,
            diff=point.diff,
            flops=point.cost.flops,
            accelerator_hours=point.cost.accelerator_hours,
            cost_formula=point.cost.formula,
        )
        for point in preview.points
    )
    return plan


def plan_launch(
    *,
    plan_id: int,
    criteria: dict[str, Any] | None = None,
    executor: str = "",
    max_concurrent_runs: int | None = None,
    git_ref: str = "",
) -> PlanLaunch:
    """Ask for a frozen plan to run; asking twice launches it once.

    ``criteria`` (metric, direction, threshold) are what the results are judged against;
    the caller passes them because runs never read proposals. The runs go to ``executor``,
    else to the recipe's, else to the site's default (a pool must exist and may run the
    recipe). ``git_ref`` is the code version pinned at approval: every job of the plan gets it
    (``RUN_GIT_SHA``), on every executor. The recipe's time limit is taken as it is now. Expansion into runs and their dispatch
    happen in Celery after this commits (and in the reconciler, if that nudge is lost).
    """
    from runs.queue import _nudge

    with transaction.atomic():
        recipe = Plan.objects.select_related("recipe").get(pk=plan_id).recipe
        target = executor or recipe.executor or settings.RUNS_DEFAULT_EXECUTOR
        if executor and (problem := executor_problem(executor=executor, recipe_name=recipe.name)):
            raise ValidationError({"executor": [problem]})
        if recipe.requires_labels and (problem := launch_labels_problem(recipe, target)):
            raise ValidationError({"executor": [problem]})
        launch, created = PlanLaunch.objects.get_or_create(
            plan_id=plan_id,
            defaults={
                "criteria": criteria or {},
                "command_template": recipe.command_template,
                "executor": target,
                "max_concurrent_runs": max_concurrent_runs,
                "time_limit_seconds": recipe.time_limit_seconds,
                "requires_labels": list(recipe.requires_labels or []),
                "git_ref": git_ref.strip()[:255],
            },
        )
        if created:
            _nudge("plan_expand_task", plan_id=plan_id)
        return launch


def plan_cancel(
    *, plan_id: int, actor: User | AnonymousUser | None = None, door: str = "web"
) -> int:
    """Stop a launched plan: nothing more starts, queued (and preempted) runs are killed,
    running ones are marked cancel-requested and their executors asked to stop them by a
    task after commit (and by the reconciler on every pass until they end).

    Set-based, so a plan of a thousand runs is cancelled in a few statements, and atomic
    with the caller's transaction (a proposal's cancel or withdrawal): the plan is never
    left half cancelled. Returns how many runs were asked; canceling twice asks nobody twice.
    """
    from runs.models import TERMINAL_RUN_STATES, Run, RunEvent, RunState
    from runs.queue import _nudge

    with transaction.atomic():
        launch = PlanLaunch.objects.select_for_update().filter(plan_id=plan_id).first()
        if launch is None:
            return 0
        now = timezone.now()
        if launch.canceled_at is None:
            launch.canceled_at = now
            launch.save(update_fields=["canceled_at"])
        live = list(
            Run.objects.select_for_update()
            .filter(plan_id=plan_id)
            .exclude(state__in=TERMINAL_RUN_STATES)
            .order_by("pk")
            .values_list("pk", "state", "cancel_requested_at")
        )
        asked = [pk for pk, _state, requested in live if requested is None]
        killed = [(pk, state) for pk, state, _ in live if state != RunState.RUNNING]
        user = actor if isinstance(actor, User) else None
        for chunk in _chunks(asked):
            Run.objects.filter(pk__in=chunk).update(cancel_requested_at=now, updated_at=now)
        for chunk in _chunks([pk for pk, _state in killed]):
            Run.objects.filter(pk__in=chunk).update(
                state=RunState.KILLED,
                state_reason="canceled before it started",
                failure_kind="",
                finished_at=now,
                updated_at=now,
            )
        events = [
            RunEvent(run_id=pk, actor=user, verb="cancel_requested", door=door) for pk in asked
        ]
        events += [
            RunEvent(
                run_id=pk,
                actor=user,
                verb=RunState.KILLED,
                door=door,
                from_state=state,
                to_state=RunState.KILLED,
                message="canceled before it started",
            )
            for pk, state in killed
        ]
        RunEvent.objects.bulk_create(events, batch_size=500)
        if killed:
            _nudge("plan_check_finished_task", plan_id=plan_id)
        if len(killed) < len(live):  # some are running: their executors must stop them
            _nudge("plan_stop_task", plan_id=plan_id)
        return len(asked)


def _chunks(ids: list[int], size: int = 500) -> list[list[int]]:
    return [ids[i : i + size] for i in range(0, len(ids), size)]
