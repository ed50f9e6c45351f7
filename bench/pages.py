#!/usr/bin/env python
"""Load-test three read pages of marin-site behind gunicorn, on PostgreSQL, with DEBUG=0.

    .venv/bin/python bench/pages.py                      # 10,000 proposals, 32 clients, 20 s a page
    .venv/bin/python bench/pages.py --proposals 2000 --duration 5 --loader python
    .venv/bin/python bench/pages.py --signed-in          # as signed-in users: no page cache

With ``--signed-in`` every client is a real user's session: before the load, each client
signs in once through the login form (``/accounts/login/``, CSRF token and password, as a
browser does) and sends its own session cookie on every request. The clients are spread
over several distinct users (a maintainer, reviewers and authors, among them the detail
page's author), so the pages show each of them their own header, CSRF token and controls,
and the public page cache (anonymous readers only) never answers.

Steps: create the database if missing, migrate, seed it (bulk_create, only when the
proposal count differs from --proposals), collectstatic, start gunicorn on 127.0.0.1, wait
until it answers, then drive ``/``, one proposal page and ``/api/v1/proposals/`` one after
another with --clients concurrent keep-alive clients for --duration seconds each. ``wrk``
is used when installed (its latency histogram records every request; a Lua hook counts
every status), otherwise a thread-per-client ``http.client`` loop that keeps every
latency. Prints requests/s, p50, p99, errors and whether p99 < --target-p99-ms with no
errors. Gunicorn is always stopped at the end.

Before each warm-up and each measured run it waits (up to --settle-timeout) for the CPUs
to be idle for 3 s, so the backlog of the previous run, or someone else's test suite on a
shared machine, is not billed to the page; the report shows the CPU seconds that gunicorn,
PostgreSQL, the load generator and anything else used during each run.

Exit status: 0 when every page answered without errors (whether or not it met the
target), 1 when a page had errors (non-2xx or socket errors), 2 on a crash.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import http.client
import json
import math
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"
GUNICORN = ROOT / ".venv" / "bin" / "gunicorn"
HOST = "127.0.0.1"  # the load only ever goes here
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/marin_bench"
REQUEST_TIMEOUT = 30  # seconds; a slower answer counts as an error (timeout)
BENCH_PREFIX = "bench-"  # usernames of the seeded accounts
# The password the bench sets on its own seeded accounts (bench database only) for --signed-in.
BENCH_PASSWORD = "bench-pages-password-not-a-secret"
BENCH_MAINTAINER = f"{BENCH_PREFIX}maintainer"

# Re-run under the project's virtualenv when started with another interpreter.
if (
    Path(sys.prefix).resolve() != (ROOT / ".venv").resolve()
    and VENV_PYTHON.exists()
    and os.environ.get("MARIN_BENCH_REEXEC") != "1"
):
    os.environ["MARIN_BENCH_REEXEC"] = "1"
    os.execv(str(VENV_PYTHON), [str(VENV_PYTHON), str(Path(__file__).resolve()), *sys.argv[1:]])


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- machine


def machine_info() -> dict[str, Any]:
    cpu_model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    mem_gb = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    return {
        "nproc": os.cpu_count(),
        "nproc_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": cpu_model,
        "mem_gb": mem_gb,
        "python": sys.version.split()[0],
    }


def load_average() -> str:
    with contextlib.suppress(OSError):
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "?"


def code_version() -> str:
    """The commit measured (and whether the work tree differs from it)."""
    try:
        head = subprocess.run(
            ["git", "log", "-1", "--format=%h %s"],
            check=False,
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            check=False,
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "?"
    return f"{head[:90]}{' (+ uncommitted changes)' if dirty else ''}"


def cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs, from /proc/stat."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user
    return total - idle, total


def process_ticks() -> dict[int, tuple[str, int, int]]:
    """pid -> (command name, process group, user+system clock ticks), from /proc."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        rest = raw[raw.rindex(")") + 2 :].split()
        out[int(entry)] = (comm, int(rest[2]), int(rest[11]) + int(rest[12]))
    return out


def cpu_split(
    before: dict[int, tuple[str, int, int]],
    after: dict[int, tuple[str, int, int]],
    server_pgid: int,
) -> dict[str, float]:
    """CPU seconds spent during a run by gunicorn, PostgreSQL, the load generator and the rest."""
    hz = os.sysconf("SC_CLK_TCK")
    split = {"gunicorn": 0.0, "postgres": 0.0, "loader": 0.0, "other": 0.0}
    others: dict[str, float] = {}
    for pid, (comm, pgid, ticks) in after.items():
        prior = before.get(pid)
        used = ticks - (prior[2] if prior and prior[0] == comm else 0)
        if pgid == server_pgid:
            key = "gunicorn"
        elif comm == "postgres":
            key = "postgres"
        elif comm == "wrk" or pid == os.getpid():
            key = "loader"
        else:
            key = "other"
            others[comm] = others.get(comm, 0.0) + used / hz
        split[key] += used / hz
    result = {k: round(v, 1) for k, v in split.items()}
    top = sorted(others.items(), key=lambda kv: -kv[1])[:3]
    result |= {f"  other:{comm}": round(sec, 1) for comm, sec in top if sec >= 0.5}
    return result


# ----------------------------------------------------------------------------- database


def ensure_database(url: str) -> None:
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    if not name:
        raise SystemExit(f"--database-url needs a database name: {url}")
    admin = urlunsplit(("postgresql", parts.netloc, "/postgres", parts.query, ""))
    with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            log(f"creating database {name}")
            conn.execute(f'CREATE DATABASE "{name}"')  # name comes from the command line


def django_env(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "marin_site.settings",
            "DATABASE_URL": args.database_url,
            "DEBUG": "0",
            "SECRET_KEY": os.environ.get("SECRET_KEY") or "bench-pages-not-a-secret-" + "x" * 40,
            "ALLOWED_HOSTS": "127.0.0.1,localhost,testserver",
            "SECURE_COOKIES": "0",
            "LOG_LEVEL": os.environ.get("LOG_LEVEL", "WARNING"),
            "CACHE_URL": args.cache_url,
            "PAGE_CACHE_SECONDS": str(args.page_cache_seconds),
        }
    )
    return env


def manage(args: argparse.Namespace, *command: str) -> None:
    cmd = [sys.executable, str(ROOT / "manage.py"), *command]
    log("$ " + shlex.join(cmd[1:]))
    subprocess.run(cmd, cwd=ROOT, env=django_env(args), check=True, stdout=subprocess.DEVNULL)


def setup_django(args: argparse.Namespace) -> None:
    os.environ.update(django_env(args))
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


# ----------------------------------------------------------------------------- seeding

LABELS = [
    "moe",
    "routing",
    "capacity",
    "data-mix",
    "optimizer",
    "scaling",
    "stability",
    "baseline",
    "tokenizer",
    "eval",
    "long-context",
    "distillation",
]
SPECS = {
    "tiny-moe": [
        "axes:\n  top_k: [1, 2]\nseeds: [0, 1]\n",
        "axes:\n  capacity_factor: [1.0, 1.25]\n  weight_decay: [0.0, 0.1]\nscales: [small]\nseeds: [0]\n",
        "axes:\n  weight_decay: [0.0, 0.05, 0.1]\nscales: [small, medium, large]\n",
        "axes:\n  learning_rate: [0.003, 0.006]\n",
        "axes:\n  num_experts: [4, 8]\nseeds: [0, 1]\n",
    ],
    "marin-moe": [
        "axes:\n  z_loss: [0.0, 0.0001]\nscales: [8b]\n",
        "axes:\n  capacity_factor: [1.0, 1.25]\nscales: [1b]\nseeds: [0, 1]\n",
        "axes:\n  warmup_fraction: [0.0, 0.01]\nscales: [1b]\n",
    ],
}
# Share of each state among the seeded proposals (draft .. canceled).
STATE_WEIGHTS = {
    "draft": 10,
    "submitted": 25,
    "changes_requested": 10,
    "approved": 30,
    "rejected": 10,
    "withdrawn": 8,
    "canceled": 7,
}
TOPICS = [
    "top-2 routing",
    "capacity factor 1.25",
    "a larger code share",
    "z-loss 1e-4",
    "no warmup",
    "eight experts",
    "weight decay 0.1",
    "a math-heavy mix",
    "twice the tokens",
    "shared experts",
    "router jitter",
    "expert dropout",
    "a longer context",
    "muP init",
]
WORDS = [
    "the",
    "router",
    "sends",
    "each",
    "token",
    "to",
    "its",
    "top",
    "experts",
    "and",
    "the",
    "load",
    "balancing",
    "loss",
    "keeps",
    "the",
    "experts",
    "busy",
    "while",
    "the",
    "capacity",
    "factor",
    "bounds",
    "how",
    "many",
    "tokens",
    "an",
    "expert",
    "may",
    "take",
    "per",
    "batch",
    "so",
    "a",
    "higher",
    "factor",
    "drops",
    "fewer",
    "tokens",
    "at",
    "the",
    "price",
    "of",
    "memory",
    "and",
    "we",
    "measure",
    "eval",
    "loss",
    "on",
    "paloma",
    "and",
    "the",
    "drop",
    "fraction",
    "at",
    "every",
    "scale",
    "of",
    "the",
    "ladder",
    "with",
    "two",
    "seeds",
]


def sentence(rng: random.Random, n: int) -> str:
    start = rng.randrange(len(WORDS))
    words = [WORDS[(start + i) % len(WORDS)] for i in range(n)]
    return " ".join(words).capitalize() + "."


def description(rng: random.Random) -> str:
    """Markdown of roughly 0.6-2 kB: a heading, paragraphs, a list, sometimes code or a table."""
    parts = [
        "## Motivation",
        " ".join(sentence(rng, rng.randint(10, 25)) for _ in range(rng.randint(2, 4))),
    ]
    parts.append("## Plan")
    parts.append(
        "\n".join(f"- {sentence(rng, rng.randint(5, 12))}" for _ in range(rng.randint(2, 5)))
    )
    if rng.random() < 0.5:
        parts.append("```yaml\naxes:\n  capacity_factor: [1.0, 1.25]\nseeds: [0, 1]\n```")
    if rng.random() < 0.3:
        parts.append(
            "| scale | tokens | hours |\n|---|---|---|\n| small | 2M | 0.1 |\n| medium | 8M | 0.4 |"
        )
    parts.append(" ".join(sentence(rng, rng.randint(8, 20)) for _ in range(rng.randint(1, 3))))
    return "\n\n".join(parts)


@contextlib.contextmanager
def explicit_timestamps(*models: Any):
    """Let bulk_create store the given created_at/updated_at instead of now()."""
    saved = []
    for model in models:
        for f in model._meta.concrete_fields:
            if getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False):
                saved.append((f, f.auto_now, f.auto_now_add))
                f.auto_now = f.auto_now_add = False
    try:
        yield
    finally:
        for f, auto_now, auto_now_add in saved:
            f.auto_now, f.auto_now_add = auto_now, auto_now_add


def truncate_proposals() -> None:
    from django.db import connection

    from proposals.models import Amendment, Comment, Event, Proposal, Review

    tables = [m._meta.db_table for m in (Proposal, Review, Event, Comment, Amendment)]
    tables.append(Proposal.labels.through._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")


def seed(  # noqa: PLR0915 (one straight-line recipe)
    target: int, reviews_per: int, events_per: int, reseed: bool
) -> dict[str, int]:
    from django.contrib.auth import get_user_model
    from django.contrib.auth.hashers import make_password
    from django.db import connection, transaction
    from django.utils import timezone

    from marin_site.doors import Door
    from proposals.models import Event, Label, Outcome, Proposal, Review, State
    from runs.models import Recipe
    from runs.recipes.demo import DEMO_RECIPES
    from runs.services.recipes import recipe_create

    have = Proposal.objects.count()
    if reseed or have > target:
        log(f"truncating {have} proposals (reseed)")
        truncate_proposals()
        have = 0
    if have == target:
        log(f"database already holds {have} proposals; not seeding")
        return counts()

    started = time.perf_counter()
    user_model = get_user_model()
    rng = random.Random(20240601 + have)
    with transaction.atomic():
        password = make_password(None)
        names = [f"{BENCH_PREFIX}author{i}" for i in range(1, 9)] + [
            f"{BENCH_PREFIX}reviewer{i}" for i in range(1, 5)
        ]
        existing = set(
            user_model.objects.filter(username__in=names).values_list("username", flat=True)
        )
        user_model.objects.bulk_create(
            [
                user_model(username=n, email=f"{n}@example.org", password=password)
                for n in names
                if n not in existing
            ]
        )
        users = {u.username: u for u in user_model.objects.filter(username__in=names)}
        authors = [users[n] for n in names if "author" in n]
        reviewers = [users[n] for n in names if "reviewer" in n]

        recipes = []
        for data in DEMO_RECIPES:
            recipe = Recipe.objects.filter(name=data["name"], version=data["version"]).first()
            recipes.append(recipe or recipe_create(actor=None, data=dict(data)))

        Label.objects.bulk_create([Label(name=n) for n in LABELS], ignore_conflicts=True)
        labels = list(Label.objects.filter(name__in=LABELS))

        states = list(STATE_WEIGHTS)
        weights = [STATE_WEIGHTS[s] for s in states]
        outcomes = [o.value for o in Outcome]
        now = timezone.now()
        span = dt.timedelta(days=730)
        todo = target - have
        log(f"seeding {todo} proposals ({reviews_per} reviews, {events_per} events each)")
        with explicit_timestamps(Proposal, Review, Event):
            proposals = []
            for i in range(todo):
                recipe = rng.choice(recipes)
                state = rng.choices(states, weights)[0]
                created = now - span * rng.random()
                decided = created + dt.timedelta(days=rng.uniform(1, 20))
                outcome = ""
                if state in {State.APPROVED, State.CANCELED} and rng.random() < 0.5:
                    outcome = rng.choice(outcomes)
                topic = rng.choice(TOPICS)
                proposals.append(
                    Proposal(
                        title=f"{topic.capitalize()} for the {recipe.name} (#{have + i + 1})",
                        summary=f"Does {topic} lower eval loss at equal compute?",
                        description=description(rng),
                        hypothesis=f"{topic.capitalize()} lowers eval loss by at least 0.01. "
                        + sentence(rng, 15),
                        success_metric="eval/paloma/macro_loss",
                        success_direction="lower",
                        success_threshold=0.01,
                        recipe=recipe,
                        baseline={},
                        ablation_spec=rng.choice(SPECS.get(recipe.name) or SPECS["tiny-moe"]),
                        budget_accelerator_hours=rng.choice([None, 10.0, 100.0, 5000.0]),
                        author=rng.choice(authors),
                        state=state,
                        submitted_at=None
                        if state == State.DRAFT
                        else created + dt.timedelta(hours=2),
                        decided_at=decided
                        if state in {State.APPROVED, State.REJECTED, State.CANCELED}
                        else None,
                        outcome=outcome,
                        conclusion=sentence(rng, 20) if outcome else "",
                        confidence=rng.choice(["exploratory", "replicated", "stable"])
                        if outcome
                        else "",
                        concluded_at=decided + dt.timedelta(days=10) if outcome else None,
                        created_at=created,
                        updated_at=decided,
                    )
                )
            Proposal.objects.bulk_create(proposals, batch_size=2000)

            through = Proposal.labels.through
            links = [
                through(proposal_id=p.pk, label_id=label.pk)
                for p in proposals
                for label in rng.sample(labels, rng.randint(1, 3))
            ]
            through.objects.bulk_create(links, batch_size=5000)

            reviews, events = [], []
            for p in proposals:
                t = p.created_at
                if p.state != State.DRAFT:
                    for reviewer in rng.sample(reviewers, min(reviews_per, len(reviewers))):
                        score = rng.randint(1, 5)
                        rec = (
                            "approve"
                            if score >= 4
                            else ("request_changes" if score >= 2 else "reject")
                        )
                        when = t + dt.timedelta(hours=rng.uniform(3, 48))
                        reviews.append(
                            Review(
                                proposal_id=p.pk,
                                reviewer=reviewer,
                                score=score,
                                recommendation=rec,
                                text=sentence(rng, rng.randint(10, 40)),
                                created_at=when,
                                updated_at=when,
                            )
                        )
                path = [("created", "", State.DRAFT)]
                if p.state == State.DRAFT:
                    path += [("edited", "", "")] * (events_per - 1)
                else:
                    path.append(("submitted", State.DRAFT, State.SUBMITTED))
                    if p.state != State.SUBMITTED:
                        path.append((p.state.replace("_", " "), State.SUBMITTED, p.state))
                    path += [("edited", "", "")] * max(0, events_per - len(path))
                for k, (verb, src, dst) in enumerate(path[:events_per]):
                    events.append(
                        Event(
                            proposal_id=p.pk,
                            actor=p.author if k < 2 else rng.choice(reviewers),
                            actor_label="",
                            verb=verb,
                            from_state=src,
                            to_state=dst,
                            message=sentence(rng, 8) if k == 2 else "",
                            door=Door.WEB,
                            created_at=t + dt.timedelta(hours=k * 5),
                        )
                    )
            Review.objects.bulk_create(reviews, batch_size=5000)
            Event.objects.bulk_create(events, batch_size=5000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    result = counts()
    log(f"seeded in {time.perf_counter() - started:.1f} s: {result}")
    return result


def counts() -> dict[str, int]:
    from proposals.models import Event, Label, Proposal, Review

    return {
        "proposals": Proposal.objects.count(),
        "reviews": Review.objects.count(),
        "events": Event.objects.count(),
        "labels": Label.objects.count(),
        "label_links": Proposal.labels.through.objects.count(),
    }


BOARD_PREFIX = "bench-board-"  # the recipe names, plans and track slugs of the seeded board


def seed_board(entries: int, tracks: int, reseed: bool) -> dict[str, int]:
    """``entries`` finished runs over ``tracks`` board tracks (one recipe name each, the runs
    shared evenly), of every origin, ranked by ``runs.board.rank`` as a finished run would
    rank them; only when the seeded board differs from what is asked.

    Each run is a bulk-created row with Marin's figures as its final metrics; a tenth are
    imported, a tenth claimed, the rest launched at a pinned commit (verified). The tracks
    cycle through the board's rules (threshold, lowest, effective speedup)."""
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction

    from runs.board.models import BoardEntry, BoardTrack, TrackRule
    from runs.board.rank import track_rank
    from runs.models import Plan, PlanEntry, Recipe, Run, RunOrigin, RunState

    have = BoardEntry.objects.filter(track__slug__startswith=BOARD_PREFIX).count()
    seeded_tracks = BoardTrack.objects.filter(slug__startswith=BOARD_PREFIX).count()
    if not reseed and seeded_tracks == tracks and have == entries:
        log(f"board already holds {have} entries over {seeded_tracks} tracks; not seeding")
        return {"board_tracks": seeded_tracks, "board_entries": have}
    started = time.perf_counter()
    rng = random.Random(20261206)
    with transaction.atomic():
        BoardTrack.objects.filter(slug__startswith=BOARD_PREFIX).delete()
        Run.objects.filter(recipe_name__startswith=BOARD_PREFIX).delete()
        Plan.objects.filter(spec_text__startswith=BOARD_PREFIX).delete()
        recipe = Recipe.objects.order_by("pk").first()
        if recipe is None:
            raise SystemExit("no recipe to hang the board's plans on (seed the proposals first)")
        claimant = (
            get_user_model()
            .objects.filter(username__startswith=BENCH_PREFIX)
            .order_by("pk")
            .first()
        )
        now = dt.datetime.now(dt.UTC)
        per_track = [entries // tracks + (1 if i < entries % tracks else 0) for i in range(tracks)]
        rules = [TrackRule.SPEEDRUN_THRESHOLD, TrackRule.LOWEST, TrackRule.EFFECTIVE_SPEEDUP]
        for t, count in enumerate(per_track):
            name = f"{BOARD_PREFIX}{t}"
            plan = Plan.objects.create(
                recipe=recipe,
                recipe_snapshot={"name": name, "version": "1"},
                spec_text=f"{BOARD_PREFIX}{t}",
                run_count=count,
                total_flops=0.0,
                total_accelerator_hours=0.0,
            )
            plan_entries = PlanEntry.objects.bulk_create(
                [
                    PlanEntry(
                        plan=plan,
                        index=i,
                        config={"i": i},
                        config_hash=f"{t:04d}{i:060d}",
                        flops=10 ** rng.uniform(17, 20),
                        accelerator_hours=1.0,
                    )
                    for i in range(count)
                ],
                batch_size=2000,
            )
            runs = []
            for i, entry in enumerate(plan_entries):
                origin = (
                    RunOrigin.IMPORTED
                    if i % 10 == 0
                    else RunOrigin.CLAIMED
                    if i % 10 == 1
                    else RunOrigin.LAUNCHED
                )
                flops = entry.flops
                bpb = 0.75 + 40.0 * flops**-0.1 + rng.uniform(0.0, 0.15)  # 1.1 to 1.7
                runs.append(
                    Run(
                        plan=plan,
                        entry=entry,
                        recipe_name=name,
                        recipe_version="1",
                        config=entry.config,
                        config_hash=entry.config_hash,
                        state=RunState.FINISHED,
                        origin=origin,
                        git_sha=""
                        if origin == RunOrigin.IMPORTED
                        else f"{rng.getrandbits(160):040x}",
                        git_clean=True,
                        executor="local" if origin == RunOrigin.LAUNCHED else "",
                        claimed_by=claimant if origin == RunOrigin.CLAIMED else None,
                        claim_where="a lab workstation" if origin == RunOrigin.CLAIMED else "",
                        imported_from=f"wandb:marin/speedrun/{t}-{i}"
                        if origin == RunOrigin.IMPORTED
                        else "",
                        tracker_tags={"author": "Ada", "description": sentence(rng, 8)}
                        if origin == RunOrigin.IMPORTED
                        else {},
                        final_metrics={
                            "eval/paloma/c4_en/bpb": bpb,
                            "model_flops": flops,
                            "training_hardware_flops": flops * 2.2,
                            "training_time": flops / 1e15,
                            "model_size": 1.3e8,
                        },
                        finished_at=now - dt.timedelta(minutes=i),
                    )
                )
            Run.objects.bulk_create(runs, batch_size=2000)
            rule = rules[t % len(rules)]
            parameters: dict[str, Any] = {
                TrackRule.SPEEDRUN_THRESHOLD: {"threshold": 1.8},  # every seeded run reaches it
                TrackRule.LOWEST: {},
                TrackRule.EFFECTIVE_SPEEDUP: {
                    "asymptote": 0.7,
                    "alpha": 0.1,
                    "baseline_budget": 1e18,
                    "baseline_loss": 1.4,
                },
            }[rule]
            track = BoardTrack.objects.create(
                slug=name,
                title=f"Bench track {t} ({rule})",
                recipe_name=name,
                metric="eval/paloma/c4_en/bpb",
                rule=rule,
                parameters=parameters,
                position=100 + t,
            )
            track_rank(track)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    have = BoardEntry.objects.filter(track__slug__startswith=BOARD_PREFIX).count()
    log(
        f"seeded the board in {time.perf_counter() - started:.1f} s: {have} entries, {tracks} tracks"
    )
    return {"board_tracks": tracks, "board_entries": have}


def pick_detail_proposal() -> int:
    """A submitted proposal with reviews and events (its page also renders the plan preview)."""
    from django.db.models import Count

    from proposals.models import Proposal, State

    qs = (
        Proposal.objects.annotate(
            rc=Count("reviews", distinct=True), ec=Count("events", distinct=True)
        )
        .filter(rc__gte=1, ec__gte=1)
        .order_by("-rc", "-ec", "-created_at")
    )
    chosen = qs.filter(state=State.SUBMITTED).values_list("pk", flat=True).first()
    chosen = chosen or qs.values_list("pk", flat=True).first()
    if chosen is None:
        raise SystemExit("no proposal with reviews and events to benchmark")
    return int(chosen)


def bench_accounts(detail_id: int) -> list[tuple[str, str]]:
    """The signed-in users of --signed-in, as (username, role), with a known password.

    A maintainer, the four seeded reviewers, the detail page's author and the other seeded
    authors: each sees their own controls on the detail page (approve and reject, the review
    form, edit and withdraw, or only the comment form)."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.db import transaction

    from marin_site.roles import ROLE_MAINTAINER, ROLE_REVIEWER
    from proposals.models import Proposal

    user_model = get_user_model()
    author = Proposal.objects.select_related("author").get(pk=detail_id).author.get_username()
    names = [BENCH_MAINTAINER, *(f"{BENCH_PREFIX}reviewer{i}" for i in range(1, 5)), author]
    names += sorted(
        n
        for n in user_model.objects.filter(username__startswith=f"{BENCH_PREFIX}author")
        .exclude(username=author)
        .values_list("username", flat=True)
    )
    roles = {}
    with transaction.atomic():
        groups = {
            r: Group.objects.get_or_create(name=r)[0] for r in (ROLE_REVIEWER, ROLE_MAINTAINER)
        }
        for name in names:
            user, _ = user_model.objects.get_or_create(
                username=name, defaults={"email": f"{name}@example.org"}
            )
            if not user.check_password(BENCH_PASSWORD):
                user.set_password(BENCH_PASSWORD)
                user.save(update_fields=["password"])
            if name == BENCH_MAINTAINER:
                user.groups.add(groups[ROLE_MAINTAINER])
                roles[name] = "maintainer"
            elif "reviewer" in name:
                user.groups.add(groups[ROLE_REVIEWER])
                roles[name] = "reviewer"
            else:
                roles[name] = "author of the detail page" if name == author else "contributor"
    return [(n, roles[n]) for n in names]


def sign_in(username: str, timeout: float = 120) -> str:
    """Sign in through the login form as a browser does; return the Cookie header to send.

    The form asks for its CSRF token first. The site limits sign-ins per address (30 a
    minute), so a 429 waits and tries again."""
    import re
    from http.cookies import SimpleCookie
    from urllib.parse import urlencode

    deadline = time.monotonic() + timeout
    while True:
        conn = http.client.HTTPConnection(HOST, PORT, timeout=REQUEST_TIMEOUT)
        try:
            conn.request("GET", "/accounts/login/")
            form = conn.getresponse()
            html = form.read().decode()
            jar = SimpleCookie()
            for header in form.headers.get_all("Set-Cookie") or []:
                jar.load(header)
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
            if form.status != 200 or token is None or "csrftoken" not in jar:
                raise RuntimeError(f"login form: status {form.status}, no CSRF token")
            csrf = jar["csrftoken"].value
            body = urlencode(
                {"login": username, "password": BENCH_PASSWORD, "csrfmiddlewaretoken": token[1]}
            )
            conn.request(
                "POST",
                "/accounts/login/",
                body=body,
                headers={
                    "Content-Type": "application/x-www-form-urlencoded",
                    "Cookie": f"csrftoken={csrf}",
                    "Referer": f"http://{HOST}:{PORT}/accounts/login/",
                },
            )
            answer = conn.getresponse()
            answer.read()
            for header in answer.headers.get_all("Set-Cookie") or []:
                jar.load(header)
        finally:
            conn.close()
        if answer.status == 302 and "sessionid" in jar:
            return f"sessionid={jar['sessionid'].value}; csrftoken={jar['csrftoken'].value}"
        if answer.status == 429 and time.monotonic() < deadline:
            log(f"sign-in of {username} rate-limited (429); waiting 5 s")
            time.sleep(5)
            continue
        raise RuntimeError(f"sign-in of {username} failed: status {answer.status}")


def sign_in_clients(accounts: list[tuple[str, str]], clients: int) -> list[tuple[str, str]]:
    """One session per client, the clients spread over the accounts: (username, cookie)."""
    sessions = []
    for i in range(clients):
        username = accounts[i % len(accounts)][0]
        sessions.append((username, sign_in(username)))
    log(f"signed in {clients} clients as {len({u for u, _ in sessions})} distinct users")
    return sessions


def check_sessions(paths: dict[str, str], sessions: list[tuple[str, str]]) -> None:
    """Each distinct user's pages name that user: a session that did not stick would bench
    the anonymous pages instead."""
    seen = set()
    for username, cookie in sessions:
        if username in seen:
            continue
        seen.add(username)
        status, body = fetch(paths.get("list", "/"), headers={"Cookie": cookie})
        if status != 200 or f">{username}</a>".encode() not in body:
            raise RuntimeError(f"the list page does not show {username} signed in ({status})")


def query_counts(paths: dict[str, str], signed_in_as: str = "") -> dict[str, dict[str, Any]]:
    """Queries and in-process time of one request to each page (Django test client), anonymous
    or signed in as ``signed_in_as``."""
    from django.contrib.auth import get_user_model
    from django.db import connection, reset_queries
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client(raise_request_exception=False)
    if signed_in_as:
        client.force_login(get_user_model().objects.get(username=signed_in_as))
    out: dict[str, dict[str, Any]] = {}
    for name, path in paths.items():
        client.get(path)  # warm the template and URL caches
        with CaptureQueriesContext(connection) as ctx:
            t0 = time.perf_counter()
            response = client.get(path)
            elapsed = (time.perf_counter() - t0) * 1000
        sql_ms = sum(float(q.get("time") or 0) for q in ctx.captured_queries) * 1000
        out[name] = {
            "status": response.status_code,
            "queries": len(ctx.captured_queries),
            "ms": round(elapsed, 1),
            "sql_ms": round(sql_ms, 1),
            "bytes": len(response.content),
        }
        reset_queries()
    return out


# ----------------------------------------------------------------------------- gunicorn


class Server:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = ROOT / "var" / "bench-gunicorn.log"

    def command(self) -> list[str]:
        a = self.args
        cmd = [
            str(GUNICORN),
            a.wsgi,
            "-b",
            f"{HOST}:{a.port}",
            "-w",
            str(a.workers),
            "-k",
            a.worker_class,
            "--timeout",
            "60",
            "--graceful-timeout",
            "10",
            "--error-logfile",
            str(self.log_path),
        ]
        if a.worker_class == "gthread":
            cmd += ["--threads", str(a.threads)]
        return cmd

    def start(self) -> None:
        if port_open(self.args.port):
            raise SystemExit(f"something already listens on {HOST}:{self.args.port}; use --port")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log("$ " + shlex.join(self.command()) + f"   (log: {self.log_path})")
        self.proc = subprocess.Popen(
            self.command(),
            cwd=ROOT,
            env=django_env(self.args),
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"gunicorn exited with {self.proc.returncode}; see {self.log_path}"
                )
            with contextlib.suppress(OSError, http.client.HTTPException):
                status, _ = fetch("/healthz", timeout=5)
                log(f"gunicorn answers (/healthz {status})")
                return
            time.sleep(0.3)
        raise RuntimeError(f"gunicorn did not answer within 60 s; see {self.log_path}")

    @property
    def pgid(self) -> int:
        return self.proc.pid if self.proc else -1

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        log(f"stopping gunicorn (pid {proc.pid})")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # its own session: the master and its workers
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0


PORT = 0  # set from --port in main()


def fetch(
    path: str, timeout: float = 30, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(HOST, PORT, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


# ----------------------------------------------------------------------------- load


@dataclass
class Result:
    name: str
    path: str
    loader: str
    requests: int = 0
    duration_s: float = 0.0
    p50_ms: float = math.nan
    p90_ms: float = math.nan
    p99_ms: float = math.nan
    max_ms: float = math.nan
    statuses: dict[str, int] = field(default_factory=dict)
    socket_errors: dict[str, int] = field(default_factory=dict)
    cpu_busy_pct: float | None = None
    busy_before_pct: float | None = None
    cpu_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def rps(self) -> float:
        return self.requests / self.duration_s if self.duration_s else 0.0

    @property
    def server_cpu_ms(self) -> float | None:
        """CPU time of gunicorn and PostgreSQL per request: on a busy machine the latencies
        measure the other work too, this much less."""
        if not self.requests or not self.cpu_seconds:
            return None
        used = self.cpu_seconds.get("gunicorn", 0) + self.cpu_seconds.get("postgres", 0)
        return 1000 * used / self.requests

    @property
    def errors(self) -> int:
        bad = sum(n for s, n in self.statuses.items() if not (s.isdigit() and 200 <= int(s) < 300))
        return bad + sum(self.socket_errors.values())


WRK_LUA = r"""
local threads = {}
-- COOKIES: one Cookie header per thread (--signed-in: as many threads as clients, one
-- connection each, so every connection is one user's session); empty when anonymous.
local cookies = {COOKIES}
function setup(thread)
  table.insert(threads, thread)
  if #cookies > 0 then thread:set("cookie", cookies[((#threads - 1) % #cookies) + 1]) end
end
function init(args)
  statuses = {}
  if cookie then wrk.headers["Cookie"] = cookie end
end
function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end
function done(summary, latency, requests)
  local counts = {}
  for _, t in ipairs(threads) do
    for k, v in pairs(t:get("statuses")) do
      counts[tostring(k)] = (counts[tostring(k)] or 0) + v
    end
  end
  local parts = {}
  for k, v in pairs(counts) do table.insert(parts, string.format('"%s": %d', k, v)) end
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests": %d, "duration_us": %d, "p50_us": %d, "p90_us": %d, "p99_us": %d, ' ..
    '"max_us": %d, "statuses": {%s}, "errors": {"connect": %d, "read": %d, "write": %d, ' ..
    '"timeout": %d}}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max, table.concat(parts, ", "),
    e.connect, e.read, e.write, e.timeout))
end
"""


def wrk_script(path: Path, cookies: list[str]) -> Path:
    """The Lua hooks for wrk, with the clients' Cookie headers (none when anonymous)."""
    quoted = ", ".join('"' + c.replace("\\", "\\\\").replace('"', '\\"') + '"' for c in cookies)
    path.write_text(WRK_LUA.replace("{COOKIES}", "{" + quoted + "}"))
    return path


def run_wrk(  # noqa: PLR0917
    name: str, path: str, clients: int, duration: float, threads: int, lua: Path
) -> Result:
    cmd = [
        shutil.which("wrk") or "wrk",
        "-t",
        str(min(threads, clients)),
        "-c",
        str(clients),
        "-d",
        f"{duration:g}s",
        "--timeout",
        f"{REQUEST_TIMEOUT}s",
        "-s",
        str(lua),
        f"http://{HOST}:{PORT}{path}",
    ]
    log("$ " + shlex.join(cmd))
    out = subprocess.run(
        cmd, capture_output=True, text=True, timeout=duration + REQUEST_TIMEOUT + 30, check=False
    )
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("BENCH_JSON ")), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(
            f"wrk failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}"
        )
    data = json.loads(line.removeprefix("BENCH_JSON "))
    return Result(
        name=name,
        path=path,
        loader="wrk",
        requests=data["requests"],
        duration_s=data["duration_us"] / 1e6,
        p50_ms=data["p50_us"] / 1000,
        p90_ms=data["p90_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        max_ms=data["max_us"] / 1000,
        statuses=data["statuses"],
        socket_errors={k: v for k, v in data["errors"].items() if v},
    )


def run_python(
    name: str, path: str, clients: int, duration: float, cookies: list[str] | None = None
) -> Result:
    """One thread per client, each on its own keep-alive connection (with its own session
    cookie when signed in); every latency is kept."""
    samples: list[list[tuple[float, str]]] = [[] for _ in range(clients)]
    start_gate = threading.Barrier(clients + 1)
    deadline = [0.0]

    def client(out: list[tuple[float, str]], headers: dict[str, str]) -> None:
        conn = http.client.HTTPConnection(HOST, PORT, timeout=REQUEST_TIMEOUT)
        start_gate.wait()
        while True:
            t0 = time.perf_counter()
            if t0 >= deadline[0]:
                break
            try:
                conn.request("GET", path, headers=headers)
                response = conn.getresponse()
                response.read()
                status = str(response.status)
                if response.will_close:
                    conn.close()
            except (OSError, http.client.HTTPException) as exc:
                status = type(exc).__name__
                conn.close()
            out.append((time.perf_counter() - t0, status))
        conn.close()

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)  # wake the client threads promptly, so latency is the server's
    threads = [
        threading.Thread(
            target=client,
            args=(s, {"Cookie": cookies[i % len(cookies)]} if cookies else {}),
            daemon=True,
        )
        for i, s in enumerate(samples)
    ]
    for t in threads:
        t.start()
    begin = time.perf_counter()
    deadline[0] = begin + duration
    start_gate.wait()
    for t in threads:
        t.join(timeout=duration + REQUEST_TIMEOUT + 5)
    elapsed = time.perf_counter() - begin
    sys.setswitchinterval(old_interval)

    latencies = sorted(lat for s in samples for lat, _ in s)
    result = Result(
        name=name, path=path, loader="python", requests=len(latencies), duration_s=elapsed
    )
    for s in samples:
        for _, status in s:
            bucket = result.statuses if status.isdigit() else result.socket_errors
            bucket[status] = bucket.get(status, 0) + 1
    if latencies:
        result.p50_ms = percentile(latencies, 50) * 1000
        result.p90_ms = percentile(latencies, 90) * 1000
        result.p99_ms = percentile(latencies, 99) * 1000
        result.max_ms = latencies[-1] * 1000
    return result


def percentile(ordered: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def settle(limit: float, quiet_seconds: int = 3) -> float | None:
    """Wait until the CPUs are mostly idle for a few seconds; return the last second's busy %.

    Gunicorn finishes the requests still in its backlog after a load run stops, and those
    must not be billed to the next run; other work on the machine (a test suite...) would
    skew the figures, so the report shows what was measured here."""
    deadline = time.monotonic() + limit
    quiet = 0
    while True:
        before = cpu_times()
        time.sleep(1)
        after = cpu_times()
        if not before or not after or after[1] <= before[1]:
            return None
        busy = 100 * (after[0] - before[0]) / (after[1] - before[1])
        quiet = quiet + 1 if busy < 15 else 0
        if quiet >= quiet_seconds:
            return round(busy)
        if time.monotonic() >= deadline:
            log(f"the CPUs are still {busy:.0f}% busy after {limit:g} s; measuring anyway")
            return round(busy)


def drive(  # noqa: PLR0917
    name: str,
    path: str,
    args: argparse.Namespace,
    lua: Path | None,
    server_pgid: int,
    cookies: list[str],
) -> Result:
    threads = args.clients if cookies else args.wrk_threads  # one connection per session
    idle_busy = settle(args.settle_timeout)
    if args.warmup > 0:
        log(f"warming up {path} for {args.warmup:g} s")
        if lua is not None:
            run_wrk(name, path, args.clients, args.warmup, threads, lua)
        else:
            run_python(name, path, args.clients, args.warmup, cookies)
        idle_busy = settle(args.settle_timeout)
    log(f"driving {path}: {args.clients} clients for {args.duration:g} s")
    before_cpu = cpu_times()
    before_procs = process_ticks()
    before_children = os.times()
    if lua is not None:
        result = run_wrk(name, path, args.clients, args.duration, threads, lua)
    else:
        result = run_python(name, path, args.clients, args.duration, cookies)
    result.busy_before_pct = idle_busy
    result.cpu_seconds = cpu_split(before_procs, process_ticks(), server_pgid)
    after_children = os.times()  # wrk has exited: its CPU time is in our children's
    result.cpu_seconds["loader"] = round(
        result.cpu_seconds["loader"]
        + (after_children.children_user + after_children.children_system)
        - (before_children.children_user + before_children.children_system),
        1,
    )
    after_cpu = cpu_times()
    if before_cpu and after_cpu and after_cpu[1] > before_cpu[1]:
        result.cpu_busy_pct = round(
            100 * (after_cpu[0] - before_cpu[0]) / (after_cpu[1] - before_cpu[1])
        )
    return result


def wait_until_pages_render(
    paths: dict[str, str], server: Server, args: argparse.Namespace
) -> None:
    """Templates may still be on their way: on a 5xx, wait, re-collect static, restart, retry."""
    deadline = time.monotonic() + args.wait_for_pages
    while True:
        statuses = {}
        for name, path in paths.items():
            try:
                statuses[name] = fetch(path)[0]
            except (OSError, http.client.HTTPException) as exc:
                statuses[name] = type(exc).__name__
        log(f"pre-flight: {statuses}")
        broken = {n: s for n, s in statuses.items() if not (isinstance(s, int) and s < 500)}
        if not broken:
            return
        if time.monotonic() >= deadline:
            log(f"pages still failing after {args.wait_for_pages:g} s ({broken}); measuring anyway")
            return
        log(f"waiting {args.retry_every:g} s for the pages to render (tail {server.log_path})")
        server.stop()
        time.sleep(args.retry_every)
        manage(args, "collectstatic", "--noinput")  # a new template may use a new static file
        server.start()


# ----------------------------------------------------------------------------- report


def fmt(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def readers(info: dict[str, Any]) -> str:
    sessions = info.get("sessions") or []
    if not sessions:
        return "anonymous (the public page cache may answer)"
    roles = dict(info.get("accounts") or [])
    per_user: dict[str, int] = {}
    for username in sessions:
        per_user[username] = per_user.get(username, 0) + 1
    users = ", ".join(f"{u} ({roles.get(u, '?')}) x{n}" for u, n in per_user.items())
    return (
        f"signed in: {len(sessions)} sessions, one per client, each signed in once through "
        f"/accounts/login/; {len(per_user)} distinct users: {users}"
    )


def report(  # noqa: PLR0917
    results: list[Result],
    info: dict[str, Any],
    args: argparse.Namespace,
    rows: dict[str, int],
    queries: dict[str, dict[str, Any]],
    command: str,
    server_cmd: str,
) -> str:
    target = args.target_p99_ms
    lines = [
        "",
        f"date:      {info['date']}",
        f"machine:   nproc={info['nproc']} (usable {info['nproc_usable']}), {info['cpu_model']}, "
        f"{info['mem_gb']} GB RAM, Python {info['python']}",
        f"code:      {info.get('code', '?')}",
        f"command:   {command}",
        f"server:    {server_cmd}  (DEBUG=0, PostgreSQL {info.get('postgres', '?')})",
        f"data:      {', '.join(f'{k}={v:,}' for k, v in rows.items())}",
        f"load:      {args.clients} clients x {args.duration:g} s per page, loader={results[0].loader if results else '?'}"
        f", warm-up {args.warmup:g} s",
        f"readers:   {readers(info)}",
        f"loadavg:   {info.get('loadavg_start', '?')} at the start, {info.get('loadavg_end', '?')} "
        f"at the end (1, 5, 15 min; nproc {info['nproc']}: above it, others were competing)",
        f"target:    p99 < {target:g} ms and no errors",
        "",
        f"{'page':<10} {'path':<24} {'req/s':>8} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8} "
        f"{'errors':>7} {'cpu%':>5} {'pre%':>5} {'queries':>7} {'srv ms/req':>10}  target",
    ]
    for r in results:
        q = queries.get(r.name, {})
        ok = r.requests > 0 and r.errors == 0 and r.p99_ms < target
        lines.append(
            f"{r.name:<10} {r.path:<24} {fmt(r.rps):>8} {fmt(r.p50_ms):>8} {fmt(r.p90_ms):>8} "
            f"{fmt(r.p99_ms):>8} {fmt(r.max_ms):>8} {r.errors:>7} {fmt(r.cpu_busy_pct, 0):>5} "
            f"{fmt(r.busy_before_pct, 0):>5} {q.get('queries', '-')!s:>7} {fmt(r.server_cpu_ms):>10}"
            f"  {'MET' if ok else 'MISSED'}"
        )
        if r.errors:
            lines.append(f"{'':<10} statuses {r.statuses} socket errors {r.socket_errors}")
    lines.append("")
    lines.append(
        "cpu% = all-CPU busy share during the run (server, PostgreSQL and load generator); "
        "pre% = busy share in the second before it (other work on the machine); "
        "srv ms/req = CPU ms of gunicorn and PostgreSQL per request (the cost of a page, "
        "less sensitive than latency to other work on the machine)"
    )
    lines.append(
        "queries/in-process = one "
        + (
            f"request signed in as {BENCH_MAINTAINER}"
            if info.get("accounts")
            else "anonymous request"
        )
        + " through django.test.Client: "
        + "; ".join(
            f"{n}: {q['status']}, {q['queries']} queries, {q['sql_ms']} ms SQL, {q['ms']} ms total, "
            f"{q['bytes']:,} bytes"
            for n, q in queries.items()
        )
    )
    lines.append(
        "CPU seconds during each run: "
        + "; ".join(
            f"{r.name}: " + ", ".join(f"{k.strip()} {v:g}" for k, v in r.cpu_seconds.items())
            for r in results
        )
        + " (other > 0 means something else ran on the machine meanwhile)"
    )
    lines.append("")
    lines.append("markdown:")
    lines.append("")
    lines.append(
        f"| page | path | requests/s | p50 (ms) | p99 (ms) | server CPU ms/request | errors "
        f"| p99 < {target:g} ms, no errors |"
    )
    lines.append("|---|---|---:|---:|---:|---:|---:|---|")
    for r in results:
        ok = r.requests > 0 and r.errors == 0 and r.p99_ms < target
        lines.append(
            f"| {r.name} | `{r.path}` | {fmt(r.rps)} | {fmt(r.p50_ms)} | {fmt(r.p99_ms)} "
            f"| {fmt(r.server_cpu_ms)} | {r.errors} | "
            f"{'yes' if ok else 'no'} |"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--database-url", default=DEFAULT_DB)
    p.add_argument(
        "--proposals", type=int, default=10_000, help="proposals to seed (default 10000)"
    )
    p.add_argument(
        "--reviews-per-proposal", type=int, default=2, help="for every non-draft proposal"
    )
    p.add_argument("--events-per-proposal", type=int, default=3)
    p.add_argument("--reseed", action="store_true", help="truncate the proposals and seed again")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--duration", type=float, default=20, help="seconds per page (default 20)")
    p.add_argument("--warmup", type=float, default=3, help="unmeasured seconds before each page")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument(
        "--workers",
        type=int,
        default=3,
        help="gunicorn workers (default 3: README production command, 2 cores)",
    )
    p.add_argument("--threads", type=int, default=4, help="threads per gthread worker (default 4)")
    p.add_argument(
        "--worker-class",
        default="sync",
        choices=["gthread", "sync"],
        help="gunicorn worker class (default sync, as the README's production command)",
    )
    p.add_argument(
        "--wsgi", default="marin_site.wsgi", help="WSGI module for gunicorn (to try a variant)"
    )
    p.add_argument(
        "--cache-url",
        default="redis://127.0.0.1:6379/9",
        help="the shared cache, as in production (README); empty for a per-process memory cache",
    )
    p.add_argument(
        "--page-cache-seconds",
        type=int,
        default=30,
        help="the public page cache for anonymous readers; 0 measures every page rendered afresh",
    )
    p.add_argument("--loader", default="auto", choices=["auto", "wrk", "python"])
    p.add_argument("--wrk-threads", type=int, default=1)
    p.add_argument("--target-p99-ms", type=float, default=100)
    p.add_argument(
        "--pages",
        default="list,detail,api",
        help="comma-separated subset of list,detail,api,board,board-page,board-api,board-chart",
    )
    p.add_argument(
        "--wait-for-pages",
        type=float,
        default=0,
        help="seconds to keep retrying while a page answers 5xx (default 0)",
    )
    p.add_argument("--retry-every", type=float, default=60)
    p.add_argument(
        "--settle-timeout",
        type=float,
        default=120,
        help="before each run, wait up to this long for the CPUs to be < 15%% busy",
    )
    p.add_argument(
        "--signed-in",
        action="store_true",
        help="every client signs in once as one of several seeded users (a maintainer, "
        "reviewers, authors) and sends its session cookie: pages rendered for each user",
    )
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument(
        "--board-entries",
        type=int,
        default=10_000,
        help="finished runs ranked on the board's seeded tracks (default 10000)",
    )
    p.add_argument("--board-tracks", type=int, default=20, help="seeded board tracks (default 20)")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:  # noqa: PLR0915 (one straight-line run)
    global PORT  # noqa: PLW0603 (fetch() and the loaders read it)
    args = parse_args(argv)
    PORT = args.port
    command = ".venv/bin/python bench/pages.py" + ("" if not argv else " " + shlex.join(argv))
    info = machine_info() | {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")}

    if args.loader == "wrk" and not shutil.which("wrk"):
        raise SystemExit("--loader wrk: wrk is not installed (apt-get install wrk)")
    use_wrk = args.loader == "wrk" or (args.loader == "auto" and shutil.which("wrk") is not None)

    ensure_database(args.database_url)
    manage(args, "migrate", "--noinput")
    manage(args, "collectstatic", "--noinput")
    setup_django(args)
    from django.db import connection

    rows = seed(args.proposals, args.reviews_per_proposal, args.events_per_proposal, args.reseed)
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        info["postgres"] = cursor.fetchone()[0]
    detail_id = pick_detail_proposal()
    accounts = bench_accounts(detail_id) if args.signed_in else []
    all_paths = {"list": "/", "detail": f"/proposals/{detail_id}/", "api": "/api/v1/proposals/"}
    wanted = [n.strip() for n in args.pages.split(",") if n.strip()]
    if any(name.startswith("board") for name in wanted):
        rows |= seed_board(args.board_entries, args.board_tracks, args.reseed)
        track = f"{BOARD_PREFIX}0"
        all_paths |= {
            "board": f"/board/?track={track}",
            "board-page": f"/board/?track={track}&page=5",
            "board-api": f"/api/v1/board/?track={track}&page=5",
            "board-chart": f"/board/chart.json?track={track}",
        }
    if not wanted or set(wanted) - set(all_paths):
        raise SystemExit(f"--pages: choose among {', '.join(all_paths)}")
    paths = {n: all_paths[n] for n in wanted}
    connection.close()

    server = Server(args)
    results: list[Result] = []
    sessions: list[tuple[str, str]] = []
    info["loadavg_start"] = load_average()
    lua_dir = tempfile.TemporaryDirectory(prefix="bench-wrk-")
    try:
        server.start()
        wait_until_pages_render(paths, server, args)
        if accounts:
            sessions = sign_in_clients(accounts, args.clients)
            check_sessions(paths, sessions)
        cookies = [cookie for _, cookie in sessions]
        lua = wrk_script(Path(lua_dir.name) / "record.lua", cookies) if use_wrk else None
        queries = query_counts(paths, signed_in_as=BENCH_MAINTAINER if accounts else "")
        connection.close()
        log(f"per-request profile: {queries}")
        for name, path in paths.items():
            results.append(drive(name, path, args, lua, server.pgid, cookies))
            r = results[-1]
            log(
                f"{name}: {r.rps:.1f} req/s, p50 {r.p50_ms:.1f} ms, p99 {r.p99_ms:.1f} ms, errors {r.errors}"
            )
    finally:
        server.stop()
        lua_dir.cleanup()

    info["loadavg_end"] = load_average()
    info["code"] = code_version()
    info["accounts"] = accounts
    info["sessions"] = [u for u, _ in sessions]
    print(report(results, info, args, rows, queries, command, shlex.join(server.command()[1:])))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "info": info,
                    "command": command,
                    "rows": rows,
                    "queries": queries,
                    "results": [
                        r.__dict__
                        | {"rps": r.rps, "errors": r.errors, "server_cpu_ms": r.server_cpu_ms}
                        for r in results
                    ],
                },
                indent=2,
                default=str,
            )
        )
    return 1 if any(r.errors for r in results) else 0


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally that stops gunicorn


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminate)
    try:
        sys.exit(main(sys.argv[1:]))
    except SystemExit:
        raise
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception:
        import traceback

        traceback.print_exc()
        sys.exit(2)
