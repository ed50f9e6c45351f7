"""Fill an empty site with demo accounts, recipes and a dozen proposals in every state.

Everything goes through the services, so the demo timeline reads like a real one.
Running it again changes nothing. A proposal with a recorded outcome has its runs played
to the end first (as a worker would report them: running, metrics, finished) with numbers
that support that outcome, and the outcome is recorded only once they are terminal: no
demo proposal claims a verdict its runs do not show, or while its runs are queued. The recipes are the project's reviewed files
(``runs/recipes/``, as ``load_recipes`` registers them). The accounts have a known password,
so the command refuses to run with DEBUG off: production never gets them.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from marin_site.doors import Door
from marin_site.roles import ROLES
from proposals import services
from proposals.github.backfill import imported_event_record
from proposals.models import Proposal, State
from runs.board.demo import demo_board_seed
from runs.campaigns.demo import demo_campaign_seed
from runs.metrics import ingest
from runs.metrics.parse import PointBatch
from runs.models import Plan, Pool, Recipe, Run, RunState
from runs.pools.services import pool_create
from runs.recipes.demo import DEMO_RECIPES
from runs.results import summary as results
from runs.series import rollup
from runs.services import dispatch
from runs.services import runs as run_writes
from runs.services.recipes import recipe_create

DEMO_PASSWORD = "marin-demo"  # noqa: S105 (demo accounts, printed on purpose)
DEMO_USERS = [("carla", "contributor"), ("rita", "reviewer"), ("max", "maintainer")]
DEMO_POOL: dict[str, Any] = {
    "name": "community-gpus",
    "description": "Carla's workstation and lab GPUs, lent to the project's small runs.",
    "labels": ["gpu:a5000", "cpu:x86"],
    "recipes": ["tiny-moe"],
    "max_concurrent_runs": 2,
}

# The demo's made-up results: eval/loss of a recipe's baseline, the same in every plan (so a
# baseline run reused from another plan's cache agrees), each seed a little apart.
BASE_EVAL_LOSS = {"tiny-moe": 3.1, "marin-moe": 2.45}
BASELINE_SPREAD = 0.001
SEED_OFFSETS = {None: 0.0, 0: -1.0, 1: 1.0, 2: 0.0}
DEMO_STEPS = (0, 100, 200, 300, 400)
DEMO_CURVE = (1.6, 0.7, 0.3, 0.1, 0.0)  # above the final loss at each of those steps
# Telemetry as the trainers log it (Levanter's units): MFU in percent, tokens/s, the drop
# fraction 0-1; each run a little apart, the same on every seeding.
DEMO_MFU = {"tiny-moe": 18.0, "marin-moe": 38.0}
DEMO_TOKENS_PER_SECOND = {"tiny-moe": 52_000.0, "marin-moe": 410_000.0}

SPEC_CF = """axes:
  capacity_factor: [1.0, 1.25]
  weight_decay: [0.0, 0.1]
scales: [small]
seeds: [0]
"""


def _demo_proposals() -> list[dict[str, Any]]:
    return [
        {
            "title": "Top-2 routing for the tiny MoE",
            "summary": "Does routing each token to two experts beat top-1 at equal compute?",
            "hypothesis": "Top-2 routing lowers eval loss by at least 0.02 at the small scale.",
            "recipe": "tiny-moe",
            "spec": "axes:\n  top_k: [1, 2]\nseeds: [0, 1]\n",
            "labels": ["moe", "routing"],
            "path": [],
        },
        {
            "title": "Higher capacity factor lowers the drop fraction",
            "summary": "Capacity factor 1.25 vs 1.0, with and without weight decay.",
            "hypothesis": (
                "A higher capacity factor lowers the MoE drop fraction without hurting eval loss."
            ),
            "recipe": "tiny-moe",
            "spec": SPEC_CF,
            "labels": ["moe", "capacity"],
            "path": ["submit"],
            "reviews": [("rita", 4, "approve", "Clear hypothesis; the plan is cheap.")],
        },
        {
            "title": "More code in the data mix",
            "summary": "Raise the code share from 0.7 to 0.9 and see what happens to eval loss.",
            "hypothesis": "A 0.9 code share lowers eval loss on code without hurting docstrings.",
            "recipe": "tiny-moe",
            "spec": (
                "axes:\n  data_mix:\n    - {code: 0.7, docs: 0.3}\n    - {code: 0.9, docs: 0.1}\n"
            ),
            "labels": ["data-mix"],
            "path": ["submit"],
        },
        {
            "title": "Weight decay sweep at three scales",
            "summary": "Weight decay 0, 0.05 and 0.1 on a small scaling ladder.",
            "hypothesis": "Weight decay 0.1 helps more at larger scales.",
            "recipe": "tiny-moe",
            "spec": "axes:\n  weight_decay: [0.0, 0.05, 0.1]\nscales: [small, medium, large]\n",
            "labels": ["optimizer", "scaling"],
            "path": [
                "submit",
                ("request_changes", "rita", "Add seeds: one seed per point is noise."),
            ],
            "reviews": [("rita", 2, "request_changes", "Needs at least two seeds.")],
        },
        {
            "title": "z-loss at the 8B scale",
            "summary": "Does z-loss 1e-4 stabilise the 8B MoE router?",
            "hypothesis": "z-loss 1e-4 removes the loss spikes seen at 8B without slowing training.",
            "recipe": "marin-moe",
            "spec": "axes:\n  z_loss: [0.0, 0.0001]\nscales: [8b]\n",
            "labels": ["moe", "stability"],
            "path": ["submit", "approve"],
            "reviews": [("rita", 5, "approve", "Important for the 535B run.")],
        },
        {
            "title": "Capacity factor 1.25 at 1B",
            "summary": "The capacity factor result, replicated at the 1B scale.",
            "hypothesis": "Capacity factor 1.25 lowers drop fraction and eval loss at 1B.",
            "recipe": "marin-moe",
            "spec": "axes:\n  capacity_factor: [1.0, 1.25]\nscales: [1b]\nseeds: [0, 1]\n",
            "labels": ["moe", "capacity"],
            "baseline": {"capacity_factor": 1.0},
            "path": ["submit", "approve"],
            "results": {"effects": {("capacity_factor", 1.25): -0.021}},
            "outcome": ("worked", "replicated", "Eval loss fell by 0.021 with both seeds."),
        },
        {
            # Gate-style, beside the ladder above: a verdict preregistered as Marin's Agent
            # MoE gate 1 (runs/verdicts/gates.py), computed from the finished runs.
            "title": "Capacity factor 1.25 through gate 1",
            "summary": "The effective speedup of capacity factor 1.25 at two scales (Agent MoE gate 1).",
            "hypothesis": "Capacity factor 1.25 reaches the baseline's loss sooner in wall-clock "
            "time at both scales.",
            "recipe": "tiny-moe",
            "spec": "axes:\n  capacity_factor: [1.25]\nscales: [small, medium]\n",
            "labels": ["moe", "gates"],
            "verdict_rule": {"kind": "effective_speedup", "metric": "eval/loss"},
            "path": ["submit", "approve"],
            "results": {"effects": {("capacity_factor", 1.25): -0.02}},
        },
        {
            "title": "Eight experts instead of four",
            "summary": "More experts at equal active parameters.",
            "hypothesis": "Eight experts lower eval loss by 0.03 at equal active compute.",
            "recipe": "tiny-moe",
            "spec": "axes:\n  num_experts: [4, 8]\nseeds: [0, 1]\n",
            "labels": ["moe"],
            "path": ["submit", "approve"],
            "results": {"effects": {("num_experts", 8): 0.015}},
            "outcome": (
                "did_not_work",
                "replicated",
                "Eval loss rose by 0.015 with both seeds; the router collapsed onto 3 experts.",
            ),
        },
        {
            "title": "No learning-rate warmup",
            "summary": "Drop warmup entirely at 1B.",
            "hypothesis": "Warmup is unnecessary with z-loss; removing it changes nothing.",
            "recipe": "marin-moe",
            "spec": "axes:\n  warmup_fraction: [0.0, 0.01]\nscales: [1b]\n",
            "labels": ["optimizer", "stability"],
            "path": ["submit", "approve"],
            "results": {"effects": {("warmup_fraction", 0.0): 0.35}},
            "outcome": (
                "did_not_work",
                "exploratory",
                "Loss spiked early without warmup and ended 0.35 above the baseline. "
                "**Keep warmup.**",
            ),
        },
        {
            "title": "Learning rate 2x at the small scale",
            "summary": "Is the default learning rate too low?",
            "hypothesis": "Doubling the learning rate lowers final loss by 0.01.",
            "recipe": "tiny-moe",
            "spec": "axes:\n  learning_rate: [0.003, 0.006]\nseeds: [0, 1]\n",
            "labels": ["optimizer"],
            "path": ["submit", "approve"],
            "results": {"effects": {("learning_rate", 0.006): 0.002}, "spread": 0.012},
            "outcome": (
                "inconclusive",
                "exploratory",
                "A difference of 0.002, well inside the seed spread; needs more seeds.",
            ),
        },
        {
            "title": "Docstring-heavy mix",
            "summary": "A 60% share of docstrings and comments.",
            "hypothesis": "A 60% docs share improves docs eval loss by 0.05.",
            "recipe": "tiny-moe",
            "spec": "axes:\n  data_mix:\n    - {code: 0.4, docs: 0.6}\n",
            "labels": ["data-mix"],
            "path": ["submit", "approve"],
            "results": {"effects": {("data_mix.docs", 0.6): -0.005}},
            "outcome": (
                "promising",
                "exploratory",
                "Eval loss down 0.005, under the 0.01 threshold; docs loss down 0.04, code loss up 0.01.",
            ),
        },
        {
            "title": "Train the 23B model on 2x tokens",
            "summary": "Overtrain the full model to 920B tokens.",
            "hypothesis": "Twice the tokens lowers final loss by 0.05.",
            "recipe": "marin-moe",
            "spec": "axes:\n  tokens_b: [920]\nscales: [23b]\n",
            "labels": ["scaling"],
            "path": ["submit", ("reject", "max", "Over the quarter's budget; try at 8B first.")],
        },
        {
            "title": "Top-4 routing at 1B",
            "summary": "Withdrawn: superseded by the top-2 proposal.",
            "hypothesis": "Top-4 routing beats top-2 at 1B.",
            "recipe": "marin-moe",
            "spec": "axes:\n  top_k: [2, 4]\nscales: [1b]\n",
            "labels": ["moe", "routing"],
            "path": ["submit", "withdraw"],
        },
        {
            # An experiment from before the site, as github_backfill brings one in: an
            # imported issue, its verdict recorded as found, with no plan and no approval.
            "title": "Load-balancing loss at 0.01",
            "summary": "A stronger load-balancing loss, from an experiment issue of 2025.",
            "hypothesis": "A load-balancing coefficient of 0.01 lowers the drop fraction.",
            "recipe": "tiny-moe",
            "spec": "axes:\n  load_balance_coef: [0.001, 0.01]\n",
            "labels": ["moe"],
            "path": [],
            "imported": 4321,
            "outcome": (
                "worked",
                "replicated",
                "The drop fraction fell from 9% to 3% at the same eval loss; kept in the baseline.",
            ),
        },
        {
            "title": "Seed variance of the baseline",
            "summary": "Three seeds of the baseline, to know what noise looks like.",
            "hypothesis": "Seed-to-seed spread of eval loss is under 0.005.",
            "recipe": "tiny-moe",
            "spec": "seeds: [0, 1, 2]\n",
            "labels": ["baseline"],
            "path": ["submit", "approve", "cancel"],
            "outcome": ("not_evaluated", "exploratory", "Canceled when the cluster was needed."),
            "without_results": "Canceled before any run started: there are no results to wait for.",
        },
    ]


class Command(BaseCommand):
    help = "Create demo accounts, recipes and proposals in every state (idempotent)."

    @transaction.atomic
    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.DEBUG:
            raise CommandError(
                f"seed_demo creates demo accounts with a known password ('{DEMO_PASSWORD}'), so "
                "it runs only with DEBUG=1. On a production site register recipes with "
                "`manage.py load_recipes` (README, Production)."
            )
        user_model = get_user_model()
        groups = {name: Group.objects.get_or_create(name=name)[0] for name in ROLES}
        users = {}
        for username, role in DEMO_USERS:
            user, created = user_model.objects.get_or_create(
                username=username, defaults={"email": f"{username}@example.org"}
            )
            if created:
                user.set_password(DEMO_PASSWORD)
                user.save()
            user.groups.add(groups[role])
            users[username] = user
        recipes = {}
        for data in DEMO_RECIPES:
            recipe = Recipe.objects.filter(name=data["name"], version=data["version"]).first()
            recipes[data["name"]] = recipe or recipe_create(actor=users["max"], data=dict(data))

        if not Pool.objects.filter(name=DEMO_POOL["name"]).exists():
            # Carla's own GPUs, for runs on anyone's compute: its page shows how to register
            # an agent; the demo recipes still run where they did, so nothing waits for it.
            pool_create(actor=users["max"], data=dict(DEMO_POOL), owner=users["carla"])

        if Proposal.objects.exists():
            self.stdout.write(
                f"The site already has {Proposal.objects.count()} proposals; none added."
            )
        else:
            for item in _demo_proposals():
                self._create(item, users, recipes)
            self.stdout.write(f"Added {Proposal.objects.count()} demo proposals.")
        if demo_campaign_seed(actor=users["max"], recipe=recipes["marin-moe"]):
            self.stdout.write("Added a demo campaign: /campaigns/moe-535b-demo/")
        board = demo_board_seed()
        self.stdout.write(
            "The board: "
            + ", ".join(f"{r.track} ({r.entries} entries)" for r in board)
            + " (/board/)"
        )
        accounts = ", ".join(f"{user} ({role})" for user, role in DEMO_USERS)
        self.stdout.write(f"Demo accounts (password '{DEMO_PASSWORD}'): {accounts}")

    def _create(self, item: dict[str, Any], users: dict[str, Any], recipes: dict[str, Any]) -> None:
        author = users["carla"]
        proposal = services.proposal_create(
            author=author,
            data={
                "title": item["title"],
                "summary": item["summary"],
                "description": f"{item['summary']}\n\nSee the plan below for every run.",
                "hypothesis": item["hypothesis"],
                "success_metric": "eval/loss",
                "success_direction": "lower",
                "success_threshold": 0.01,
                "recipe": recipes[item["recipe"]],
                "baseline": item.get("baseline", {}),
                "ablation_spec": item["spec"],
                "budget_accelerator_hours": 50_000.0 if item["recipe"] == "marin-moe" else 1.0,
                "verdict_rule": item.get("verdict_rule"),
            },
            labels=item["labels"],
            door=Door.SYSTEM,
        )
        if "imported" in item:
            _as_imported(proposal, issue_number=item["imported"])
        for step in item["path"]:
            action, actor_name, reason = step if isinstance(step, tuple) else (step, None, "")
            if actor_name:
                actor = users[actor_name]
            else:
                actor = author if action in {"submit", "withdraw"} else users["max"]
            services.proposal_transition(
                proposal_id=proposal.pk, action=action, actor=actor, reason=reason
            )
            if action == "submit":  # reviews arrive while the proposal is submitted
                for reviewer, score, recommendation, text in item.get("reviews", []):
                    services.review_submit(
                        proposal_id=proposal.pk,
                        reviewer=users[reviewer],
                        score=score,
                        recommendation=recommendation,
                        text=text,
                    )
        if "results" in item:
            plan_id = Proposal.objects.get(pk=proposal.pk).plan_id
            assert plan_id is not None, "an approved demo proposal has a plan"
            _play_results(Plan.objects.get(pk=plan_id), item["recipe"], item["results"])
        if "outcome" in item:
            outcome, confidence, conclusion = item["outcome"]
            services.proposal_record_outcome(
                proposal_id=proposal.pk,
                actor=users["max"],
                outcome=outcome,
                confidence=confidence,
                conclusion=conclusion,
                without_results_reason=item.get("without_results", ""),
            )
        services.comment_create(
            proposal_id=proposal.pk,
            author=users["rita"],
            body="What does the baseline's drop fraction look like at this scale?",
        )


def _as_imported(proposal: Proposal, *, issue_number: int) -> None:
    """Make a demo proposal what the backfill makes of an old experiment issue: imported,
    with the issue's number and its timeline row, nothing written to GitHub."""
    Proposal.objects.filter(pk=proposal.pk).update(
        state=State.IMPORTED, github_issue_number=issue_number
    )
    imported_event_record(proposal=proposal, issue_number=issue_number, parent=None)


def _eval_loss(run: Run, recipe: str, made_up: dict[str, Any]) -> float:
    """The run's made-up final eval/loss: the recipe's baseline, plus the effect of what
    the point changes, plus its seed's offset."""
    entry = run.entry
    diff = entry.diff or {}
    effect = sum(
        delta
        for (key, value), delta in made_up["effects"].items()
        if key in diff and diff[key].get("value") == value
    )
    spread = BASELINE_SPREAD if entry.is_baseline else made_up.get("spread", BASELINE_SPREAD)
    return BASE_EVAL_LOSS[recipe] + effect + SEED_OFFSETS.get(entry.seed, 0.0) * spread


def _telemetry(run: Run, recipe: str) -> dict[str, float]:
    """The run's made-up MFU (percent), tokens/s and drop fraction (fewer tokens dropped
    with a larger capacity factor)."""
    wobble = ((run.entry.index * 7) % 5 - 2) * 0.4
    mfu = DEMO_MFU[recipe] + wobble
    capacity = (run.config or {}).get("capacity_factor", 1.0)
    return {
        "throughput/mfu": mfu,
        "throughput/tokens_per_second": DEMO_TOKENS_PER_SECOND[recipe] * mfu / DEMO_MFU[recipe],
        "moe/drop_fraction": max(0.0, 0.05 - 0.06 * (float(capacity) - 1.0) + 0.002 * wobble),
    }


def _demo_steps(run: Run) -> tuple[int, ...]:
    """The steps of the made-up curve: spread over the run's configured steps, so its
    progress never reads "400 / 200"; DEMO_STEPS when its config counts no steps."""
    total = (run.config or {}).get("steps")
    if not isinstance(total, int) or isinstance(total, bool) or total < len(DEMO_STEPS):
        return DEMO_STEPS
    last = len(DEMO_STEPS) - 1
    return tuple(round(total * i / last) for i in range(len(DEMO_STEPS)))


def _play_results(plan: Plan, recipe: str, made_up: dict[str, Any]) -> None:
    """Create the plan's runs and report them to the end, as a worker would."""
    dispatch.plan_expand(plan_id=plan.pk)
    runs = Run.objects.filter(plan=plan).select_related("entry").order_by("entry__index")
    for run in runs:
        if run.state != RunState.QUEUED:
            continue  # a cached copy of a run another plan already finished
        final = _eval_loss(run, recipe, made_up)
        run_writes.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door=Door.WORKER)
        curve = [final + above for above in DEMO_CURVE]
        keys = ["eval/loss"] * len(curve) + ["train/loss"] * len(curve)
        values = [*curve, *(v + 0.05 for v in curve)]
        steps = _demo_steps(run)
        for key, value in _telemetry(run, recipe).items():
            keys += [key] * len(curve)
            values += [value] * len(curve)
        ingest.metrics_ingest(
            run=Run.objects.get(pk=run.pk),
            batch=PointBatch(
                keys=keys,
                steps=list(steps) * (len(keys) // len(steps)),
                values=values,
                times=[None] * len(values),
            ),
        )
        rollup.series_refresh(run_id=run.pk)
        run_writes.run_transition(run_id=run.pk, to_state=RunState.FINISHED, door=Door.WORKER)
    results.plan_check_finished(plan_id=plan.pk)
