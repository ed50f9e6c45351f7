#!/usr/bin/env python
"""Time approval -> every run of a 256-run plan queued, on PostgreSQL.

    .venv/bin/python bench/expand.py                 # 7 rounds, database marin_bench_expand
    .venv/bin/python bench/expand.py --rounds 3 --database-url postgres://.../other

Each round creates a submitted proposal of the tiny recipe whose ablation spec is an
8 x 4 x 8 grid (256 runs; the baseline is one of its points), then times, in this process, the
maintainer's approval (the transition, freezing the plan and the preregistration), the
launch that runs after its commit, and the expansion into queued runs that a Celery worker
would run next (Celery is eager here, so the nudges run inline and the figure includes them, dispatch
included; the local executor's limit is 0 so that no trainer starts).
The clock stops when every run of the plan is ``queued`` in the database. Prints each
round, the median and the slowest; target: under 1 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/marin_bench_expand"
GRID_256 = """axes:
  learning_rate: [0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007, 0.008]
  weight_decay: [0.0, 0.01, 0.05, 0.1]
  capacity_factor: [1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0]
"""


def database_ready(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    admin = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "migrate", "--noinput", "-v", "0"],
        check=True,
        env={**os.environ, "DATABASE_URL": url},
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=DEFAULT_DB)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    os.environ.update(
        {
            "DATABASE_URL": args.database_url,
            "DJANGO_SETTINGS_MODULE": "marin_site.settings",
            "DEBUG": "0",
            "SECRET_KEY": "bench-expand-" + "x" * 40,
            "LOG_LEVEL": "WARNING",
            # Dispatch runs too (eagerly) but starts nothing: the runs stay queued, with why.
            "RUNS_LOCAL_MAX_CONCURRENT": "0",
        }
    )
    database_ready(args.database_url)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.contrib.auth.models import Group, User

    from marin_site.celery import app
    from proposals.models import Proposal, State
    from proposals.services import proposal_create, proposal_transition
    from runs.models import Recipe, Run, RunState
    from runs.recipes.demo import TINY_MOE
    from runs.services.recipes import recipe_create

    app.conf.task_always_eager = True
    author, _ = User.objects.get_or_create(username="bench-author")
    author.groups.add(Group.objects.get_or_create(name="contributor")[0])
    maintainer, _ = User.objects.get_or_create(username="bench-maintainer")
    maintainer.groups.add(Group.objects.get_or_create(name="maintainer")[0])
    recipe = Recipe.objects.filter(name=TINY_MOE["name"], version=TINY_MOE["version"]).first()
    if recipe is None:
        recipe = recipe_create(actor=maintainer, data=dict(TINY_MOE))

    seconds: list[float] = []
    for round_number in range(1, args.rounds + 1):
        proposal = proposal_create(
            author=author,
            data={
                "title": f"Bench grid {round_number} ({time.time():.0f})",
                "summary": "A 256-point grid of the tiny recipe.",
                "description": "Timing the expansion.",
                "hypothesis": "None: this measures the queue.",
                "success_metric": "eval/loss",
                "success_direction": "lower",
                "success_threshold": 0.01,
                "recipe": recipe,
                "baseline": {},
                "ablation_spec": GRID_256,
                "budget_accelerator_hours": None,
            },
            submit=True,
        )
        started = time.perf_counter()
        proposal_transition(proposal_id=proposal.pk, action="approve", actor=maintainer)
        plan_id = Proposal.objects.get(pk=proposal.pk).plan_id
        assert plan_id is not None
        queued = Run.objects.filter(plan_id=plan_id, state=RunState.QUEUED).count()
        elapsed = time.perf_counter() - started
        total = Run.objects.filter(plan_id=plan_id).count()
        assert Proposal.objects.get(pk=proposal.pk).state == State.APPROVED
        assert queued == total >= 256, (queued, total)
        # Keep the dispatcher of a running site away from these runs.
        Run.objects.filter(plan_id=plan_id).update(state=RunState.KILLED)
        seconds.append(elapsed)
        print(f"round {round_number}: {total} runs queued {elapsed * 1000:.0f} ms after approval")
    median = statistics.median(seconds)
    print(
        f"\napproval -> {total} runs queued: median {median * 1000:.0f} ms, "
        f"slowest {max(seconds) * 1000:.0f} ms over {len(seconds)} rounds "
        f"(target < 1000 ms: {'met' if max(seconds) < 1 else 'MISSED'})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
