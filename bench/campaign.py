#!/usr/bin/env python
"""A campaign of 1,200,000 steps x 60 keys (72M points) across 3 attempts: its chart data
and its page.

    .venv/bin/python bench/campaign.py                       # seed once (long), then measure
    .venv/bin/python bench/campaign.py --steps 300000        # a smaller campaign (say so)
    .venv/bin/python bench/campaign.py --reseed              # drop the seeded campaign first
    .venv/bin/python bench/campaign.py --skip-page           # the chart data only

Steps: create the database (``marin_bench_campaign``) if missing and migrate it; freeze a
plan of one entry of the tiny recipe and make three runs of it (the attempts: each restart
resumes 1% of the steps before where the one before stopped, so the attempts overlap);
write every key's points straight into ``runs_metricpoint`` with binary ``COPY``, the
summaries stale as an ingest leaves them; build the rollups with ``runs.series``' refresh,
the worker's code (timed); declare the campaign with its three attempts and two
interventions. Seeding is skipped when the campaign is there.

Then it measures (1) the server time of the page's chart data,
``GET /api/v1/campaigns/<slug>/series/?points=500`` (every chart key and the mixture
weights, stitched), through Django's test ``Client`` in this process (DEBUG=0, the whole
middleware stack, no network): p50, p95 and max over --requests requests after 3 warm-ups,
the queries and the size; and (2) the page ``/campaigns/<slug>/`` behind gunicorn (3 sync
workers, the README's production command; the page cache on Redis as in production) under
--clients anonymous keep-alive clients for --duration seconds: p50, p99, max and errors.
Records the figures, the machine and its load average in bench/RESULTS.md under
"## campaign (bench/campaign.py)".
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

from charts import copy_rows  # noqa: E402
from ingest import ensure_database, machine_description, results_section_replace  # noqa: E402

SLUG = "bench-campaign"
ATTEMPTS = 3
OVERLAP = 0.01  # a restart resumes this fraction of the steps before the last one
TOKENS_PER_STEP = 4_194_304
FLOPS_PER_TOKEN = 6 * 23e9
NAMED_KEYS = [
    "train/loss",
    "eval/loss",
    "throughput/total_tokens",
    "throughput/tokens_per_second",
    "throughput/mfu",
    "moe/drop_fraction",
    "mixture/weight/web",
    "mixture/weight/code",
    "mixture/weight/math",
    "optim/grad_norm",
]


def key_names(count: int) -> list[str]:
    extra = [f"telemetry/layer_{i:02d}/rms" for i in range(max(0, count - len(NAMED_KEYS)))]
    return (NAMED_KEYS + extra)[:count]


def setup_django(database_url: str, cache_url: str) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ["CACHE_URL"] = cache_url
    os.environ["PAGE_CACHE_SECONDS"] = "0"  # in-process: the page rendered, never a cache hit
    os.environ["CELERY_BROKER_URL"] = "memory://"
    os.environ["DEBUG"] = "0"
    os.environ.setdefault("SECRET_KEY", "bench-only-secret-key-" + "x" * 40)
    os.environ["ALLOWED_HOSTS"] = "testserver,127.0.0.1,localhost"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marin_site.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    call_command("collectstatic", "--noinput", verbosity=0)  # DEBUG=0 serves the manifest


def attempt_ranges(steps: int) -> list[tuple[int, int]]:
    """[first, stop) of each attempt: equal thirds, each restart 1% of the steps early."""
    bounds = [round(steps * i / ATTEMPTS) for i in range(ATTEMPTS + 1)]
    back = int(steps * OVERLAP)
    return [(max(0, bounds[i] - (back if i else 0)), bounds[i + 1]) for i in range(ATTEMPTS)]


def curve(key: str, steps: np.ndarray, rng: np.random.Generator, attempt: int) -> np.ndarray:
    n = len(steps)
    if key == "throughput/total_tokens":
        return steps.astype(np.float64) * TOKENS_PER_STEP
    if key.endswith("loss"):
        base = 1.9 + 9.0 * (1 + steps / 600.0) ** -0.45 + 0.01 * attempt
        return base + rng.normal(0, 0.02, n) + (0.05 if key == "eval/loss" else 0)
    if key == "throughput/mfu":
        return np.where(steps >= 400_000, 0.27, 0.21) + rng.normal(0, 0.006, n)
    if key == "throughput/tokens_per_second":
        return np.where(steps >= 400_000, 4.6e5, 3.6e5) + rng.normal(0, 5e3, n)
    if key.startswith("mixture/weight/"):
        weights = {"web": (0.6, 0.45), "code": (0.25, 0.3), "math": (0.15, 0.25)}
        before, after = weights[key.rsplit("/", 1)[1]]
        return np.where(steps >= 800_000, after, before).astype(np.float64)
    if key == "moe/drop_fraction":
        return np.clip(0.04 * np.exp(-steps / 300_000) + rng.normal(0, 0.001, n), 0, 1)
    return 1.0 + 0.1 * np.sin(steps / 5000.0) + rng.normal(0, 0.01, n)


def make_runs() -> tuple[int, list[int]]:
    import copy

    from django.db import transaction

    from runs.models import PlanLaunch, Recipe, Run, RunState
    from runs.recipes.demo import TINY_MOE
    from runs.services import dispatch, plans, recipes

    recipe = Recipe.objects.filter(name=TINY_MOE["name"], version=TINY_MOE["version"]).first()
    if recipe is None:
        recipe = recipes.recipe_create(actor=None, data=copy.deepcopy(TINY_MOE))
    plan = plans.plan_freeze(
        recipe=recipe, baseline={}, spec_text="# bench/campaign.py\n", budget_accelerator_hours=None
    )
    with transaction.atomic():
        PlanLaunch.objects.create(plan=plan, executor="local", command_template="true")
    dispatch.plan_expand(plan_id=plan.pk)
    first = Run.objects.filter(plan=plan).order_by("pk").first()
    assert first is not None
    ids = [first.pk]
    for attempt in range(1, ATTEMPTS):
        run = Run.objects.create(
            plan=plan,
            entry=first.entry,
            sequence=attempt,
            recipe_name=first.recipe_name,
            recipe_version=first.recipe_version,
            config=first.config,
            config_hash=first.config_hash,
        )
        ids.append(run.pk)
    states = [RunState.CRASHED] * (ATTEMPTS - 1) + [RunState.RUNNING]
    for run_id, state in zip(ids, states, strict=True):
        Run.objects.filter(pk=run_id).update(state=state)
    return plan.pk, ids


def seed(database_url: str, steps: int, keys: list[str]) -> float:
    """Write the points and summaries; returns seconds spent."""
    import psycopg

    from runs.models import MetricSummary

    started = time.perf_counter()
    _, run_ids = make_runs()
    rng = np.random.default_rng(18)
    summaries = []
    total = 0
    with psycopg.connect(database_url) as conn, conn.cursor() as cur:
        cur.execute("SET synchronous_commit = off")
        for attempt, (run_id, (first, stop)) in enumerate(
            zip(run_ids, attempt_ranges(steps), strict=True)
        ):
            step_array = np.arange(first, stop, dtype=np.int64)
            for number, key in enumerate(keys):
                values = curve(key, step_array, rng, attempt)
                with cur.copy(
                    "COPY runs_metricpoint (run_id, key, step, value, time) "
                    "FROM STDIN (FORMAT binary)"
                ) as copy:
                    copy.write(b"PGCOPY\n\xff\r\n\x00" + b"\x00" * 8)
                    copy.write(copy_rows(run_id, key, step_array, values))
                    copy.write(b"\xff\xff")
                conn.commit()
                total += len(step_array)
                summaries.append(
                    MetricSummary(
                        run_id=run_id,
                        key=key,
                        last=float(values[-1]),
                        min=float(values.min()),
                        max=float(values.max()),
                        step=int(step_array[-1]),
                        count=len(step_array),
                        stale_from=int(step_array[0]),
                    )
                )
                if number % 10 == 9:
                    print(
                        f"  attempt {attempt + 1}/{ATTEMPTS}: {number + 1}/{len(keys)} keys, "
                        f"{total:,} points ({time.perf_counter() - started:.0f} s)",
                        flush=True,
                    )
        cur.execute("ANALYZE runs_metricpoint")
        conn.commit()
    MetricSummary.objects.bulk_create(summaries)
    seconds = time.perf_counter() - started
    print(f"seeded {total:,} points in {seconds:.0f} s")
    declare(run_ids=run_ids, steps=steps)
    return seconds


def declare(*, run_ids: list[int], steps: int) -> None:
    from runs.campaigns import services
    from runs.campaigns.models import Campaign, CampaignRun, Intervention

    Campaign.objects.filter(slug=SLUG).delete()
    target_tokens = 2 * steps * TOKENS_PER_STEP
    campaign = Campaign.objects.create(
        slug=SLUG,
        name="Bench campaign",
        target_tokens=target_tokens,
        target_flops=target_tokens * FLOPS_PER_TOKEN,
        hardware="bench",
        telemetry_keys=["optim/grad_norm", "telemetry/layer_00/rms"],
        description="A **benchmark** campaign: " + services.__name__,
    )
    for order, run_id in enumerate(run_ids):
        CampaignRun.objects.create(campaign=campaign, run_id=run_id, order=order)
    for step, title in ((steps // 3, "kernels"), (2 * steps // 3, "data mix v3")):
        Intervention.objects.create(
            campaign=campaign,
            step=step,
            happened_at=dt.datetime.now(dt.UTC),
            kind="other",
            title=title,
            keys=["throughput/mfu", "train/loss"],
            window_steps=2000,
            note="A *note*.",
        )


def build_rollups() -> tuple[int, float]:
    from runs.campaigns.models import CampaignRun
    from runs.models import MetricSummary
    from runs.series.rollup import series_refresh

    run_ids = list(CampaignRun.objects.filter(campaign__slug=SLUG).values_list("run_id", flat=True))
    stale = MetricSummary.objects.filter(run_id__in=run_ids, stale_from__isnull=False).count()
    if not stale:
        return 0, 0.0
    started = time.perf_counter()
    for run_id in run_ids:
        series_refresh(run_id=run_id)
    elapsed = time.perf_counter() - started
    print(f"built {stale} rollups in {elapsed:.1f} s ({elapsed / stale * 1000:.0f} ms each)")
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM (ANALYZE) runs_metricseries, runs_metricsummary")
    return stale, elapsed


def timed(path: str, requests: int) -> dict[str, float]:
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client()
    for _ in range(3):
        response = client.get(path)
        assert response.status_code == 200, response.content[:300]
    with CaptureQueriesContext(connection) as captured:
        body = client.get(path).content
    queries = len(captured)
    times = []
    for _ in range(requests):
        started = time.perf_counter()
        response = client.get(path)
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200
    times.sort()
    return {
        "p50": statistics.median(times),
        "p95": times[min(len(times) - 1, round(0.95 * len(times)) - 1)],
        "max": times[-1],
        "queries": queries,
        "bytes": len(body),
        "gzip": len(gzip.compress(body, 6)),
    }


def page_under_load(args: argparse.Namespace, database_url: str) -> dict[str, float]:
    import pages

    pages.PORT = args.port
    server_args = argparse.Namespace(
        wsgi="marin_site.wsgi",
        port=args.port,
        workers=3,
        worker_class="sync",
        threads=1,
        database_url=database_url,
        cache_url=args.cache_url,
        page_cache_seconds=30,
    )
    server = pages.Server(server_args)
    server.start()
    try:
        path = f"/campaigns/{SLUG}/"
        status, body = pages.fetch(path)
        assert status == 200, body[:300]
        pages.run_python("warm-up", path, args.clients, 3)
        result = pages.run_python("campaign", path, args.clients, args.duration)
    finally:
        server.stop()
    return {
        "requests": result.requests,
        "rps": result.rps,
        "p50": result.p50_ms,
        "p99": result.p99_ms,
        "max": result.max_ms,
        "errors": result.errors,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--database", default="marin_bench_campaign")
    parser.add_argument("--cache-url", default="redis://127.0.0.1:6379/4")
    parser.add_argument("--steps", type=int, default=1_200_000)
    parser.add_argument("--keys", type=int, default=60)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--port", type=int, default=8714)
    parser.add_argument("--reseed", action="store_true")
    parser.add_argument("--skip-page", action="store_true")
    parser.add_argument("--no-record", action="store_true", help="do not write RESULTS.md")
    args = parser.parse_args()
    keys = key_names(args.keys)

    parts = urllib.parse.urlsplit(args.admin_url)
    database_url = f"{parts.scheme}://{parts.netloc}/{args.database}"
    ensure_database(args.admin_url, args.database)
    setup_django(database_url, args.cache_url)
    from runs.campaigns.models import Campaign, CampaignRun
    from runs.models import MetricSummary, Plan

    found = Campaign.objects.filter(slug=SLUG).first()
    if found is not None and args.reseed:
        plan_ids = set(
            CampaignRun.objects.filter(campaign=found).values_list("run__plan_id", flat=True)
        )
        Plan.objects.filter(pk__in=plan_ids).delete()
        found.delete()
        found = None
    seed_seconds = 0.0
    if found is None:
        seed_seconds = seed(database_url, args.steps, keys)
    run_ids = list(CampaignRun.objects.filter(campaign__slug=SLUG).values_list("run_id", flat=True))
    points = sum(MetricSummary.objects.filter(run_id__in=run_ids).values_list("count", flat=True))
    key_count = MetricSummary.objects.filter(run_id__in=run_ids).values("key").distinct().count()
    rollups, rollup_seconds = build_rollups()

    chart = timed(f"/api/v1/campaigns/{SLUG}/series/?points=500", args.requests)
    print(
        f"chart data ({points:,} points, {key_count} keys, {ATTEMPTS} attempts): "
        f"p50 {chart['p50']:.1f} ms, p95 {chart['p95']:.1f} ms, max {chart['max']:.1f} ms; "
        f"{chart['queries']:.0f} queries; {chart['bytes'] / 1e3:.0f} kB "
        f"({chart['gzip'] / 1e3:.0f} kB gzipped); target p95 < 150 ms: "
        f"{'met' if chart['p95'] < 150 else 'NOT met'}"
    )
    fresh = timed(f"/campaigns/{SLUG}/", max(10, args.requests // 5))
    print(
        f"page rendered in-process (no page cache): p50 {fresh['p50']:.1f} ms, p95 {fresh['p95']:.1f} ms, {fresh['queries']:.0f} queries"
    )
    page = None
    if not args.skip_page:
        page = page_under_load(args, database_url)
        print(
            f"page under {args.clients} anonymous clients, {args.duration:.0f} s: "
            f"{page['requests']:,} requests ({page['rps']:.0f}/s), p50 {page['p50']:.1f} ms, "
            f"p99 {page['p99']:.1f} ms, max {page['max']:.1f} ms, {page['errors']} errors; "
            f"target p99 < 100 ms: {'met' if page['p99'] < 100 and not page['errors'] else 'NOT met'}"
        )
    load = os.getloadavg()
    print(f"load average at the end: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}")
    if not args.no_record:
        record(
            args=args,
            points=points,
            key_count=key_count,
            chart=chart,
            fresh=fresh,
            page=page,
            seed_seconds=seed_seconds,
            rollups=(rollups, rollup_seconds),
            load=load,
        )
    return 0


def record(
    *,
    args: argparse.Namespace,
    points: int,
    key_count: int,
    chart: dict[str, float],
    fresh: dict[str, float],
    page: dict[str, float] | None,
    seed_seconds: float,
    rollups: tuple[int, float],
    load: tuple[float, float, float],
) -> None:
    command = " ".join(["    .venv/bin/python bench/campaign.py", *sys.argv[1:]]).rstrip()
    lines = [
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC. Machine: {machine_description()}; "
        f"load average at the end {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}"
        + (
            " (busier than the bench alone: other work ran beside it; rerun on a quiet one)."
            if load[1] > 1.5 * (os.cpu_count() or 1)
            else " (the bench's own load)."
        ),
        "",
        command,
        "",
        f"Data: one campaign of {ATTEMPTS} attempts (each restart resumes {OVERLAP:.0%} of the "
        f"steps early, so they overlap) x {key_count} keys, {args.steps:,} steps: "
        f"{points / 1e6:.1f}M points in `runs_metricpoint`"
        + (
            f", seeded with binary COPY in {seed_seconds:.0f} s"
            if seed_seconds
            else " (seeded earlier)"
        )
        + (
            f"; {rollups[0]} rollups built by the worker's refresh in {rollups[1]:.0f} s."
            if rollups[0]
            else "."
        ),
        "",
        "| measure | requests | p50 | p95 / p99 | max | queries | size | target |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
        f"| chart data `GET /api/v1/campaigns/<slug>/series/?points=500`, in-process | "
        f"{args.requests} | {chart['p50']:.1f} ms | p95 {chart['p95']:.1f} ms | "
        f"{chart['max']:.1f} ms | {chart['queries']:.0f} | {chart['bytes'] / 1e3:.0f} kB "
        f"({chart['gzip'] / 1e3:.0f} kB gz) | p95 < 150 ms: "
        f"{'met' if chart['p95'] < 150 else 'NOT met'} |",
        f"| page `/campaigns/<slug>/` rendered in-process, no page cache | "
        f"{max(10, args.requests // 5)} | {fresh['p50']:.1f} ms | p95 {fresh['p95']:.1f} ms | "
        f"{fresh['max']:.1f} ms | {fresh['queries']:.0f} | {fresh['bytes'] / 1e3:.0f} kB | – |",
    ]
    if page is not None:
        ok = page["p99"] < 100 and not page["errors"]
        lines.append(
            f"| page under {args.clients} anonymous clients, gunicorn -w 3, page cache on "
            f"Redis, {args.duration:.0f} s | {page['requests']:,} ({page['rps']:.0f}/s) | "
            f"{page['p50']:.1f} ms | p99 {page['p99']:.1f} ms | {page['max']:.1f} ms | – | – | "
            f"p99 < 100 ms: {'met' if ok else 'NOT met'} ({page['errors']} errors) |"
        )
    lines += [
        "",
        "How: the chart data reads the rollups `runs.series` keeps (at most 2048 buckets per "
        "run and key, one query for all the attempts' series in PostgreSQL's binary protocol), "
        "stitches the attempts (each keeps its buckets below the first step of every later "
        "attempt), and maps steps to tokens by the stitched `throughput/total_tokens`; no point "
        "is read. The page reads the summaries and the before/after of each intervention (a "
        "window of raw points, cached by the attempts' last steps); anonymous readers get it "
        "from the page cache (30 s), while the figures that move are polled from the chart data.",
    ]
    results_section_replace("campaign (bench/campaign.py)", lines)


if __name__ == "__main__":
    raise SystemExit(main())
