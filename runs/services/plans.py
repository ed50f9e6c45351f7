"""Writes for plans: build (priced, not stored), freeze, launch and cancel. Expansion into
runs and their dispatch are ``runs.services.dispatch``'s, after the launch commits."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from marin_site.events import Verb
from marin_site.nudges import nudge
from runs.executors import is_pull_executor, pool_name
from runs.executors.code import site_checkout
from runs.models import (
    TERMINAL_RUN_STATES,
    Plan,
    PlanEntry,
    PlanLaunch,
    Recipe,
    Run,
    RunEvent,
    RunState,
)
from runs.pools.models import Pool
from runs.services.recipes import (
    allowed_executor_problem,
    executor_problem,
    launch_labels_problem,
)
from runs.specs.ablation import Plan as PlanPreview
from runs.specs.ablation import PlanError, RecipeSpec, build_plan
from runs.validators import allowed_executors


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
        # What one job asks of a scheduler (Iris), as the recipe says it now.
        recipe_snapshot={**preview.recipe.as_snapshot(), "resources": recipe.resources or {}},
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
    actor: User | AnonymousUser | None = None,
) -> PlanLaunch:
    """Ask for a frozen plan to run; asking twice launches it once.

    ``criteria`` (metric, direction, threshold) are what the results are judged against;
    the caller passes them because runs never read proposals. The runs go to ``executor``,
    else to the recipe's, else to the site's default (a pool must exist and may run the
    recipe); one the recipe's ``launch.executors`` lists, when it has that list (then its
    first stands for a default it leaves out). ``git_ref`` is the code version pinned at approval: every job of the plan gets it
    (``RUN_GIT_SHA``), on every executor. The recipe's time limit is taken as it is now. Expansion into runs and their dispatch
    happen in Celery after this commits (and in the reconciler, if that nudge is lost).
    """
    with transaction.atomic():
        recipe = Plan.objects.select_related("recipe").get(pk=plan_id).recipe
        allowed = allowed_executors(recipe.launch)
        default = settings.RUNS_DEFAULT_EXECUTOR
        if allowed and default not in allowed:
            default = allowed[0]  # the recipe's list names where its runs may go
        target = executor or recipe.executor or default
        if executor and (problem := executor_problem(executor=executor, recipe_name=recipe.name)):
            raise ValidationError({"executor": [problem]})
        if problem := allowed_executor_problem(recipe, target):
            raise ValidationError({"executor": [problem]})
        if recipe.requires_labels and (problem := launch_labels_problem(recipe, target)):
            raise ValidationError({"executor": [problem]})
        if actor is not None and (problem := launcher_problem(executor=target, actor=actor)):
            raise ValidationError({"executor": [problem]})
        repository, ref = settings.RUNS_CODE_REPOSITORY, git_ref.strip()[:255]
        if not repository and not ref and is_pull_executor(target):
            # An agent has no code of its own: pin the site's own commit, when it has one.
            repository, ref = site_checkout()
        launch, created = PlanLaunch.objects.get_or_create(
            plan_id=plan_id,
            defaults={
                "criteria": criteria or {},
                "command_template": recipe.command_template,
                "launch_options": dict(recipe.launch or {}),
                "executor": target,
                "max_concurrent_runs": max_concurrent_runs,
                "time_limit_seconds": recipe.time_limit_seconds,
                "requires_labels": list(recipe.requires_labels or []),
                "git_ref": ref,
                "git_repository": repository if ref else "",
            },
        )
        if created:
            nudge("runs.plan_expand", plan_id=plan_id)
        return launch


def launcher_problem(*, executor: str, actor: User | AnonymousUser) -> str:
    """Why ``actor`` may not launch on ``executor`` (its allow-list: ``launchers`` of a pool,
    ``RUNS_EXECUTOR_LAUNCHERS`` of the others), or "" when they may (no list: anyone the
    approval's own permission lets through)."""
    if name := pool_name(executor):
        allowed = list(
            Pool.objects.filter(name=name).values_list("launchers", flat=True).first() or []
        )
    else:
        allowed = list(settings.RUNS_EXECUTOR_LAUNCHERS.get(executor, []))
    username = actor.get_username() if actor.is_authenticated else ""
    if not allowed or username in allowed:
        return ""
    return (
        f"{username or 'an anonymous user'} may not launch on '{executor[:60]}' "
        f"(who may: {', '.join(allowed)})"
    )


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
            RunEvent.build(run_id=pk, actor=user, verb=Verb.CANCEL_REQUESTED, door=door)
            for pk in asked
        ]
        events += [
            RunEvent.build(
                run_id=pk,
                actor=user,
                verb=Verb.KILLED,
                door=door,
                from_state=state,
                to_state=RunState.KILLED,
                message="canceled before it started",
            )
            for pk, state in killed
        ]
        RunEvent.objects.bulk_create(events, batch_size=500)
        if killed:
            nudge("runs.plan_check_finished", plan_id=plan_id)
        if len(killed) < len(live):  # some are running: their executors must stop them
            nudge("runs.plan_stop", plan_id=plan_id)
        return len(asked)


def _chunks(ids: list[int], size: int = 500) -> list[list[int]]:
    return [ids[i : i + size] for i in range(0, len(ids), size)]
