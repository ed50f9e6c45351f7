"""A demo campaign for ``seed_demo``: three attempts of a MoE run (two restarts), a few
thousand steps of synthetic but plausible metrics, two interventions (new attention
kernels, then a data mix change) and the mixture weights changing with the second; and the
ladder that predicted it (the recipe's three scales, finished, with final losses read off the
same synthetic law plus noise), so its page shows the projection with the live curve.

The runs are rows of one frozen plan of the given recipe (the restarts are its entry's
next ``sequence``); the points go through ``metrics_ingest``, as a runner's would.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from runs.campaigns import services as campaign_services
from runs.campaigns.models import Campaign, InterventionKind, Phase
from runs.executors.external import EXTERNAL
from runs.executors.external import PREFIX as EXTERNAL_PREFIX
from runs.metrics.ingest import metrics_ingest
from runs.metrics.parse import PointBatch
from runs.models import MetricSummary, Plan, PlanLaunch, Recipe, Run, RunOrigin, RunState
from runs.series.rollup import series_refresh
from runs.services import dispatch, plans

SLUG = "moe-535b-demo"
STEPS = 4000
TOKENS_PER_STEP = 4_194_304  # 1024 sequences of 4096 tokens
FLOPS_PER_TOKEN = 6 * 23e9  # 6 x active parameters
ATTEMPTS = (
    (0, 1500, RunState.CRASHED),
    (1400, 2900, RunState.CRASHED),
    (2850, STEPS, RunState.RUNNING),
)
KERNEL_STEP = 1800
MIX_STEP = 3000
MIX_BEFORE = {"web": 0.6, "code": 0.25, "math": 0.15}
MIX_AFTER = {"web": 0.45, "code": 0.3, "math": 0.25}
DEMO_WHERE = "Marin's TPU v5p pods (a demo: no process reports for it, so it goes quiet)"
DESCRIPTION = """A demo of a long **mixture-of-experts** run trained in public: 23B active of
535B parameters. Its attempts are stitched into one curve by tokens seen; the interventions
below are measured from the data, not typed.
"""


def _curves(steps: np.ndarray, attempt: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    tokens = steps.astype(np.float64) * TOKENS_PER_STEP
    fast = steps >= KERNEL_STEP
    mixed = steps >= MIX_STEP
    n = len(steps)
    loss = 1.9 + 9.0 * (1 + steps / 60.0) ** -0.45 + rng.normal(0, 0.02, n) + 0.01 * attempt
    mfu = np.where(fast, 0.27, 0.21) + rng.normal(0, 0.006, n)
    out = {
        "train/loss": loss,
        "throughput/total_tokens": tokens,
        "throughput/mfu": 100 * np.clip(mfu, 0, 1),  # in percent, as Levanter logs it
        "throughput/tokens_per_second": mfu * 512 * 459e12 / FLOPS_PER_TOKEN,
        "moe/drop_fraction": np.clip(
            np.where(fast, 0.002, 0.04 * np.exp(-steps / 3000)) + rng.normal(0, 0.001, n), 0, 1
        ),
        "optim/grad_norm": 0.3 + 2.0 * np.exp(-steps / 300) + np.abs(rng.normal(0, 0.05, n)),
    }
    for source, before in MIX_BEFORE.items():
        out[f"mixture/weight/{source}"] = np.where(mixed, MIX_AFTER[source], before)
    return out


def _loss_at_flops(flops: float) -> float:
    """The demo's loss curve as a function of training FLOPs (its steps at its batch)."""
    steps = flops / (TOKENS_PER_STEP * FLOPS_PER_TOKEN)
    return 1.9 + 9.0 * (1 + steps / 60.0) ** -0.45


def _ladder_seed(recipe: Recipe) -> Plan | None:
    """A finished ladder of the recipe's scales (None when it has fewer than two)."""
    scales = list(recipe.scales or {})
    if len(scales) < 2:
        return None
    plan = plans.plan_freeze(
        recipe=recipe,
        baseline={"data_mix": MIX_BEFORE},  # the campaign's first mix (and no cached run)
        spec_text=f"scales: [{', '.join(scales)}]\n",
        budget_accelerator_hours=None,
    )
    PlanLaunch.objects.create(
        plan=plan,
        executor="local",
        command_template="true",
        criteria={"metric": "eval/loss", "direction": "lower", "threshold": 0.01},
    )
    dispatch.plan_expand(plan_id=plan.pk)
    rng = np.random.default_rng(11)
    now = timezone.now()
    for run in Run.objects.filter(plan=plan).select_related("entry"):
        loss = _loss_at_flops(run.entry.flops) * float(np.exp(rng.normal(0, 0.01)))
        MetricSummary.objects.create(
            run=run, key="eval/loss", last=loss, min=loss, max=loss, step=1000
        )
        Run.objects.filter(pk=run.pk).update(
            state=RunState.FINISHED, started_at=now - dt.timedelta(days=7), finished_at=now
        )
    return plan


def _write(run: Run, first: int, last: int, attempt: int) -> None:
    rng = np.random.default_rng(attempt + 7)
    steps = np.arange(first, last)
    curves = _curves(steps, attempt, rng)
    keys, step_list, values = [], [], []
    for key, column in curves.items():
        keys += [key] * len(steps)
        step_list += steps.tolist()
        values += column.tolist()
    evals = steps[steps % 200 == 0]
    keys += ["eval/loss"] * len(evals)
    step_list += evals.tolist()
    values += (_curves(evals, attempt, rng)["train/loss"] + 0.05).tolist()
    batch = PointBatch(keys, step_list, values, [None] * len(keys))
    metrics_ingest(run=run, batch=batch, require_running=False)
    series_refresh(run_id=run.pk)


@transaction.atomic
def demo_campaign_seed(*, actor: Any, recipe: Recipe) -> Campaign | None:
    """Create the demo campaign once; None when it is already there."""
    if Campaign.objects.filter(slug=SLUG).exists():
        return None
    # A config of its own: a plan of the recipe's defaults could reuse (cache) a demo
    # proposal's run, and the campaign would then show that run's points as its first attempt.
    plan = plans.plan_freeze(
        recipe=recipe,
        baseline={"data_mix": MIX_BEFORE, "tokens_b": round(10_000 * TOKENS_PER_STEP / 1e9, 3)},
        spec_text="",
        budget_accelerator_hours=None,
    )
    PlanLaunch.objects.create(plan=plan, executor="local", command_template="true")
    dispatch.plan_expand(plan_id=plan.pk)
    first = Run.objects.filter(plan=plan).order_by("pk").first()
    assert first is not None
    ladder = _ladder_seed(recipe)
    links = [{"label": "The recipe", "url": recipe.get_absolute_url()}]
    if ladder is not None:
        links.append(
            {"label": "The ladder's runs", "url": reverse("plan-run-table", args=[ladder.pk])}
        )
    campaign = campaign_services.campaign_create(
        actor=actor,
        data={
            "slug": SLUG,
            "name": "535B-A23B (demo)",
            "description": DESCRIPTION,
            "target_tokens": 10_000 * TOKENS_PER_STEP,
            "target_flops": 10_000 * TOKENS_PER_STEP * FLOPS_PER_TOKEN,
            "hardware": "512 accelerators of 459 TFLOP/s (demo)",
            "recipe_config": recipe.default_config,
            "telemetry_keys": ["optim/grad_norm"],
            "links": links,
            "ladder_plan": ladder,
        },
    )
    now = timezone.now()
    for attempt, (start, stop, state) in enumerate(ATTEMPTS):
        if attempt == 0:
            run = first
        else:
            run = Run.objects.create(
                plan=plan,
                entry=first.entry,
                sequence=attempt,
                recipe_name=first.recipe_name,
                recipe_version=first.recipe_version,
                config=first.config,
                config_hash=first.config_hash,
                executor=first.executor,  # every run has a known executor, the demo's too
            )
        _write(run, start, stop, attempt)
        Run.objects.filter(pk=run.pk).update(
            state=state,
            started_at=now - dt.timedelta(hours=3 * (3 - attempt)),
            heartbeat_at=now if state == RunState.RUNNING else None,
            state_reason=""
            if state == RunState.RUNNING
            else "preempted: restarted from a checkpoint",
        )
        if state == RunState.RUNNING:
            # As Marin's real run is: executed on its own cluster, reporting with its token.
            # Nothing reports for the demo's, so it goes quiet: its silence alert says so and
            # what to do, and the reconciler marks it crashed after its heartbeat timeout.
            Run.objects.filter(pk=run.pk).update(
                executor=EXTERNAL,
                external_id=f"{EXTERNAL_PREFIX}demo-{run.pk}",
                origin=RunOrigin.CLAIMED,
                claimed_by=actor,
                claimed_at=now,
                claim_where=DEMO_WHERE,
            )
        phase = Phase.COOLDOWN if attempt == 2 else Phase.PRETRAINING
        campaign_services.campaign_run_add(
            campaign=campaign,
            run=run,
            actor=actor,
            phase=phase,
            data_mix=MIX_AFTER if attempt == 2 else MIX_BEFORE,
        )
    campaign_services.intervention_record(
        campaign=campaign,
        actor=actor,
        step=KERNEL_STEP,
        kind=InterventionKind.KERNEL,
        title="FlashAttention-4 kernels and ragged expert parallelism",
        from_value="FA3, padded experts",
        to_value="FA4, ragged",
        keys=["throughput/mfu", "moe/drop_fraction"],
        note="New attention kernels and **ragged** all-to-all: no token is dropped for capacity.",
        happened_at=now - dt.timedelta(hours=5),
    )
    campaign_services.intervention_record(
        campaign=campaign,
        actor=actor,
        step=MIX_STEP,
        kind=InterventionKind.DATA_MIX,
        title="Data mix v2 → v3",
        from_value="web 60%, code 25%, math 15%",
        to_value="web 45%, code 30%, math 25%",
        keys=["train/loss"],
        note="More code and math for the second half.",
        happened_at=now - dt.timedelta(hours=2),
    )
    return campaign
