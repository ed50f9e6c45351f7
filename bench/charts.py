#!/usr/bin/env python
"""Chart data of a big proposal page: 64 runs x 100,000 steps x 4 keys (25.6M points).

    .venv/bin/python bench/charts.py                    # seed once, then measure
    .venv/bin/python bench/charts.py --requests 100 --points 1000
    .venv/bin/python bench/charts.py --reseed           # drop the seeded plan and seed again
    .venv/bin/python bench/charts.py --rebuild          # build the rollups again (timed)

Steps: create the database (``marin_bench_charts``) if missing and migrate it; freeze and
expand a plan of 64 runs of the tiny recipe (4 learning rates x 4 capacity factors less one,
plus the baseline, x 4 seeds) and mark them running; write 100,000 steps of 4 keys per run
straight into ``runs_metricpoint`` with binary ``COPY`` (numpy builds the rows), with the
per-key summaries marked stale as an ingest leaves them; then build every rollup with
``runs.series.rollup.series_refresh``, the code the Celery worker runs (timed). Seeding is skipped
when the plan is already there.

Then it measures the server time of ``GET /api/v1/plans/{id}/series/?points=500`` (every key)
through Django's test ``Client`` in this process (DEBUG=0, the whole middleware stack, no
network): p50 and p95 over --requests requests after 3 warm-ups, the number of queries and
the response size (and its gzip size, for what the browser would download). Records the
figures in bench/RESULTS.md under "## charts (bench/charts.py)".
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import os
import statistics
import sys
import time
import urllib.parse
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from ingest import ensure_database, machine_description, results_section_replace  # noqa: E402

KEYS = ["train/loss", "eval/loss", "throughput/mfu", "moe/drop_fraction"]
SPEC = """axes:
  learning_rate: [0.001, 0.003, 0.006, 0.01]
  capacity_factor: [1.0, 1.5, 2.0, 4.0]
seeds: [0, 1, 2, 3]
"""
MARKER = "bench/charts.py"  # in the plan's spec text, to find the seeded plan again
PG_EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)


def setup_django(database_url: str) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ["CELERY_BROKER_URL"] = "memory://"
    os.environ["DEBUG"] = "0"
    os.environ.setdefault("SECRET_KEY", "bench-only-secret-key-" + "x" * 40)
    os.environ["ALLOWED_HOSTS"] = "testserver"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marin_site.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def seeded_plan_id() -> int | None:
    from runs.models import Plan

    plan = Plan.objects.filter(spec_text__endswith=f"# {MARKER}\n").order_by("-pk").first()
    return plan.pk if plan else None


def make_plan(runs: int) -> tuple[int, list[int]]:
    import copy

    from django.db import transaction

    from runs.models import PlanLaunch, Recipe, Run, RunState
    from runs.recipes.demo import TINY_MOE
    from runs.services import dispatch
    from runs.services import plans as plan_services
    from runs.services import recipes as recipe_services

    recipe = Recipe.objects.filter(name=TINY_MOE["name"], version=TINY_MOE["version"]).first()
    if recipe is None:
        recipe = recipe_services.recipe_create(actor=None, data=copy.deepcopy(TINY_MOE))
    plan = plan_services.plan_freeze(
        recipe=recipe,
        baseline={},
        spec_text=f"{SPEC}# {MARKER}\n",
        budget_accelerator_hours=None,
    )
    with transaction.atomic():
        PlanLaunch.objects.create(plan=plan, executor="local", command_template="true")
    dispatch.plan_expand(plan_id=plan.pk)
    run_ids = list(
        Run.objects.filter(plan=plan).order_by("entry__index").values_list("pk", flat=True)
    )
    if len(run_ids) != runs:
        raise SystemExit(f"the plan expanded to {len(run_ids)} runs, not {runs}")
    Run.objects.filter(pk__in=run_ids).update(state=RunState.RUNNING)
    return plan.pk, run_ids


def curve(key: str, steps: np.ndarray, rng: np.random.Generator, rate: float) -> np.ndarray:
    n = len(steps)
    if key.endswith("loss"):
        base = 2.5 + 3.0 * np.exp(-steps / (20_000 * rate)) + (0.1 if key == "eval/loss" else 0)
        return base + rng.normal(0, 0.05, n)
    if key == "throughput/mfu":
        return np.clip(0.42 + rng.normal(0, 0.01, n), 0, 1)
    return np.clip(0.05 * np.exp(-steps / 50_000) + rng.normal(0, 0.002, n), 0, 1)


def copy_rows(run_id: int, key: str, steps: np.ndarray, values: np.ndarray) -> bytes:
    """Rows of PostgreSQL's binary COPY format for one (run, key): every row has the same
    size, so numpy lays them out at once."""
    encoded = key.encode()
    row = np.dtype(
        [
            ("fields", ">i2"),
            ("run_len", ">i4"),
            ("run_id", ">i8"),
            ("key_len", ">i4"),
            ("key", f"S{len(encoded)}"),
            ("step_len", ">i4"),
            ("step", ">i8"),
            ("value_len", ">i4"),
            ("value", ">f8"),
            ("time_len", ">i4"),
            ("time", ">i8"),
        ]
    )
    rows = np.empty(len(steps), dtype=row)
    rows["fields"] = 5
    rows["run_len"], rows["run_id"] = 8, run_id
    rows["key_len"], rows["key"] = len(encoded), encoded
    rows["step_len"], rows["step"] = 8, steps
    rows["value_len"], rows["value"] = 8, values
    now = int((dt.datetime.now(dt.UTC) - PG_EPOCH).total_seconds() * 1_000_000)
    rows["time_len"], rows["time"] = 8, now - (len(steps) - steps) * 1_000_000
    return rows.tobytes()


def seed(database_url: str, runs: int, steps: int) -> int:
    import psycopg

    from runs.models import MetricSummary

    started = time.perf_counter()
    plan_id, run_ids = make_plan(runs)
    rng = np.random.default_rng(12)
    step_array = np.arange(steps, dtype=np.int64)
    summaries = []
    with psycopg.connect(database_url) as conn, conn.cursor() as cur:
        cur.execute("SET synchronous_commit = off")
        for number, run_id in enumerate(run_ids):
            rate = 0.5 + (number % 8) / 8
            with cur.copy(
                "COPY runs_metricpoint (run_id, key, step, value, time) FROM STDIN (FORMAT binary)"
            ) as copy:
                copy.write(b"PGCOPY\n\xff\r\n\x00" + b"\x00" * 8)
                for key in KEYS:
                    values = curve(key, step_array, rng, rate)
                    copy.write(copy_rows(run_id, key, step_array, values))
                    summaries.append(
                        MetricSummary(
                            run_id=run_id,
                            key=key,
                            last=float(values[-1]),
                            min=float(values.min()),
                            max=float(values.max()),
                            step=steps - 1,
                            count=steps,
                            stale_from=0,
                        )
                    )
                copy.write(b"\xff\xff")
            conn.commit()
            if number % 8 == 7:
                elapsed = time.perf_counter() - started
                print(f"  seeded {number + 1}/{runs} runs ({elapsed:.0f} s)", flush=True)
        cur.execute("ANALYZE runs_metricpoint")
        conn.commit()
    MetricSummary.objects.bulk_create(summaries)
    print(f"seeded {runs * len(KEYS) * steps:,} points in {time.perf_counter() - started:.0f} s")
    return plan_id


def build_rollups(plan_id: int) -> float:
    """Every stale key of the plan's runs, refreshed as the worker does; seconds per series."""
    from runs.models import MetricSummary, Run
    from runs.series import rollup

    run_ids = list(Run.objects.filter(plan_id=plan_id).values_list("pk", flat=True))
    stale = MetricSummary.objects.filter(run_id__in=run_ids, stale_from__isnull=False).count()
    if not stale:
        return 0.0
    started = time.perf_counter()
    for run_id in run_ids:
        rollup.series_refresh(run_id=run_id)
    elapsed = time.perf_counter() - started
    print(f"built {stale} rollups in {elapsed:.1f} s ({elapsed / stale * 1000:.0f} ms each)")
    from django.db import connection

    with connection.cursor() as cursor:  # settle before the timing: what autovacuum and the
        cursor.execute("VACUUM (ANALYZE) runs_metricseries, runs_metricsummary")
        cursor.execute("CHECKPOINT")  # checkpointer would soon do anyway
    return elapsed / stale


def measure(plan_id: int, *, requests: int, points: int) -> dict[str, float]:
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client()
    url = f"/api/v1/plans/{plan_id}/series/?points={points}"
    for _ in range(3):
        client.get(url)
    with CaptureQueriesContext(connection) as captured:
        body = client.get(url).content
    queries = len(captured)  # now: the next request clears the log
    times = []
    for _ in range(requests):
        started = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.content[:200]
    times.sort()
    return {
        "p50": statistics.median(times),
        "p95": times[min(len(times) - 1, round(0.95 * len(times)) - 1)],
        "max": times[-1],
        "bytes": len(body),
        "gzip": len(gzip.compress(body, 6)),
        "queries": queries,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--database", default="marin_bench_charts")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--points", type=int, default=500)
    parser.add_argument("--reseed", action="store_true")
    parser.add_argument(
        "--rebuild", action="store_true", help="drop the rollups and build them again (timed)"
    )
    parser.add_argument("--no-record", action="store_true", help="do not write RESULTS.md")
    args = parser.parse_args()
    runs = 64

    parts = urllib.parse.urlsplit(args.admin_url)
    database_url = f"{parts.scheme}://{parts.netloc}/{args.database}"
    ensure_database(args.admin_url, args.database)
    setup_django(database_url)
    from runs.models import Plan

    plan_id = seeded_plan_id()
    if plan_id is not None and args.reseed:
        Plan.objects.filter(pk=plan_id).delete()
        plan_id = None
    if plan_id is None:
        plan_id = seed(database_url, runs, args.steps)
    elif args.rebuild:
        from runs.models import MetricSeries, MetricSummary, Run

        run_ids = Run.objects.filter(plan_id=plan_id).values_list("pk", flat=True)
        MetricSeries.objects.filter(run_id__in=run_ids).delete()
        MetricSummary.objects.filter(run_id__in=run_ids).update(stale_from=0)
    refresh_seconds = build_rollups(plan_id)

    figures = measure(plan_id, requests=args.requests, points=args.points)
    print(
        f"GET /api/v1/plans/{plan_id}/series/?points={args.points} ({runs} runs x {len(KEYS)} "
        f"keys x {args.steps:,} steps): p50 {figures['p50']:.1f} ms, p95 {figures['p95']:.1f} ms, "
        f"max {figures['max']:.1f} ms over {args.requests} requests; {figures['queries']:.0f} "
        f"queries; {figures['bytes'] / 1e6:.2f} MB ({figures['gzip'] / 1e6:.2f} MB gzipped)"
    )
    print(f"target p95 < 100 ms: {'met' if figures['p95'] < 100 else 'NOT met'}")
    if not args.no_record:
        record(args=args, plan_id=plan_id, figures=figures, refresh_seconds=refresh_seconds)
    return 0


CHARTS_NOTES = [
    "How (runs/series/): each (run, key) keeps at most 2048 buckets of a power-of-two",
    "number of steps (count, sum, min, max, last step; the steps of the min and max apart),",
    "and a copy with four buckets in one. A request reads, for every series in one query",
    "(PostgreSQL's binary protocol), the copy with enough buckets for the points asked,",
    "merges neighbouring buckets with a few numpy calls over all series at once, and writes",
    "the JSON with orjson. Four queries whatever the number of runs and keys.",
]


def record(
    *, args: argparse.Namespace, plan_id: int, figures: dict[str, float], refresh_seconds: float
) -> None:
    command = " ".join(["    .venv/bin/python bench/charts.py", *sys.argv[1:]]).rstrip()
    built = (
        f" Building the 256 rollups from the points took {refresh_seconds * 1000:.0f} ms each."
        if refresh_seconds
        else ""
    )
    lines = [
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC. Machine: {machine_description()}.",
        "",
        command,
        "",
        f"Data: one plan of 64 runs x 4 keys x {args.steps:,} steps "
        f"({64 * 4 * args.steps / 1e6:.1f}M points) in `runs_metricpoint`, seeded with binary "
        "COPY; rollups (`runs_metricseries`) built by `runs.series.rollup.series_refresh`, the "
        f"worker's code.{built}",
        "",
        "Server time of the whole page's chart data, `GET /api/v1/plans/{id}/series/"
        f"?points={args.points}` (all 4 keys), through Django's test Client in-process "
        "(DEBUG=0, full middleware stack, no network), after 3 warm-up requests:",
        "",
        "| requests | p50 | p95 | max | queries | response | gzipped |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {args.requests} | {figures['p50']:.1f} ms | {figures['p95']:.1f} ms | "
        f"{figures['max']:.1f} ms | {figures['queries']:.0f} | {figures['bytes'] / 1e6:.2f} MB | "
        f"{figures['gzip'] / 1e6:.2f} MB |",
        "",
        f"Target p95 < 100 ms: {'met' if figures['p95'] < 100 else 'not met'}.",
        "",
        *CHARTS_NOTES,
        "",
        "Page JavaScript and CSS weight (target < 300 KB compressed): to be measured "
        "(another part of #5).",
        "",
        "Search with 10,000 proposals (target p95 < 200 ms): to be measured (another part of #5).",
    ]
    results_section_replace("charts (bench/charts.py)", lines)


if __name__ == "__main__":
    raise SystemExit(main())
