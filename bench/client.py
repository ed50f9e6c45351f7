#!/usr/bin/env python
"""The run client's cost to a training loop, and what it loses when the site goes away.

    .venv/bin/python bench/client.py                  # both parts; about 3 minutes
    .venv/bin/python bench/client.py --only overhead  # the loop alone, no database
    .venv/bin/python bench/client.py --outage 10      # a shorter outage

Overhead: a training loop of --steps steps, each some work that releases the GIL as a
device step does (a NumPy matrix product) then 1,000 metrics logged, side by side with the
same loop logging nothing, rounds taking turns. Two ways to log: ``log`` once per key (1,000
calls a step) and ``log_many`` once per step. The client sends to a site stand-in in a
process of its own that answers every batch at once, so the sender thread's whole cost (its
checks, JSON, HTTP) falls on this process, as it would on a trainer. The figure is the
median step time with the client minus the median without, divided by the calls a step.

Outage: the real site (gunicorn, as bench/ingest.py starts it) and one running run; the
client logs --keys keys a step at --rate steps a second, the site is stopped for --outage
seconds and started again, the loop goes on, then ``close``. Points on the server are
counted in the database against the points logged. ``max_queued`` is set below what the
outage holds, so the spill file (and its replay when the site comes back) is used too.

Writes the figures into bench/RESULTS.md under "## client (bench/client.py)".
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one core's matrix product, as measured

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "client"))

from ingest import (  # noqa: E402  (the bench helpers beside this file)
    Server,
    ensure_database,
    free_port,
    machine_description,
    make_running_runs,
    results_section_replace,
    setup_django,
    wait_until_answers,
)
from marin_client.client import RunClient  # noqa: E402

# A site stand-in: answers every POST 200 at once, in a process of its own.
STAND_IN = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        body = b'{"stored": 1}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def training_loop(client: RunClient | None, steps: int, keys: int, way: str) -> list[float]:
    """Per-step seconds of a loop: a GIL-free matrix product, then the step's metrics."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((256, 256))
    names = [f"layer_{i // 10}/param_{i % 10}/norm" for i in range(keys)]
    times = []
    for step in range(steps):
        started = time.perf_counter()
        b = a @ a  # the device step: releases the GIL
        values = [float(i) + 0.5 for i in range(keys)]  # what the step reports
        if client is not None:
            if way == "log":
                for name, value in zip(names, values, strict=True):
                    client.log(name, step, value)
            else:
                client.log_many(dict(zip(names, values, strict=True)), step)
        else:
            dict(zip(names, values, strict=True))  # the metrics dict is built either way
        times.append(time.perf_counter() - started)
        del b
    return times


def bench_overhead(args: argparse.Namespace) -> dict[str, float]:
    """Wall time per step (median over steps, then over rounds) and this process's CPU time
    per step (the loop and the sender thread until ``close`` has sent everything; the load
    of other processes barely moves it), for each way of logging and for none."""
    port = free_port()
    stand_in = subprocess.Popen([sys.executable, "-c", STAND_IN, str(port)])
    out: dict[str, float] = {}
    try:
        time.sleep(0.5)
        wall: dict[str, list[float]] = {"none": [], "log": [], "log_many": []}
        cpu: dict[str, list[float]] = {"none": [], "log": [], "log_many": []}
        with tempfile.TemporaryDirectory() as tmp:
            for round_ in range(args.rounds):
                ways = ["none", "log", "log_many"]
                for way in ways[round_ % 3 :] + ways[: round_ % 3]:  # the order turns
                    client = None
                    cpu_started = time.process_time()
                    if way != "none":
                        client = RunClient(
                            api_url=f"http://127.0.0.1:{port}/api/v1/",
                            run_id=1,
                            token="bench",
                            flush_interval=0.5,
                            heartbeat_interval=3600,
                            spill_path=Path(tmp) / "unsent.jsonl",
                        )
                        client.start()
                    times = training_loop(client, args.steps, args.keys, way)
                    if client is not None:
                        delivered = client.close()
                        if not delivered or client.stats["sent"] != args.steps * args.keys:
                            raise RuntimeError(
                                f"the stand-in did not get every point: {client.stats}"
                            )
                    cpu[way].append((time.process_time() - cpu_started) / args.steps)
                    wall[way].append(statistics.median(times))
        base, base_cpu = statistics.median(wall["none"]), statistics.median(cpu["none"])
        for way, calls in (("log", args.keys), ("log_many", 1)):
            step, step_cpu = statistics.median(wall[way]), statistics.median(cpu[way])
            out[f"{way}_step_ms"] = step * 1e3
            out[f"{way}_per_call_us"] = (step - base) / calls * 1e6
            out[f"{way}_ratio"] = step / base
            out[f"{way}_cpu_ms"] = step_cpu * 1e3
            out[f"{way}_cpu_per_call_us"] = (step_cpu - base_cpu) / calls * 1e6
            out[f"{way}_cpu_per_point_us"] = (step_cpu - base_cpu) / args.keys * 1e6
        out["none_step_ms"] = base * 1e3
        out["none_cpu_ms"] = base_cpu * 1e3
    finally:
        stand_in.terminate()
        stand_in.wait(timeout=10)
    return out


def bench_outage(args: argparse.Namespace) -> dict[str, float]:
    parts = urllib.parse.urlsplit(args.admin_url)
    database_url = f"{parts.scheme}://{parts.netloc}/{args.database}"
    ensure_database(args.admin_url, args.database)
    setup_django(database_url)
    from runs.models import MetricPoint

    ((run_id, token),) = make_running_runs(1)
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "DEBUG": "0",
        "SECRET_KEY": os.environ.get("SECRET_KEY", "bench-only-secret-key"),
        "ALLOWED_HOSTS": "127.0.0.1",
        "RUNS_METRICS_RATE_PER_MINUTE": "100000000",
        "CELERY_BROKER_URL": "memory://",
        "LOG_LEVEL": "WARNING",
    }
    argv = [
        str(ROOT / ".venv/bin/gunicorn"),
        "marin_site.wsgi",
        "-b",
        f"127.0.0.1:{port}",
        "-w",
        "2",
        "-k",
        "gthread",
        "--threads",
        "2",
        "--chdir",
        str(ROOT),
    ]
    logs = ROOT / "var" / "bench-logs"
    logs.mkdir(parents=True, exist_ok=True)
    site = Server(argv, env, logs / "client-gunicorn.log")
    wait_until_answers(port, "/api/v1/")
    names = [f"layer_{i // 10}/param_{i % 10}/norm" for i in range(args.outage_keys)]
    held = int(args.rate * args.outage * args.outage_keys)
    with tempfile.TemporaryDirectory() as tmp:
        client = RunClient(
            api_url=f"http://127.0.0.1:{port}/api/v1/",
            run_id=run_id,
            token=token,
            flush_interval=1.0,
            max_queued=max(held // 4, 1000),  # the outage overflows into the spill file
            retry_for=120,
            spill_path=Path(tmp) / "unsent.jsonl",
        )
        client.start()
        step = 0
        try:

            def steps_for(seconds: float) -> None:
                nonlocal step
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    client.log_many({n: float(step) for n in names}, step)
                    step += 1
                    time.sleep(1 / args.rate)

            steps_for(args.before)
            site.stop()
            down_at = time.monotonic()
            steps_for(args.outage)
            site = Server(argv, env, logs / "client-gunicorn.log")
            wait_until_answers(port, "/api/v1/")
            down_for = time.monotonic() - down_at
            steps_for(args.before)
            started = time.monotonic()
            delivered = client.close()
            close_s = time.monotonic() - started
        finally:
            site.stop()
    logged = step * args.outage_keys
    on_server = MetricPoint.objects.filter(run_id=run_id).count()
    return {
        "logged": logged,
        "on_server": on_server,
        "lost": logged - on_server,
        "down_s": down_for,
        "spilled": sum(v for k, v in client.stats.items() if k.startswith("spilled")),
        "replayed": client.stats["replayed"],
        "close_s": close_s,
        "delivered": float(delivered),
    }


def record(args: argparse.Namespace, overhead: dict[str, float], outage: dict[str, float]) -> None:
    command = " ".join(["    .venv/bin/python bench/client.py", *sys.argv[1:]]).rstrip()
    lines = [
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC. Machine: {machine_description()}.",
        "",
        command,
        "",
    ]
    if overhead:
        lines += [
            f"Overhead: {args.steps} steps of a 256x256 matrix product then {args.keys} metrics, "
            f"{args.rounds} rounds taking turns; the client sends to a stand-in site in another "
            "process (so its sender thread's cost is all here). Wall: the median step, median "
            "over rounds. CPU: this process's CPU time per step (the loop, and the sender "
            "thread until `close` has sent everything), median over rounds; the other "
            "processes' load barely moves it, so on a shared machine it is the figure to read.",
            "",
            "| loop | wall per step (ms) | ratio | added per call (µs) | CPU per step (ms) "
            "| CPU added per call (µs) | CPU added per point (µs) |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
            f"| no tracker | {overhead['none_step_ms']:.2f} | 1.00 | | "
            f"{overhead['none_cpu_ms']:.2f} | | |",
            *(
                f"| {label} | {overhead[f'{way}_step_ms']:.2f} | {overhead[f'{way}_ratio']:.2f} "
                f"| {overhead[f'{way}_per_call_us']:.1f} | {overhead[f'{way}_cpu_ms']:.2f} "
                f"| {overhead[f'{way}_cpu_per_call_us']:.1f} "
                f"| {overhead[f'{way}_cpu_per_point_us']:.2f} |"
                for way, label in (
                    ("log", f"`log`, {args.keys} calls a step"),
                    ("log_many", "`log_many`, 1 call a step"),
                )
            ),
            "",
            "Target: < 50 µs per `log` call at 1,000 keys a step.",
            "",
        ]
    if outage:
        lines += [
            f"Outage: {args.outage_keys} keys a step at {args.rate} steps/s; the site (gunicorn, "
            f"PostgreSQL) stopped for {outage['down_s']:.0f} s after {args.before:.0f} s and "
            f"started again, then {args.before:.0f} s more. {int(outage['logged']):,} points "
            f"logged, {int(outage['on_server']):,} on the server: **{int(outage['lost'])} lost** "
            f"({int(outage['spilled']):,} went through the spill file on the way, "
            f"{int(outage['replayed']):,} replayed from it; `close` took {outage['close_s']:.1f} s).",
            "",
        ]
    if not outage:  # keep the outage figures of the last run that measured them
        text = (ROOT / "bench" / "RESULTS.md").read_text()
        section = text.partition("## client (bench/client.py)")[2].split("\n## ")[0]
        kept = [line for line in section.splitlines() if line.startswith("Outage:")]
        lines += [f"{line} (an earlier run of the outage part)" for line in kept[:1]]
    results_section_replace("client (bench/client.py)", lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=["overhead", "outage"])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--outage", type=float, default=60.0, help="seconds the site is away")
    parser.add_argument("--before", type=float, default=10.0, help="seconds up, before and after")
    parser.add_argument("--rate", type=float, default=5.0, help="steps a second in the outage run")
    parser.add_argument("--outage-keys", type=int, default=200)
    parser.add_argument("--admin-url", default="postgres://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--database", default="h_client")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    overhead: dict[str, float] = {}
    outage: dict[str, float] = {}
    if args.only in (None, "overhead"):
        overhead = bench_overhead(args)
        print({k: round(v, 3) for k, v in overhead.items()})
    if args.only in (None, "outage"):
        outage = bench_outage(args)
        print({k: round(v, 3) for k, v in outage.items()})
    if not args.no_record:
        record(args, overhead, outage)
    return 0 if not outage or outage["lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
