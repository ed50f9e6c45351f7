#!/usr/bin/env python
"""A preregistered verdict recomputed for a 4-scale, 3-seed plan: target < 50 ms.

    .venv/bin/python bench/verdicts.py                 # --repeat 50 by default

Creates the database ``marin_bench_verdicts`` if missing and migrates it; freezes and
launches a plan of the tiny recipe with one variant at four scales and three seeds (24
runs), finishes every run with a final ``eval/loss`` and 150 throughput points. Then it
times (1) ``plan_verdicts`` for ``effective_speedup`` and for ``pinned_refit``: the whole
path a page or the result comment takes (the runs' throughput tails read from
PostgreSQL, seeds averaged, the rule computed), and (2) the rules alone on the same
figures (``verdict_compute``). Prints p50, p95 and max over --repeat runs after 3 warm-ups
and records them in bench/RESULTS.md under "## verdicts (bench/verdicts.py, issue 28)".
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from ingest import ensure_database, machine_description, results_section_replace  # noqa: E402

DATABASE = "marin_bench_verdicts"
SPEC = """axes:
  capacity_factor: [2.0]
scales: [small, medium, large, xl]
seeds: [0, 1, 2]
"""


def setup(admin_url: str) -> None:
    ensure_database(admin_url, DATABASE)
    os.environ["DATABASE_URL"] = admin_url.rsplit("/", 1)[0] + "/" + DATABASE
    os.environ["CELERY_BROKER_URL"] = "memory://"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marin_site.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def seed() -> Any:
    import copy

    from django.db import transaction
    from django.utils import timezone

    from runs.models import MetricPoint, MetricSummary, Plan, Recipe, Run, RunState
    from runs.recipes.demo import TINY_MOE
    from runs.services import dispatch
    from runs.services import plans as plan_services
    from runs.services import runs as run_writes

    data = copy.deepcopy(TINY_MOE)
    base = data["scales"]["small"]
    data["scales"] = {
        name: {**base, "width": width}
        for name, width in (("small", 16), ("medium", 24), ("large", 32), ("xl", 48))
    }
    data["name"] = "bench-verdicts"
    Plan.objects.filter(recipe__name=data["name"]).delete()  # a rerun starts afresh
    Recipe.objects.filter(name=data["name"]).delete()
    recipe = Recipe.objects.create(**{k: v for k, v in data.items() if hasattr(Recipe, k)})
    plan = plan_services.plan_freeze(
        recipe=recipe, baseline={}, spec_text=SPEC, budget_accelerator_hours=None
    )
    with transaction.atomic():
        plan_services.plan_launch(plan_id=plan.pk, criteria={"metric": "eval/loss"})
    dispatch.plan_expand(plan_id=plan.pk)
    now = timezone.now()
    for run in Run.objects.filter(plan=plan).select_related("entry"):
        loss = 3.0 * (run.entry.flops / 1e12) ** -0.05 * (0.99 if not run.entry.is_baseline else 1)
        loss += 0.001 * (run.entry.seed or 0)
        run_writes.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door="worker")
        MetricSummary.objects.create(
            run=run, key="eval/loss", last=loss, min=loss, max=loss, step=150
        )
        MetricPoint.objects.bulk_create(
            MetricPoint(run=run, key="throughput/tokens_per_second", step=i, value=1e5, time=now)
            for i in range(150)
        )
        run_writes.run_transition(run_id=run.pk, to_state=RunState.FINISHED, door="worker")
    return plan


def timed(call: Any, repeat: int) -> list[float]:
    for _ in range(3):
        call()
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        out.append((time.perf_counter() - start) * 1000)
    return sorted(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--admin-url", default="postgres://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    setup(args.admin_url)
    from runs.results.summary import final_metrics, latest_runs
    from runs.verdicts.plan import plan_verdicts
    from runs.verdicts.rules import verdict_compute

    plan = seed()
    rows = []
    for rule in ({"kind": "effective_speedup", "metric": "eval/loss"},
                 {"kind": "pinned_refit", "metric": "eval/loss"}):  # fmt: skip

        def whole(rule: dict[str, Any] = rule) -> dict[str, Any]:
            runs = latest_runs(plan_id=plan.pk)
            return plan_verdicts(spec=rule, runs=runs, metrics=final_metrics(runs=runs))

        found = whole()
        (variant,) = found["variants"]
        assert variant["verdict"] is not None, variant
        payload = {"rule": rule, **variant["figures"]}
        rows.append(
            (f"`{rule['kind']}`, the plan path (24 runs, PostgreSQL)", timed(whole, args.repeat))
        )
        rows.append(
            (
                f"`{rule['kind']}`, the rule alone",
                timed(lambda p=payload: verdict_compute(p), args.repeat),
            )
        )
    lines = [
        f"### {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC: a 4-scale, 3-seed plan (target < 50 ms)",
        "",
        machine_description(),
        "",
        f"    .venv/bin/python bench/verdicts.py --repeat {args.repeat}",
        "",
        "| what | p50 (ms) | p95 (ms) | max (ms) |",
        "|---|---|---|---|",
    ]
    for name, values in rows:
        p95 = values[min(len(values) - 1, int(0.95 * len(values)))]
        lines.append(f"| {name} | {statistics.median(values):.1f} | {p95:.1f} | {values[-1]:.1f} |")
        print(
            f"{name}: p50 {statistics.median(values):.1f} ms, p95 {p95:.1f} ms, max {values[-1]:.1f} ms"
        )
    results_section_replace("verdicts (bench/verdicts.py, issue 28)", lines)


if __name__ == "__main__":
    main()
