#!/usr/bin/env python
"""Time the search page with 10,000 proposals on PostgreSQL, through Django's test client.

    .venv/bin/python bench/search.py                        # seeds marin_bench_search once
    .venv/bin/python bench/search.py --repeat 50 --reseed

Steps: create the database if missing, migrate, seed it when its proposal count differs from
--proposals (bulk inserts: proposals with labels and outcomes, frozen plans with resolved
configs for the approved ones, a run per plan entry, eval/loss and train/loss summaries,
failed and crashed runs with a failure kind, baseline overrides on drafts), then for each
query of a fixed mix: warm up, request ``/search/?q=...`` --repeat times one after another
with DEBUG=0, and print p50, p95 and max of the server time (the test client runs the whole
Django stack in-process: middleware, view, SQL, template), the SQL queries per request and
the number of matches. A few API and export requests follow for information.

Exit status: 0 when every search page's p95 is under --target-p95-ms, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/marin_bench_search"

QUERIES = [
    "",
    "routing",
    '"capacity factor"',
    "experts tokens capacity",
    "outcome:did_not_work",
    "label:moe label:routing",
    "state IN (approved, submitted) label:(moe, data-mix)",
    "weight_decay>0.05",
    "eval/loss<3.2",
    "outcome:did_not_work label:moe recipe:tiny-moe weight_decay>0.05 eval/loss<3.2",
    "(router OR jitter) -label:moe failure:oom",
    "run:crashed OR failure:timeout",
    "author:bench-author-3 NOT outcome:none",
]
EXTRA = [  # (kind, path, parameters, requests)
    ("api", "/api/v1/search/", {"q": "label:moe weight_decay>0.05"}, 10),
    ("api", "/api/v1/search/", {"q": "routing"}, 10),
    ("csv", "/export/proposals.csv", {"q": "outcome:did_not_work label:moe"}, 10),
    ("csv", "/export/proposals.csv", {"q": ""}, 3),
    ("json", "/export/proposals.json", {"q": "label:moe"}, 3),
    ("archive", "/archive/", {}, 10),
    ("archive", "/archive/", {"show": "runs"}, 10),
]

LABELS = ["moe", "routing", "capacity", "data-mix", "optimizer", "scaling", "stability"]
LABELS += ["baseline", "tokenizer", "eval", "long-context", "distillation"]
TOPICS = [
    "top-2 routing",
    "capacity factor 1.25",
    "a larger code share",
    "z-loss 1e-4",
    "no warmup",
    "eight experts",
    "weight decay 0.1",
    "a math-heavy mix",
    "shared experts",
    "router jitter",
    "expert dropout",
    "a longer context",
]
PROSE = (
    "the router sends each token to its top experts and the load balancing loss keeps the "
    "experts busy while the capacity factor bounds how many tokens an expert may take per "
    "batch so a higher factor drops fewer tokens at the price of memory and we measure eval "
    "loss on paloma and the drop fraction at every scale of the ladder with two seeds "
    "learning rate schedules warmup cosine decay tokenizer vocabulary byte fallback long "
    "context rotary embeddings attention heads grouped queries sliding window data mixture "
    "web code math books arxiv deduplication quality filter classifier perplexity benchmark "
    "mmlu gsm8k humaneval throughput utilization accelerator pods sharding checkpoint restart "
    "divergence spikes gradient clipping normalization residual scaling muon adam optimizer "
    "momentum epsilon batch size critical noise scale upcycling distillation teacher student"
)
WORDS = PROSE.split()
STATES = ["draft"] * 10 + ["submitted"] * 25 + ["changes_requested"] * 10 + ["approved"] * 30
STATES += ["rejected"] * 10 + ["withdrawn"] * 8 + ["canceled"] * 7
OUTCOMES = ["worked", "promising", "mixed", "did_not_work", "inconclusive", "not_evaluated"]


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def ensure_database(url: str) -> None:
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = urlunsplit(("postgresql", parts.netloc, "/postgres", parts.query, ""))
    with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            log(f"creating database {name}")
            conn.execute(f'CREATE DATABASE "{name}"')  # the name comes from the command line


def setup_django(url: str) -> None:
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "marin_site.settings",
            "DATABASE_URL": url,
            "DEBUG": "0",
            "SECRET_KEY": os.environ.get("SECRET_KEY") or "bench-search-not-a-secret-" + "x" * 40,
            "ALLOWED_HOSTS": "testserver",
            "SECURE_COOKIES": "0",
            "LOG_LEVEL": "WARNING",
            "PAGE_CACHE_SECONDS": "0",
        }
    )
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def sentence(rng: random.Random, n: int) -> str:
    """Runs of 2 to 6 consecutive words from random places: phrases recur, not everywhere."""
    words: list[str] = []
    while len(words) < n:
        start = rng.randrange(len(WORDS))
        words += [WORDS[(start + i) % len(WORDS)] for i in range(rng.randint(2, 6))]
    return " ".join(words[:n]).capitalize() + "."


def seed(count: int) -> None:  # noqa: PLR0915 (one linear recipe)
    from django.contrib.auth.models import User
    from django.db import transaction
    from django.utils import timezone

    from proposals.models import Label, Proposal
    from runs.models import MetricSummary, Plan, PlanEntry, Recipe, Run
    from runs.recipes.demo import DEMO_RECIPES

    rng = random.Random(20261203)
    now = timezone.now()
    with transaction.atomic():
        Proposal.objects.all().delete()
        Run.objects.all().delete()
        Plan.objects.all().delete()
        recipes = []
        for spec in DEMO_RECIPES:
            fields = {k: spec[k] for k in ("title", "description", "command_template")}
            fields |= {k: spec[k] for k in ("default_config", "parameter_schema")}
            fields |= {"compute_model": spec["compute_model"], "scales": spec["scales"]}
            recipe, _ = Recipe.objects.update_or_create(
                name=spec["name"], version=spec["version"], defaults=fields
            )
            recipes.append(recipe)
        authors = [User.objects.get_or_create(username=f"bench-author-{i}")[0] for i in range(8)]
        labels = [Label.objects.get_or_create(name=name)[0] for name in LABELS]

        proposals = []
        for i in range(count):
            state = rng.choice(STATES)
            concluded = state in {"approved", "canceled"} and rng.random() < 0.7
            recipe = recipes[0] if rng.random() < 0.8 else recipes[1]
            baseline = {}
            if state in {"draft", "submitted"} and recipe is recipes[0] and rng.random() < 0.5:
                baseline = {"weight_decay": rng.choice([0.0, 0.05, 0.1, 0.2])}
            proposals.append(
                Proposal(
                    title=f"Try {rng.choice(TOPICS)} ({i})",
                    summary=sentence(rng, 12),
                    description="\n\n".join(sentence(rng, rng.randint(15, 40)) for _ in range(4)),
                    hypothesis=sentence(rng, 20),
                    success_metric="eval/loss",
                    recipe=recipe,
                    baseline=baseline,
                    author=rng.choice(authors),
                    state=state,
                    outcome=rng.choice(OUTCOMES) if concluded else "",
                    confidence=rng.choice(["exploratory", "replicated", "stable"])
                    if concluded
                    else "",
                    concluded_at=now if concluded else None,
                    budget_accelerator_hours=rng.choice([None, 10.0, 100.0]),
                )
            )
        Proposal.objects.bulk_create(proposals, batch_size=1000)
        log(f"seeded {count} proposals")

        through = Proposal.labels.through
        links = []
        for proposal in proposals:
            for label in rng.sample(labels, rng.randint(0, 3)):
                links.append(through(proposal_id=proposal.pk, label_id=label.pk))
        through.objects.bulk_create(links, batch_size=5000)

        approved = [p for p in proposals if p.state in {"approved", "canceled"}]
        default = recipes[0].default_config
        plans = [
            Plan(
                recipe=p.recipe,
                recipe_snapshot={"name": p.recipe.name},
                baseline={},
                run_count=4,
                total_flops=1e18,
                total_accelerator_hours=4.0,
            )
            for p in approved
        ]
        Plan.objects.bulk_create(plans, batch_size=1000)
        for proposal, plan in zip(approved, plans, strict=True):
            proposal.plan = plan
        Proposal.objects.bulk_update(approved, ["plan"], batch_size=1000)
        entries = []
        for plan in plans:
            for index, wd in enumerate([0.0, 0.05, 0.1, 0.2][: rng.randint(2, 4)]):
                config = {**default, "weight_decay": wd, "top_k": rng.choice([1, 2])}
                entries.append(
                    PlanEntry(
                        plan=plan,
                        index=index,
                        config=config,
                        config_hash=f"{plan.pk:08d}{index:04d}",
                        is_baseline=index == 0,
                        flops=1e17,
                        accelerator_hours=1.0,
                    )
                )
        PlanEntry.objects.bulk_create(entries, batch_size=2000)
        runs = []
        for entry in entries:
            roll = rng.random()
            state = "finished" if roll < 0.85 else "failed" if roll < 0.95 else "crashed"
            failure = "" if state == "finished" else rng.choice(["oom", "timeout", "infra", "code"])
            runs.append(
                Run(
                    plan_id=entry.plan_id,
                    entry=entry,
                    recipe_name="tiny-moe",
                    recipe_version="1",
                    config=entry.config,
                    config_hash=entry.config_hash,
                    state=state,
                    failure_kind=failure,
                    finished_at=now,
                )
            )
        Run.objects.bulk_create(runs, batch_size=2000)
        summaries = []
        for run in runs:
            if run.state == "finished":
                loss = round(rng.uniform(2.8, 4.0), 3)
                summaries.append(
                    MetricSummary(run=run, key="eval/loss", last=loss, min=loss, max=9, step=200)
                )
                summaries.append(
                    MetricSummary(
                        run=run, key="train/loss", last=loss - 0.1, min=1, max=9, step=200
                    )
                )
        MetricSummary.objects.bulk_create(summaries, batch_size=5000)
        log(
            f"seeded {len(links)} label links, {len(plans)} plans, {len(entries)} entries, "
            f"{len(runs)} runs, {len(summaries)} metric summaries"
        )
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(fraction * len(ordered)) - 1)]


def measure(client: Any, path: str, params: dict[str, str], repeat: int) -> dict[str, Any]:
    from django.db import connection

    for _ in range(3):
        response = client.get(path, params)
        if response.streaming:
            b"".join(response.streaming_content)
    queries: list[str] = []

    def count(execute: Any, sql: str, *args: Any) -> Any:
        queries.append(sql)
        return execute(sql, *args)

    with connection.execute_wrapper(count):
        response = client.get(path, params)
        body = b"".join(response.streaming_content) if response.streaming else response.content
    timings = []
    for _ in range(repeat):
        start = time.perf_counter()
        response = client.get(path, params)
        if response.streaming:
            b"".join(response.streaming_content)
        timings.append((time.perf_counter() - start) * 1000)
    matches = "?"
    if path == "/search/":
        from proposals.query_language import parse_query
        from proposals.search import proposal_search

        matches = str(proposal_search(query=parse_query(params["q"])).proposals.count())
    elif path.startswith("/api/"):
        matches = str(response.json()["count"])
    elif path.endswith(".csv"):
        matches = str(body.count(b"\n") - 1)
    elif path.endswith(".json"):
        matches = str(len(json.loads(body)["results"]))
    return {
        "status": response.status_code,
        "p50": statistics.median(timings),
        "p95": percentile(timings, 0.95),
        "max": max(timings),
        "queries": len(queries),
        "matches": matches,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DB))
    parser.add_argument("--proposals", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--target-p95-ms", type=float, default=200.0)
    parser.add_argument("--reseed", action="store_true")
    args = parser.parse_args()

    ensure_database(args.database_url)
    setup_django(args.database_url)
    from django.core.management import call_command
    from django.test import Client

    from proposals.models import Proposal

    call_command("migrate", verbosity=0)
    if args.reseed or Proposal.objects.count() != args.proposals:
        seed(args.proposals)

    client = Client()
    print(f"\nsearch page, {Proposal.objects.count():,} proposals, {args.repeat} requests each")
    print(
        f"| query | matches | queries | p50 (ms) | p95 (ms) | max (ms) | p95 < {args.target_p95_ms:g} ms |"
    )
    print("|---|---:|---:|---:|---:|---:|---|")
    met = True
    for query in QUERIES:
        row = measure(client, "/search/", {"q": query}, args.repeat)
        assert row["status"] == 200, (query, row)
        ok = row["p95"] < args.target_p95_ms
        met &= ok
        shown = f"`{query}`" if query else "(empty)"
        print(
            f"| {shown} | {row['matches']} | {row['queries']} | {row['p50']:.1f} | "
            f"{row['p95']:.1f} | {row['max']:.1f} | {'yes' if ok else 'no'} |"
        )
    print("\nfor information")
    print("| request | matches | queries | p50 (ms) | p95 (ms) | max (ms) |")
    print("|---|---:|---:|---:|---:|---:|")
    for kind, path, params, repeat in EXTRA:
        row = measure(client, path, params, repeat)
        assert row["status"] == 200, (path, params, row)
        shown = path + ("?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else "")
        print(
            f"| {kind} `{shown}` | {row['matches']} | {row['queries']} | {row['p50']:.1f} | "
            f"{row['p95']:.1f} | {row['max']:.1f} |"
        )
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
