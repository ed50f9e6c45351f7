#!/usr/bin/env python
"""The iris executor against a real local Iris controller, on PostgreSQL.

    .venv/bin/python bench/iris.py                      # 10 launches, 200 queued runs
    .venv/bin/python bench/iris.py --rounds 5 --runs 40

Starts ``iris cluster start --local`` (from .venv-iris, made by bin/setup-iris) with a HOME
and TMPDIR of its own, migrates a database of its own (default ``marin_bench_iris``) and
measures, in this process (Celery eager, so the nudges run inline as a worker would):

1. **approval to job submitted**: ``--rounds`` one-run plans launched on ``iris`` (what an
   approval calls), each timed from the launch to the run holding Iris's job id; p50, p95
   (target: p95 < 5 s).
2. **a state change seen within one reconcile pass**: once Iris says a job succeeded, one
   ``runs_reconcile`` pass (its duration printed) must find the run finished.
3. **``--runs`` queued runs dispatched, none submitted twice**: a plan of that many runs is
   launched while ``--racers`` threads run reconcile passes at the same time (each retries
   the submit of any running run without a job id, the race that would double a job); then
   every job name in Iris is counted: each run has exactly one job.
4. **one pass over all of them**: once Iris says every one of those jobs ended, one
   ``runs_reconcile`` pass is timed; it must see every run's end (none left running).
   With the reconciler every ``RUNS_RECONCILE_SECONDS`` (30 s), a state change in Iris is
   on the site at most that interval plus one pass later.

With ``--compare`` the rounds of 1 alternate between the two ways to submit: one ``iris job
run`` process per submit (``RUNS_IRIS_SUBMITTER=command``) and the long-lived submitter
(``process``, started first as a worker's start starts it); p50 and p95 of each and their
ratio are printed. ``--load N`` runs N CPU-bound processes beside it (a load generator:
``python -c "while True: pass"``), as a busy machine would. ``--runs 0`` skips 3 and 4.

The jobs are ``{python} -c pass`` (no trainer: only the scheduling is timed). ``--record``
appends the figures to bench/RESULTS.md under "## iris (bench/iris.py)".
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/marin_bench_iris"
SECTION = "## iris (bench/iris.py)"
STARTED = re.compile(r"Controller started at (http://\S+)")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


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


def controller_start(root: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    iris = subprocess.run(
        [str(ROOT / "bin" / "setup-iris")], capture_output=True, text=True, check=True
    ).stdout.split()[-1]
    config = next(Path(iris).parent.parent.glob("lib/python3*/site-packages"))
    config = config / "iris" / "config" / "examples" / "local.yaml"
    for name in ("home", "tmp"):
        (root / name).mkdir()
    out = (root / "controller.log").open("wb")
    process = subprocess.Popen(
        [iris, "--config", str(config), "cluster", "start", "--local"],
        cwd=root,
        env={"PATH": os.environ["PATH"], "HOME": str(root / "home"), "TMPDIR": str(root / "tmp")},
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if found := STARTED.search((root / "controller.log").read_text(errors="replace")):
            return process, found.group(1), iris
        if process.poll() is not None:
            break
        time.sleep(0.2)
    raise SystemExit(f"the controller did not start: {(root / 'controller.log').read_text()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=DEFAULT_DB)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--racers", type=int, default=2)
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--compare", action="store_true")
    parser.add_argument("--load", type=int, default=0)
    args = parser.parse_args()

    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(1))  # stop the controller too
    root = Path(tempfile.mkdtemp(prefix="marin-bench-iris-"))
    controller, url, iris = controller_start(root)
    log(f"controller at {url}")
    os.environ.update(
        {
            "DATABASE_URL": args.database_url,
            "DJANGO_SETTINGS_MODULE": "marin_site.settings",
            "DEBUG": "0",
            "SECRET_KEY": "bench-iris-" + "x" * 40,
            "LOG_LEVEL": "WARNING",
            "MARIN_VAR_DIR": str(root / "var"),
            "RUNS_IRIS_CONTROLLER_URL": url,
            "RUNS_IRIS_COMMAND": iris,
            "RUNS_IRIS_HOME": str(root / "home"),
            "RUNS_IRIS_LOCAL": "1",
            "RUNS_IRIS_JOB_PREFIX": f"bench{int(time.time())}",
            "RUNS_IRIS_MAX_CONCURRENT": str(args.runs + args.rounds + 10),
            "RUNS_PLAN_MAX_CONCURRENT": str(args.runs + 10),
            "RUNS_WORK_DIR": str(root / "runs"),
        }
    )
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)
    ]
    try:
        database_ready(args.database_url)
        return bench(args)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(controller.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            controller.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(controller.pid, signal.SIGKILL)
        subprocess.run(["rm", "-rf", str(root)], check=False)


def bench(args: argparse.Namespace) -> int:  # noqa: PLR0915  (three measures, step by step)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.conf import settings
    from django.db import connection

    from marin_site.celery import app
    from runs.executors import JobState, get_executor
    from runs.executors.iris import IrisExecutor
    from runs.models import Recipe, Run, RunState
    from runs.recipes.demo import TINY_MOE
    from runs.services import plans as plan_services
    from runs.services.recipes import recipe_create
    from runs.services.reconcile import runs_reconcile

    app.conf.task_always_eager = True
    executor = get_executor("iris")
    assert isinstance(executor, IrisExecutor)
    version = f"bench-{int(time.time())}"
    recipe = Recipe.objects.filter(name="iris-bench", version=version).first() or recipe_create(
        actor=None,
        data={
            **TINY_MOE,
            "name": "iris-bench",
            "version": version,
            "command_template": "{python} -c pass",
            "executor": "iris",
        },
    )

    def plan_of(spec: str, steps: int = 10) -> int:
        plan = plan_services.plan_freeze(
            recipe=recipe, baseline={"steps": steps, "width": 32}, spec_text=spec,
            budget_accelerator_hours=None,
        )  # fmt: skip
        return int(plan.pk)

    # 1. approval to job submitted (each way in turn with --compare)
    default_way = settings.RUNS_IRIS_SUBMITTER
    ways = ["command", "process"] if args.compare else [default_way]
    if "process" in ways:
        executor.warm()  # what a worker does when it starts (runs.receivers)
    by_way: dict[str, list[float]] = {way: [] for way in ways}
    latencies = []
    finished_runs = []
    for round_ in range(args.rounds):
        settings.RUNS_IRIS_SUBMITTER = ways[round_ % len(ways)]
        plan_id = plan_of("", steps=11 + round_)  # one run, a config of its own
        started = time.perf_counter()
        plan_services.plan_launch(plan_id=plan_id, executor="iris")
        ids = list(Run.objects.filter(plan_id=plan_id).values_list("pk", flat=True))
        while Run.objects.filter(pk__in=ids, external_id="").exists():
            time.sleep(0.01)
        latencies.append(time.perf_counter() - started)
        by_way[settings.RUNS_IRIS_SUBMITTER].append(latencies[-1])
        finished_runs += ids
        log(
            f"round {round_ + 1} ({settings.RUNS_IRIS_SUBMITTER}): {len(ids)} run submitted "
            f"in {latencies[-1]:.2f} s (load average {os.getloadavg()[0]:.1f})"
        )
    settings.RUNS_IRIS_SUBMITTER = default_way

    def p95_of(values: list[float]) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]

    p95, p50 = p95_of(latencies), statistics.median(latencies)
    ways_lines = [
        f"- approval to job submitted, {way} ({len(values)} rounds): median {statistics.median(values):.2f} s, "
        f"p95 {p95_of(values):.2f} s, range {min(values):.2f}-{max(values):.2f} s"
        for way, values in by_way.items()
    ]
    if args.compare:
        old, new = by_way["command"], by_way["process"]
        ways_lines.append(
            f"- command / process: median {statistics.median(old) / statistics.median(new):.1f}x, "
            f"p95 {p95_of(old) / p95_of(new):.1f}x (target p95 < 5 s with the submitter: "
            f"{'met' if p95_of(new) < 5 else 'not met'})"
        )
    log("\n".join(ways_lines))
    if args.runs <= 0:
        print("\n".join(ways_lines))
        return 0

    # 2. a state change seen within one reconcile pass
    last = Run.objects.get(pk=finished_runs[-1])
    deadline = time.monotonic() + 300
    while executor.poll(last.external_id).state != JobState.SUCCEEDED:
        if time.monotonic() > deadline:
            raise SystemExit(f"job {last.external_id} did not succeed")
        time.sleep(0.2)
    started = time.perf_counter()
    runs_reconcile()
    one_pass = time.perf_counter() - started
    last.refresh_from_db()
    seen = last.state == RunState.FINISHED
    log(f"one reconcile pass: {one_pass:.2f} s; run {last.pk} {last.state}")

    # 3. many queued runs dispatched, none submitted twice
    side = max(1, round(args.runs**0.5))
    rates = ", ".join(str(round(0.001 * (i + 1), 4)) for i in range(side))
    decays = ", ".join(str(round(0.01 * i, 3)) for i in range(-(-args.runs // side)))
    plan_id = plan_of(f"axes:\n  learning_rate: [{rates}]\n  weight_decay: [{decays}]\n")
    stop = threading.Event()

    def racer() -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):
                runs_reconcile()
            time.sleep(0.05)
        connection.close()

    racers = [threading.Thread(target=racer) for _ in range(args.racers)]
    for thread in racers:
        thread.start()
    started = time.perf_counter()
    plan_services.plan_launch(plan_id=plan_id, executor="iris")
    dispatched = Run.objects.filter(plan_id=plan_id, cached_from__isnull=True)
    total = dispatched.count()
    while dispatched.filter(external_id="").exists():
        time.sleep(0.2)
    many_seconds = time.perf_counter() - started
    stop.set()
    for thread in racers:
        thread.join()
    prefix = settings.RUNS_IRIS_JOB_PREFIX
    names = [
        str(job.get("jobId", "")).rsplit("/", 1)[-1]
        for job in executor._rpc("ListJobs", {"query": {"name_filter": prefix, "limit": 500}})[
            "jobs"
        ]
    ]
    wanted = {
        f"{prefix}-run-{pk}-attempt-{attempt}"
        for pk, attempt in dispatched.values_list("pk", "attempt")
    }
    doubled = sum(1 for name in wanted if names.count(name) > 1)
    missing = sum(1 for name in wanted if name not in names)
    log(f"{total} runs dispatched in {many_seconds:.1f} s: {doubled} doubled, {missing} missing")

    # 4. one pass over all of them, once Iris says every job ended
    ids = list(dispatched.values_list("external_id", flat=True))
    deadline = time.monotonic() + 900
    while any(not executor.poll(job_id).is_done for job_id in ids):
        if time.monotonic() > deadline:
            raise SystemExit("the jobs did not end in 900 s")
        time.sleep(1.0)
    started = time.perf_counter()
    runs_reconcile()
    big_pass = time.perf_counter() - started
    left = dispatched.filter(state=RunState.RUNNING).count()
    log(f"one pass over {total} ended jobs: {big_pass:.2f} s, {left} left running")

    lines = [
        *ways_lines,
        *(  # with --compare the two ways are said apart above, not mixed
            []
            if args.compare
            else [
                f"- approval (the launch) to job submitted ({args.rounds} one-run launches): "
                f"median {p50:.2f} s, p95 {p95:.2f} s (target < 5 s: {'met' if p95 < 5 else 'not met'})"
            ]
        ),
        f"- one reconcile pass {one_pass:.2f} s; the ended job seen in that one pass: "
        f"{'yes' if seen else 'no'}",
        f"- {total} queued runs dispatched in {many_seconds:.0f} s with {args.racers} reconcile "
        f"passes racing the submits: {doubled} submitted twice, {missing} missing",
        f"- one reconcile pass over those {total} runs once their jobs ended: {big_pass:.2f} s; "
        f"{total - left} of {total} ends seen in it ({left} left running)",
    ]
    print("\n".join(lines))
    if args.record:
        with (ROOT / "bench" / "RESULTS.md").open("a") as out:
            stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            load = os.getloadavg()[0]
            out.write(
                f"\n{SECTION}\n\n### {stamp} (load average {load:.1f} on {os.cpu_count()} cores)\n\n"
            )
            out.write("\n".join(lines) + "\n")
    return 0 if seen and not doubled and not missing and not left else 1


if __name__ == "__main__":
    raise SystemExit(main())
