#!/usr/bin/env python
"""Metric ingest, side by side on one PostgreSQL: marin-site's API, MLflow, binary COPY.

    .venv/bin/python bench/ingest.py --only site-copy --points 200000 --rounds 7 \
        --baseline main=/tmp/main --baseline start=/tmp/start

``--only site-copy``: the native door against binary COPY, round by round, and (with
--baseline LABEL=PATH, repeatable, or --baseline-root) the same door served from other
checkouts (``git archive`` of main's, of the branch's start), no MLflow. Each server gets an
untimed warm-up; each round starts with the next side. Beside points a second it counts the
CPU each side used per 1,000 points (this process's clients, gunicorn's workers, PostgreSQL's
client backends of the database, from /proc): on a machine whose cores are all busy, the
ratio of those sums is what sets the ratio of the throughputs. Its figures are appended,
dated, to their section of RESULTS.md.

    .venv/bin/python bench/ingest.py                         # 3 rounds of 1M points
    .venv/bin/python bench/ingest.py --points 200000 --mlflow-points 100000

Steps: create the databases if missing (``h_ingest`` for marin-site and the raw COPY
table, ``h_ingest_mlflow`` for MLflow), migrate, make one running run per client (tokens as
a dispatcher would make them), start gunicorn on 127.0.0.1 (DEBUG=0, the per-run rate limit
raised out of the way) and ``mlflow server``. Each of --rounds rounds posts --points points as
1000-point batches to ``/api/v1/runs/{id}/metrics/`` with 1 and then 4 concurrent keep-alive
clients, then --mlflow-points points the same way through MLflow (installed in its own
venv, --mlflow-venv, created with pip when missing; backend store on the same PostgreSQL)
with its ``runs/log-batch`` endpoint (1000 metrics a request, MLflow's own limit), then
binary ``COPY`` of the same points at 1,000 rows a transaction on 4 connections into a table
with the points table's primary key (the limit the service faces; ``bench_copy``). The ratios are each round's, and their median
over the rounds is the headline. Last, the server time to read a downsampled series of a run with 100k steps.
Prints the figures and the ratios and writes them to bench/RESULTS.md, replacing the
section "## ingest (bench/ingest.py)". Servers are always stopped at the end.

MLflow's venv is made on first use (``python -m venv var/bench-mlflow-venv`` and
``pip install mlflow psycopg2-binary`` into it); delete the folder to start afresh.

The stock client row (``--only mlflow-client`` runs it alone): the same points logged with
the stock ``MlflowClient().log_batch`` (``mlflow-skinny`` of the dev extra, 1000 metrics a
call, one client) to marin-site's MLflow door (``/mlflow``, with the run's token as
``MLFLOW_TRACKING_TOKEN``) and to the real MLflow server, taking turns for
--client-rounds rounds; the medians are recorded in their own section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KEYS = [
    "train/loss",
    "eval/loss",
    "throughput/mfu",
    "throughput/tokens_per_second",
    "moe/drop_fraction",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User and system CPU a process has used (0 when it is gone): /proc/PID/stat."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def child_pids(parent: int) -> list[int]:
    """The processes whose parent is ``parent`` (gunicorn's workers)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(stat[1]) == parent:
                    out.append(int(entry.name))
    return out


def backend_pids(database_url: str) -> list[int]:
    """PostgreSQL's server processes of one database's connections, but this one's (not
    autovacuum's, which comes when it will and lands on whichever side is running)."""
    import psycopg

    name = urllib.parse.urlsplit(database_url).path.lstrip("/")
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'",
            (name,),
        ).fetchall()
    return [int(row[0]) for row in rows]


class CpuMeter:
    """CPU seconds of this process (the clients) and of sets of other processes between
    ``start`` and ``stop``: which side of the machine a measurement keeps busy."""

    def __init__(self, groups: dict[str, Any]) -> None:
        self.groups = groups  # name -> a function answering that group's pids now
        self.before: dict[str, dict[int, float]] = {}
        self.own = 0.0

    def start(self) -> None:
        self.before = {
            name: {p: cpu_seconds(p) for p in pids()} for name, pids in self.groups.items()
        }
        self.own = time.process_time()

    def stop(self) -> dict[str, float]:
        out = {"client": time.process_time() - self.own}
        for name, pids in self.groups.items():
            before = self.before[name]
            # A process that ended meanwhile took its last figures with it: counted as 0.
            out[name] = sum(
                max(0.0, cpu_seconds(p) - before.get(p, 0.0)) for p in set(pids()) | set(before)
            )
        return out


def ensure_database(admin_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def wait_until_answers(port: int, path: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", path)
            if conn.getresponse().status < 500:
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"nothing answered on port {port} within {timeout} s")


def batches(points: int, size: int, offset: int = 0) -> list[list[tuple[str, int, float]]]:
    """``points`` points over five keys, in batches of ``size``; steps start at ``offset``."""
    out, current = [], []
    for i in range(points):
        step = offset + i // len(KEYS)
        current.append((KEYS[i % len(KEYS)], step, 1.0 / (step + 1)))
        if len(current) == size:
            out.append(current)
            current = []
    if current:
        out.append(current)
    return out


def drive(port: int, jobs: list[tuple[str, dict[str, str], list[bytes]]]) -> float:
    """Each job (path, headers, bodies) on its own keep-alive connection; returns seconds."""
    errors: list[str] = []

    def worker(path: str, headers: dict[str, str], bodies: list[bytes]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        for body in bodies:
            conn.request("POST", path, body=body, headers=headers)
            response = conn.getresponse()
            text = response.read()
            if response.status != 200:
                errors.append(f"{response.status} {text[:200]!r}")
                return

    threads = [threading.Thread(target=worker, args=job) for job in jobs]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"{len(errors)} failed requests, e.g. {errors[0]}")
    return elapsed


class Server:
    def __init__(
        self, argv: list[str], env: dict[str, str], log: Path, cwd: Path | None = None
    ) -> None:
        self.log = log.open("wb")
        self.proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,  # gunicorn imports from where it starts, whatever --chdir says
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()


def setup_django(database_url: str) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ["CELERY_BROKER_URL"] = "memory://"  # the bench's nudges go nowhere
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marin_site.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def make_running_runs(count: int) -> list[tuple[int, str]]:
    """``count`` running runs of a fresh plan of the tiny recipe, with their tokens."""
    import copy

    from django.db import transaction

    from runs import tokens
    from runs.models import PlanLaunch, Recipe, Run, RunState
    from runs.recipes.demo import TINY_MOE
    from runs.services import dispatch
    from runs.services import plans as plan_services
    from runs.services import recipes as recipe_services
    from runs.services import runs as run_writes

    recipe = Recipe.objects.filter(name=TINY_MOE["name"], version=TINY_MOE["version"]).first()
    if recipe is None:
        recipe = recipe_services.recipe_create(actor=None, data=copy.deepcopy(TINY_MOE))
    seeds = ", ".join(str(s) for s in range(count))
    plan = plan_services.plan_freeze(
        recipe=recipe, baseline={}, spec_text=f"seeds: [{seeds}]\n", budget_accelerator_hours=None
    )
    with transaction.atomic():
        PlanLaunch.objects.create(plan=plan, executor="local", command_template="true")
    dispatch.plan_expand(plan_id=plan.pk)
    out = []
    for run in Run.objects.filter(plan=plan).order_by("pk")[:count]:
        run_writes.run_transition(
            run_id=run.pk,
            to_state=RunState.RUNNING,
            door="worker",
            changes={"token_hash": tokens.token_hash(tokens.run_token(run=run))},
        )
        run.refresh_from_db()
        out.append((run.pk, tokens.run_token(run=run)))
    return out


def bench_site(port: int, points: int, clients: int, meter: CpuMeter | None = None) -> float:
    runs = make_running_runs(clients)
    per_client = points // clients
    jobs = []
    for run_id, token in runs:
        bodies = [
            json.dumps(
                {"points": [{"key": k, "step": s, "value": v} for k, s, v in batch]}
            ).encode()
            for batch in batches(per_client, 1000)
        ]
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        jobs.append((f"/api/v1/runs/{run_id}/metrics/", headers, bodies))
    if meter is not None:
        meter.start()
    return per_client * clients / drive(port, jobs)


def mlflow_call(port: int, path: str, body: dict[str, object]) -> dict[str, object]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    data = json.loads(response.read() or b"{}")
    if response.status != 200:
        raise RuntimeError(f"MLflow {path}: {response.status} {data}")
    return data


def bench_mlflow(port: int, points: int, clients: int) -> float:
    experiment = mlflow_call(
        port, "/api/2.0/mlflow/experiments/create", {"name": f"ingest-{time.time_ns()}"}
    )["experiment_id"]
    jobs = []
    now_ms = int(time.time() * 1000)
    for _ in range(clients):
        run = mlflow_call(
            port,
            "/api/2.0/mlflow/runs/create",
            {"experiment_id": experiment, "start_time": now_ms},
        )
        run_id = run["run"]["info"]["run_id"]  # type: ignore[index]
        bodies = [
            json.dumps(
                {
                    "run_id": run_id,
                    "metrics": [
                        {"key": k, "value": v, "step": s, "timestamp": now_ms} for k, s, v in batch
                    ],
                }
            ).encode()
            for batch in batches(points // clients, 1000)
        ]
        jobs.append(
            ("/api/2.0/mlflow/runs/log-batch", {"Content-Type": "application/json"}, bodies)
        )
    return points // clients * clients / drive(port, jobs)


def bench_copy(
    database_url: str,
    points: int,
    connections: int = 4,
    per_txn: int = 1000,
    cpu: dict[str, float] | None = None,
) -> float:
    """The limit the service faces: binary COPY of the same points, ``per_txn`` rows a
    transaction, on ``connections`` connections at once (one run each, as the site's clients),
    into a table with the points table's primary key (run, key, step). ``cpu`` receives the
    CPU seconds of the clients (this process) and of PostgreSQL's server processes."""
    import psycopg
    from psycopg.types.numeric import Float8, Int8

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_raw_points")
        conn.execute(
            "CREATE TABLE bench_raw_points (run_id bigint, key varchar(200), step bigint, "
            "value double precision, time timestamptz, PRIMARY KEY (run_id, key, step))"
        )
    per_connection = points // connections
    now = dt.datetime.now(dt.UTC)
    shares = [
        [
            [(Int8(run), k, Int8(s), Float8(v), now) for k, s, v in batch]
            for batch in batches(per_connection, per_txn)
        ]
        for run in range(1, connections + 1)
    ]
    ready = threading.Barrier(connections + 1)
    server_cpu: list[float] = []

    def worker(share: list[list[tuple[object, ...]]]) -> None:
        with psycopg.connect(database_url) as conn:
            backend = conn.info.backend_pid
            ready.wait()
            before = cpu_seconds(backend)
            for rows in share:
                with (
                    conn.cursor() as cur,
                    cur.copy(
                        "COPY bench_raw_points (run_id, key, step, value, time) "
                        "FROM STDIN (FORMAT BINARY)"
                    ) as copy,
                ):
                    copy.set_types(["int8", "varchar", "int8", "float8", "timestamptz"])
                    for row in rows:
                        copy.write_row(row)
                conn.commit()
            server_cpu.append(cpu_seconds(backend) - before)

    threads = [threading.Thread(target=worker, args=(share,)) for share in shares]
    for thread in threads:
        thread.start()
    ready.wait()
    started, own = time.perf_counter(), time.process_time()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if cpu is not None:
        cpu.update(client=time.process_time() - own, postgres=sum(server_cpu))
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("DROP TABLE bench_raw_points")
    return per_connection * connections / elapsed


def site_vs_copy(args: argparse.Namespace, site_url: str, env: dict[str, str]) -> int:
    """``--only site-copy``: this checkout's native door (4 clients), the same door served
    from each --baseline (other checkouts, e.g. main's), and binary COPY, round by round.
    Beside the points a second, each measurement's CPU time per 1,000 points: the clients
    (this process), gunicorn's workers and PostgreSQL's server processes of the database.
    On a machine whose cores are all busy, those sums are what sets the ratio."""
    logs = ROOT / "var" / "bench-logs"
    logs.mkdir(parents=True, exist_ok=True)
    roots = {"site": ROOT}
    for label, root in baselines(args):
        roots[label] = root
    servers: dict[str, Server] = {}
    ports: dict[str, int] = {}
    rounds: list[dict[str, float]] = []
    cpu_rounds: list[dict[str, dict[str, float]]] = []
    try:
        for name, root in roots.items():
            ports[name] = free_port()
            servers[name] = Server(
                [
                    str(ROOT / ".venv/bin/gunicorn"),
                    "marin_site.wsgi",
                    "-b",
                    f"127.0.0.1:{ports[name]}",
                    "-w",
                    str(args.workers),
                    "-k",
                    "gthread",
                    "--threads",
                    "2",
                    "--chdir",
                    str(root),
                ],
                {**env, "PYTHONPATH": str(root)},
                logs / f"gunicorn-{name}.log",
                cwd=root,
            )
            wait_until_answers(ports[name], "/api/v1/runs/?page_size=1")
        for name in roots:  # every worker's first batches (imports, connections), untimed
            bench_site(ports[name], min(args.points, 40_000), 4)
        for number in range(1, args.rounds + 1):
            results: dict[str, float] = {}
            cpu: dict[str, dict[str, float]] = {}
            # Each round starts with the next side, so no side always follows the same one.
            sides = [*roots, "copy"]
            turn = (number - 1) % len(sides)
            for name in sides[turn:] + sides[:turn]:
                if name == "copy":
                    cpu["copy"] = {}
                    results["copy"] = bench_copy(site_url, args.points, cpu=cpu["copy"])
                    continue
                master = servers[name].proc.pid
                meter = CpuMeter(
                    {
                        "gunicorn": lambda master=master: child_pids(master),
                        "postgres": lambda: backend_pids(site_url),
                    }
                )
                results[name] = bench_site(ports[name], args.points, 4, meter)
                cpu[name] = meter.stop()
            results = {name: results[name] for name in sides}
            cpu = {name: cpu[name] for name in sides}
            results["of_copy"] = results["site"] / results["copy"]
            for name in roots:
                if name != "site":
                    results[f"of_{name}"] = results["site"] / results[name]
            # CPU milliseconds per 1,000 points, all processes together
            for name, used in cpu.items():
                results[f"cpu_{name}"] = sum(used.values()) * 1000 / (args.points / 1000)
            results["cpu_ratio"] = results["cpu_copy"] / results["cpu_site"]
            rounds.append(results)
            cpu_rounds.append(cpu)
            print(
                f"round {number}: "
                + ", ".join(
                    f"{k} {v:,.2f}" if v < 100 else f"{k} {v:,.0f}" for k, v in results.items()
                )
            )
            for name, used in cpu.items():
                print(
                    f"    {name} CPU ms per 1000 points: "
                    + ", ".join(
                        f"{part} {seconds * 1e6 / args.points:.2f}"
                        for part, seconds in used.items()
                    )
                )
    finally:
        for server in servers.values():
            server.stop()
    medians = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    print("medians: " + ", ".join(f"{k} {v:,.2f}" for k, v in medians.items()))
    parts = {
        (name, part): statistics.median(c[name][part] * 1e6 / args.points for c in cpu_rounds)
        for name in cpu_rounds[0]
        for part in cpu_rounds[0][name]
    }
    print(
        "median CPU ms per 1000 points: "
        + ", ".join(f"{name} {part} {v:.2f}" for (name, part), v in parts.items())
    )
    if not args.no_record:
        now = dt.datetime.now(dt.UTC)
        others = [name for name in roots if name != "site"]
        lines = [
            f"{now:%Y-%m-%d %H:%M} UTC, {machine_description()}; {len(rounds)} rounds of "
            f"{args.points:,} points (1000-point batches, 4 keep-alive clients, gunicorn "
            f"{args.workers} workers x 2 threads), taking turns with binary COPY of the same "
            "points at 1,000 rows a transaction on 4 connections into a table with the "
            "points' primary key"
            + (
                ", and the same door served from " + ", ".join(f"{n} ({roots[n]})" for n in others)
                if others
                else ""
            )
            + ". Points a second, their ratios, and CPU milliseconds per 1,000 points (`cpu_*`: "
            "clients + gunicorn + PostgreSQL's server processes; `cpu_ratio` = copy's / the "
            "site's).",
            "",
            "| round | " + " | ".join(rounds[0]) + " |",
            "|---" * (len(rounds[0]) + 1) + "|",
            *(
                f"| {i} | "
                + " | ".join(f"{v:,.2f}" if v < 100 else f"{v:,.0f}" for v in r.values())
                + " |"
                for i, r in enumerate(rounds, 1)
            ),
            "| median | "
            + " | ".join(f"{v:,.2f}" if v < 100 else f"{v:,.0f}" for v in medians.values())
            + " |",
            "",
            "Median CPU ms per 1,000 points, by process: "
            + "; ".join(
                f"{name}: "
                + ", ".join(f"{part} {v:.2f}" for (n, part), v in parts.items() if n == name)
                for name in cpu_rounds[0]
            )
            + ".",
        ]
        results_section_append(
            "ingest against binary COPY (bench/ingest.py --only site-copy)", lines
        )
    return 0


def baselines(args: argparse.Namespace) -> list[tuple[str, Path]]:
    """The other checkouts to serve beside this one: ``--baseline LABEL=PATH`` (repeatable),
    and ``--baseline-root`` under ``--baseline-label``."""
    out = []
    for item in args.baseline:
        label, _, path = item.partition("=")
        out.append((label, Path(path).resolve()))
    if args.baseline_root:
        out.append((args.baseline_label, Path(args.baseline_root).resolve()))
    return out


def bench_series(port: int, steps: int) -> tuple[float, int, float]:
    """Server time (median of 7) to read a 1000-point downsampled series of a run with
    ``steps`` steps. The points are seeded with COPY; then the key's summary is marked stale
    and its rollup built by ``runs.series.rollup.series_refresh``, as the worker would (timed too)."""
    import psycopg
    from django.conf import settings as django_settings

    from runs.models import MetricSummary
    from runs.series import rollup

    ((run_id, _),) = make_running_runs(1)
    db = django_settings.DATABASES["default"]
    url = f"postgresql://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    now = dt.datetime.now(dt.UTC)
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        with cur.copy("COPY runs_metricpoint (run_id, key, step, value, time) FROM STDIN") as copy:
            for step in range(steps):
                copy.write_row((run_id, "train/loss", step, 1.0 / (step + 1), now))
        conn.commit()
    MetricSummary.objects.create(
        run_id=run_id,
        key="train/loss",
        last=1.0 / steps,
        min=1.0 / steps,
        max=1.0,
        step=steps - 1,
        count=steps,
        stale_from=0,
    )
    started = time.perf_counter()
    rollup.series_refresh(run_id=run_id)
    refresh_ms = (time.perf_counter() - started) * 1000
    times = []
    points = 0
    for _ in range(7):
        client = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        started = time.perf_counter()
        client.request("GET", f"/api/v1/runs/{run_id}/series/?key=train/loss&points=1000")
        body = json.loads(client.getresponse().read())
        times.append(time.perf_counter() - started)
        points = len(body["points"])
    return statistics.median(times) * 1000, points, refresh_ms


def bench_stock_client(uri: str, run_id: str, points: int, token: str) -> float:
    """Points per second through the stock ``MlflowClient().log_batch``, 1000 a call. The
    Metric objects are made before the clock starts; the client's own checks and JSON
    encoding are part of what is measured, on both sides alike."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    if token:
        os.environ["MLFLOW_TRACKING_TOKEN"] = token
    else:
        os.environ.pop("MLFLOW_TRACKING_TOKEN", None)
    client = MlflowClient(tracking_uri=uri)
    now_ms = int(time.time() * 1000)
    calls = [[Metric(k, v, now_ms, s) for k, s, v in batch] for batch in batches(points, 1000)]
    started = time.perf_counter()
    for metrics in calls:
        client.log_batch(run_id, metrics=metrics)
    return points / (time.perf_counter() - started)


def stock_client_rounds(
    *, site_port: int, mlflow_port: int, points: int, rounds: int
) -> list[dict[str, float]]:
    """Alternating rounds: each side logs the same points into a fresh run of its own."""
    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    out = []
    for number in range(1, rounds + 1):
        ((site_run, token),) = make_running_runs(1)
        site = bench_stock_client(
            f"http://127.0.0.1:{site_port}/mlflow", str(site_run), points, token
        )
        os.environ.pop("MLFLOW_TRACKING_TOKEN", None)
        real = MlflowClient(tracking_uri=f"http://127.0.0.1:{mlflow_port}")
        experiment = real.create_experiment(f"stock-client-{time.time_ns()}")
        real_run = real.create_run(experiment).info.run_id
        other = bench_stock_client(f"http://127.0.0.1:{mlflow_port}", real_run, points, "")
        out.append({"site": site, "mlflow": other, "x": site / other})
        print(
            f"stock MlflowClient.log_batch, round {number}: marin-site {site:,.0f} points/s, "
            f"MLflow {other:,.0f} points/s: {site / other:.1f}x"
        )
    return out


def ensure_mlflow(venv: Path) -> Path:
    mlflow = venv / "bin" / "mlflow"
    if not mlflow.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", "mlflow", "psycopg2-binary"], check=True
        )
    return mlflow


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--mlflow-points", type=int, default=None, help="default: --points")
    parser.add_argument("--series-steps", type=int, default=100_000)
    parser.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--database", default="h_ingest")
    parser.add_argument("--mlflow-venv", type=Path, default=ROOT / "var" / "bench-mlflow-venv")
    parser.add_argument("--workers", type=int, default=4, help="gunicorn and mlflow workers")
    parser.add_argument("--rounds", type=int, default=3, help="site and MLflow take turns")
    parser.add_argument("--no-record", action="store_true", help="do not write RESULTS.md")
    parser.add_argument(
        "--only",
        choices=["all", "mlflow-client", "site-copy"],
        default="all",
        help="mlflow-client: that row alone; site-copy: the native door against binary COPY "
        "(and --baseline-root's door), no MLflow",
    )
    parser.add_argument("--baseline-root", default="", help="another checkout to serve too")
    parser.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="LABEL=PATH",
        help="another checkout to serve too, under LABEL (repeatable)",
    )
    parser.add_argument("--baseline-label", default="main", help="its name in RESULTS.md")
    parser.add_argument("--client-points", type=int, default=50_000)
    parser.add_argument("--client-rounds", type=int, default=5)
    parser.add_argument("--site-port", type=int, default=0, help="default: a free port")
    parser.add_argument("--mlflow-port", type=int, default=0, help="default: a free port")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    mlflow_points = args.mlflow_points or args.points

    parts = urllib.parse.urlsplit(args.admin_url)
    base = f"{parts.scheme}://{parts.netloc}"
    site_url = f"{base}/{args.database}"
    mlflow_db = f"{args.database}_mlflow"
    ensure_database(args.admin_url, args.database)
    ensure_database(args.admin_url, mlflow_db)
    setup_django(site_url)
    if args.only == "site-copy":
        return site_vs_copy(
            args,
            site_url,
            {
                **os.environ,
                "DATABASE_URL": site_url,
                "DEBUG": "0",
                "SECRET_KEY": os.environ.get("SECRET_KEY", "bench-only-secret-key"),
                "ALLOWED_HOSTS": "127.0.0.1",
                "RUNS_METRICS_RATE_PER_MINUTE": "100000000",
                "CELERY_BROKER_URL": "memory://",
                "LOG_LEVEL": "WARNING",
            },
        )
    mlflow = ensure_mlflow(args.mlflow_venv)

    logs = ROOT / "var" / "bench-logs"
    logs.mkdir(parents=True, exist_ok=True)
    site_port, mlflow_port = args.site_port or free_port(), args.mlflow_port or free_port()
    env = {
        **os.environ,
        "DATABASE_URL": site_url,
        "DEBUG": "0",
        "SECRET_KEY": os.environ.get("SECRET_KEY", "bench-only-secret-key"),
        "ALLOWED_HOSTS": "127.0.0.1",
        "RUNS_METRICS_RATE_PER_MINUTE": "100000000",
        "CELERY_BROKER_URL": "memory://",
        "LOG_LEVEL": "WARNING",
    }
    servers: list[Server] = []
    rounds: list[dict[str, float]] = []
    try:
        servers.append(
            Server(
                [
                    str(ROOT / ".venv/bin/gunicorn"),
                    "marin_site.wsgi",
                    "-b",
                    f"127.0.0.1:{site_port}",
                    "-w",
                    str(args.workers),
                    "-k",
                    "gthread",
                    "--threads",
                    "2",
                    "--chdir",
                    str(ROOT),
                ],
                env,
                logs / "gunicorn.log",
            )
        )
        servers.append(
            Server(
                [
                    str(mlflow),
                    "server",
                    "--backend-store-uri",
                    f"postgresql+psycopg2://{parts.netloc}/{mlflow_db}",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(mlflow_port),
                    "--workers",
                    str(args.workers),
                    "--default-artifact-root",
                    str(ROOT / "var" / "bench-mlflow-artifacts"),
                ],
                {**os.environ},
                logs / "mlflow.log",
            )
        )
        wait_until_answers(site_port, "/api/v1/runs/?page_size=1")
        wait_until_answers(mlflow_port, "/health", timeout=180)
        client_rounds = stock_client_rounds(
            site_port=site_port,
            mlflow_port=mlflow_port,
            points=args.client_points,
            rounds=args.client_rounds,
        )
        if not args.no_record:
            record_stock_client(args=args, rounds=client_rounds)
        if args.only == "mlflow-client":
            return 0
        # Rounds take turns, so that a slow minute of this shared machine lands on both sides.
        for number in range(1, args.rounds + 1):
            results: dict[str, float] = {}
            for clients in (1, 4):
                results[f"site_{clients}"] = bench_site(site_port, args.points, clients)
            for clients in (1, 4):
                results[f"mlflow_{clients}"] = bench_mlflow(mlflow_port, mlflow_points, clients)
            results["copy"] = bench_copy(site_url, args.points)
            results["x_mlflow"] = max(results["site_1"], results["site_4"]) / max(
                results["mlflow_1"], results["mlflow_4"]
            )
            results["of_copy"] = max(results["site_1"], results["site_4"]) / results["copy"]
            rounds.append(results)
            print(
                f"round {number}: marin-site {results['site_1']:,.0f} / {results['site_4']:,.0f}"
                f" points/s (1 / 4 clients); MLflow {results['mlflow_1']:,.0f} / "
                f"{results['mlflow_4']:,.0f}; raw COPY {results['copy']:,.0f}; "
                f"{results['x_mlflow']:.1f}x MLflow, {results['of_copy']:.2f} of COPY"
            )
        series_ms, series_points, refresh_ms = bench_series(site_port, args.series_steps)
        print(
            f"downsampled series of {args.series_steps:,} steps -> {series_points} points: "
            f"{series_ms:.1f} ms (median of 7); building its rollup from the points took "
            f"{refresh_ms:.0f} ms"
        )
    finally:
        for server in servers:
            server.stop()

    ratio_mlflow = statistics.median(r["x_mlflow"] for r in rounds)
    ratio_copy = statistics.median(r["of_copy"] for r in rounds)
    print(
        f"marin-site / MLflow, median of {len(rounds)} rounds: {ratio_mlflow:.1f}x (target >= 20x)"
    )
    print(f"marin-site / raw COPY, median: {ratio_copy:.2f} (target >= 0.5)")
    if not args.no_record:
        record(
            args=args,
            rounds=rounds,
            mlflow_points=mlflow_points,
            series=(series_ms, series_points, refresh_ms),
            ratio_mlflow=ratio_mlflow,
            ratio_copy=ratio_copy,
        )
    return 0


def record_stock_client(*, args: argparse.Namespace, rounds: list[dict[str, float]]) -> None:
    command = " ".join(["    .venv/bin/python bench/ingest.py", *sys.argv[1:]]).rstrip()
    site = statistics.median(r["site"] for r in rounds)
    other = statistics.median(r["mlflow"] for r in rounds)
    ratio = statistics.median(r["x"] for r in rounds)
    lines = [
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC. Machine: {machine_description()}. "
        f"The stock `MlflowClient().log_batch` (mlflow-skinny, one client, 1000 metrics a call) "
        f"logs the same {args.client_points:,} points over five keys to marin-site's MLflow door "
        f"(gunicorn `-w {args.workers} -k gthread --threads 2`, DEBUG=0, the run's token as "
        f"MLFLOW_TRACKING_TOKEN) and to a real MLflow server ({args.workers} workers, backend "
        "store on the same PostgreSQL), a fresh run each time, taking turns round by round:",
        "",
        command,
        "",
        "| round | marin-site /mlflow | MLflow server | ratio |",
        "|---|---|---|---|",
        *(
            f"| {n} | {r['site']:,.0f} pts/s | {r['mlflow']:,.0f} pts/s | {r['x']:.1f}x |"
            for n, r in enumerate(rounds, 1)
        ),
        "",
        f"Median of {len(rounds)} rounds: marin-site {site:,.0f} points/s, MLflow {other:,.0f} "
        f"points/s, {ratio:.1f}x. The client's own work (checks, protobuf JSON) is the same on "
        "both sides and part of both figures; on marin-site the points go through the same ingest "
        "as the native API (runs.metrics.ingest.metrics_ingest).",
    ]
    results_section_replace("ingest: the stock MLflow client (bench/ingest.py)", lines)


def machine_description() -> str:
    """CPUs, CPU model, memory, Python and PostgreSQL versions, and the load right now."""
    import platform

    model = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory = ""
    with contextlib.suppress(OSError, ValueError, IndexError):
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        memory = f", {kib / 1024 / 1024:.1f} GB RAM"
    postgres = ""
    with contextlib.suppress(Exception):
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SHOW server_version")
            postgres = f", PostgreSQL {cursor.fetchone()[0].split()[0]}"
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    return (
        f"{os.cpu_count()} CPUs ({model}){memory}, Python {platform.python_version()}"
        f"{postgres} on the same machine; load average at the end {load}"
    )


def results_section_replace(title: str, lines: list[str]) -> None:
    """Put ``## title`` with ``lines`` into bench/RESULTS.md, replacing that section if it
    is there (up to the next ``## ``), else at the end."""
    path = ROOT / "bench" / "RESULTS.md"
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    heading = f"## {title}"
    section = "\n".join([heading, "", *lines]).rstrip() + "\n"
    if heading in text:
        before, _, rest = text.partition(heading)
        after = rest.find("\n## ")
        text = before + section + ("" if after < 0 else rest[after:])
    else:
        text = text.rstrip() + "\n\n" + section
    path.write_text(text)


def results_section_append(title: str, lines: list[str]) -> None:
    """Add a dated paragraph under ``## title`` in bench/RESULTS.md (made at the end when
    missing), before the next section: earlier figures stay beside the new ones."""
    path = ROOT / "bench" / "RESULTS.md"
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    heading = f"## {title}"
    block = "\n".join(lines).rstrip() + "\n"
    if heading not in text:
        text = text.rstrip() + "\n\n" + heading + "\n\n" + block
    else:
        before, _, rest = text.partition(heading)
        after = rest.find("\n## ")
        body, tail = (rest, "") if after < 0 else (rest[:after], rest[after:])
        text = before + heading + body.rstrip() + "\n\n" + block + tail
    path.write_text(text)


INGEST_NOTES = [
    "The write path (runs/metrics/): the raw body parsed with orjson and checked in one loop",
    "into four columns, put in (key, step) order and folded into per-key summaries in Python,",
    "then sent as binary arrays (runs/metrics/pg_arrays.py, bound on the server) in one SQL statement",
    "that inserts the points and upserts the summaries (a plain INSERT; a batch meeting stored",
    "points fails whole on the primary key and goes again as INSERT ... ON CONFLICT, where an",
    "unchanged point is not rewritten); points keyed by (run, key, step) with no surrogate id,",
    "no second index and no database-level foreign key. The run and its token hash are read",
    "with one plain SELECT. Charts read a rollup that a Celery task refreshes a few seconds",
    "later, not the points.",
]


def record(
    *,
    args: argparse.Namespace,
    rounds: list[dict[str, float]],
    mlflow_points: int,
    series: tuple[float, int, float],
    ratio_mlflow: float,
    ratio_copy: float,
) -> None:
    command = " ".join(["    .venv/bin/python bench/ingest.py", *sys.argv[1:]]).rstrip()
    series_ms, series_points, refresh_ms = series
    lines = [
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC. Machine: {machine_description()}. "
        f"gunicorn `-w {args.workers} -k gthread --threads 2`, DEBUG=0; MLflow server with "
        f"{args.workers} workers, backend store on the same PostgreSQL; 1000 points a request, "
        f"keep-alive clients on the same machine. {args.points:,} points per marin-site "
        f"measurement, {mlflow_points:,} per MLflow one; the two take turns, round by round.",
        "",
        command,
        "",
        "| round | marin-site API, 1 / 4 clients | MLflow log-batch, 1 / 4 clients | raw COPY "
        "| x MLflow | of COPY |",
        "|---|---|---|---|---|---|",
        *(
            f"| {n} | {r['site_1']:,.0f} / {r['site_4']:,.0f} pts/s | {r['mlflow_1']:,.0f} / "
            f"{r['mlflow_4']:,.0f} | {r['copy']:,.0f} | {r['x_mlflow']:.1f}x | "
            f"{r['of_copy']:.2f} |"
            for n, r in enumerate(rounds, 1)
        ),
        "",
        f"Median of the rounds: marin-site / MLflow {ratio_mlflow:.1f}x (target >= 20x); "
        f"marin-site / raw COPY {ratio_copy:.2f} (target >= 0.33); each round's ratio takes the "
        f"best of 1 and 4 clients on each side. Downsampled series read "
        f"(`GET /api/v1/runs/{{id}}/series/?key=train/loss&points=1000`, "
        f"{args.series_steps:,} steps -> {series_points} points, from the rollup): "
        f"{series_ms:.1f} ms (median of 7, measured by the client); building that rollup from "
        f"the points (`runs.series.rollup.series_refresh`): {refresh_ms:.0f} ms.",
        "",
        *INGEST_NOTES,
    ]
    results_section_replace("ingest (bench/ingest.py)", lines)


if __name__ == "__main__":
    raise SystemExit(main())
