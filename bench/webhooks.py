#!/usr/bin/env python
"""Load-test POST /github/webhook/: signed deliveries at a fixed rate, then the queue drain.

    .venv/bin/python bench/webhooks.py                       # 200/s for 30 s, PostgreSQL + Redis
    .venv/bin/python bench/webhooks.py --rate 50 --duration 5 --database sqlite

Steps: create the database if missing (PostgreSQL, default ``h_github_bench``) and migrate,
start gunicorn (DEBUG=0) and a Celery worker on Redis, warm both up (--warm-up seconds of
deliveries, sent and drained, not counted), then send deliveries open-loop at
--rate per second for --duration seconds (the real octokit payloads round-robin, each with
a new X-GitHub-Delivery and a valid X-Hub-Signature-256) from a pool of keep-alive
connections. Every acknowledgement's latency is kept; after the last one the script polls
the database until every delivery is processed. ``--neighbours N`` runs N busy loops beside
the measured runs, as a machine busy with something else. Prints p50 / p99 / max, non-2xx,
how many were stored (none may be lost) and the drain time; ``--record`` appends the figures
to bench/RESULTS.md under "## webhooks (bench/webhooks.py)".
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import http.client
import os
import queue
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv" / "bin"
PAYLOADS = ROOT.parent / "shared" / "fixtures" / "github" / "webhooks"
SECRET = "bench-webhook-secret"
HOST = "127.0.0.1"
SECTION = "## webhooks (bench/webhooks.py)"
CPU_PARTS = ("server", "worker", "PostgreSQL", "client")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def environment(args: argparse.Namespace, var_dir: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": args.settings,
            "DEBUG": "0",
            "SECRET_KEY": "bench-" + "x" * 40,
            "ALLOWED_HOSTS": HOST,
            "SECURE_COOKIES": "0",
            "GITHUB_WEBHOOK_SECRET": SECRET,
            "GITHUB_TOKEN": "",  # sync off: the bench measures the receiving side
            "GITHUB_REPOSITORY": "",
            "CELERY_BROKER_URL": args.broker,
            "CACHE_URL": args.cache,
            "MARIN_VAR_DIR": var_dir,
            "LOG_LEVEL": "WARNING",
        }
    )
    if args.database == "sqlite":
        env.pop("DATABASE_URL", None)
    else:
        env["DATABASE_URL"] = args.database
    return env


def prepare_database(args: argparse.Namespace, env: dict[str, str]) -> None:
    if args.database != "sqlite":
        name = args.database.rsplit("/", 1)[1]
        subprocess.run(
            ["createdb", "-h", HOST, "-U", "postgres", name],
            env=env,
            capture_output=True,
            check=False,
        )
    subprocess.run(
        [str(VENV / "python"), "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=env,
        check=True,
    )


def wait_for(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            socket.create_connection((HOST, port), timeout=0.5).close()
            return
        time.sleep(0.1)
    raise RuntimeError(f"nothing answers on port {port}")


def warm_up(port: int, count: int, timeout: float = 60) -> None:
    """Until every gunicorn worker has loaded Django, the first answers measure start-up."""
    body = b'{"zen": "warm"}'
    signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    deadline = time.monotonic() + timeout
    done = 0
    while done < count and time.monotonic() < deadline:
        conn = http.client.HTTPConnection(HOST, port, timeout=30)
        try:
            conn.request(
                "POST",
                "/github/webhook/",
                body=body,
                headers={
                    "Content-Type": "application/json",
                    "X-GitHub-Event": "ping",
                    "X-GitHub-Delivery": f"warm-{uuid.uuid4()}",
                    "X-Hub-Signature-256": signature,
                },
            )
            response = conn.getresponse()
            response.read()
            done += response.status == 202
        except (OSError, http.client.HTTPException):
            time.sleep(0.2)
        finally:
            conn.close()


def deliveries() -> list[tuple[str, bytes]]:
    return [(path.parent.name, path.read_bytes()) for path in sorted(PAYLOADS.glob("*/*.json"))]


def prepared(run: str) -> list[tuple[bytes, bytes, bytes]]:
    """Per payload: the request up to the delivery id, the rest of the headers, the body.

    Signed once per payload (the signature covers the body only); each request then costs
    the client a join and a send, so the load generator, which shares the machine's cores
    with the server, takes as little of them as it can.
    """
    out = []
    for event, body in deliveries():
        signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        head = (
            "POST /github/webhook/ HTTP/1.1\r\n"
            f"Host: {HOST}\r\n"
            "User-Agent: GitHub-Hookshot/bench\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"X-GitHub-Event: {event}\r\n"
            f"X-Hub-Signature-256: {signature}\r\n"
            f"X-GitHub-Delivery: {run}-"
        ).encode()
        out.append((head, b"\r\n\r\n", body))
    return out


class Connection:
    """A bare HTTP/1.1 client socket: send prepared bytes, read one response."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock: socket.socket | None = None

    def exchange(self, request: bytes) -> int:
        reused = self.sock is not None
        try:
            return self._exchange(request)
        except OSError:
            if not reused:
                raise
            self.close()  # the server closed an idle keep-alive connection: once more, fresh
            return self._exchange(request)

    def _exchange(self, request: bytes) -> int:
        if self.sock is None:
            self.sock = socket.create_connection((HOST, self.port), timeout=30)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed before the response")
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        fields = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
        length = int(fields.get("content-length", "0"))
        while len(rest) < length:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed inside the response")
            rest += chunk
        if fields.get("connection", "").lower() == "close":
            self.close()
        return status

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def send_all(
    port: int, rate: float, duration: float, clients: int, run: str
) -> tuple[list[float], list[int], int]:
    """Open-loop: request i is due at start + i/rate, whoever is free sends it."""
    requests = prepared(run)
    total = int(rate * duration)
    jobs: queue.Queue[int | None] = queue.Queue()
    latencies: list[float] = []
    statuses: list[int] = []
    lock = threading.Lock()
    start = time.monotonic() + 0.2

    def worker() -> None:
        conn = Connection(port)
        while True:
            index = jobs.get()
            if index is None:
                break
            head, tail, body = requests[index % len(requests)]
            request = b"".join((head, str(index).encode(), tail, body))
            delay = start + index / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            began = time.perf_counter()
            try:
                status = conn.exchange(request)
            except OSError:
                conn.close()
                status = 0
            elapsed = (time.perf_counter() - began) * 1000
            with lock:
                latencies.append(elapsed)
                statuses.append(status)
        conn.close()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for index in range(total):
        jobs.put(index)
    for _ in threads:
        jobs.put(None)
    for thread in threads:
        thread.join()
    return latencies, statuses, total


@dataclass
class Run:
    latencies: list[float]
    statuses: list[int]
    total: int
    sent_for: float
    busy: float
    stolen: float
    stored: int
    processed: int
    drain: float
    cpu: dict[str, float]  # ms of CPU a delivery, by part, while sending

    @property
    def ok(self) -> int:
        return sum(1 for status in self.statuses if 200 <= status < 300)

    @property
    def whole(self) -> bool:
        """Every delivery acknowledged, stored and processed once."""
        return self.ok == self.total == self.stored == self.processed

    @property
    def p50(self) -> float:
        return percentile(self.latencies, 50)

    @property
    def p99(self) -> float:
        return percentile(self.latencies, 99)


def cpu_times() -> list[int]:
    """The machine's CPU counters (/proc/stat): user nice system idle iowait irq softirq steal."""
    with open("/proc/stat") as stat:
        return [int(x) for x in stat.readline().split()[1:9]]


def cpu_share(before: list[int], after: list[int]) -> tuple[float, float]:
    """(busy, stolen) as percentages of the machine's CPU time between two readings."""
    delta = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(delta) or 1
    busy = delta[0] + delta[1] + delta[2] + delta[5] + delta[6]
    return 100 * busy / total, 100 * delta[7] / total


def session_cpu() -> dict[int, int]:
    """CPU clock ticks used so far by each session: its live processes and the children they
    reaped (a PostgreSQL backend that exits moves its time to the postmaster's)."""
    ticks: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone since the listing
            continue
        fields = text.rpartition(")")[2].split()
        # after the name: state ppid pgrp session ... utime stime cutime cstime
        session, used = int(fields[3]), sum(int(x) for x in fields[11:15])
        if "(postgres)" in text[: text.rfind(")") + 1]:
            session = -1  # every PostgreSQL process, backends and writers
        ticks[session] = ticks.get(session, 0) + used
    return ticks


def cpu_per_delivery(
    before: dict[int, int], after: dict[int, int], sessions: dict[str, int], total: int
) -> dict[str, float]:
    """Milliseconds of CPU a delivery, by part (a session id each; -1 is PostgreSQL)."""
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    return {
        name: (after.get(sid, 0) - before.get(sid, 0)) * tick_ms / max(total, 1)
        for name, sid in sessions.items()
    }


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def drain_wait(env: dict[str, str], run: str, total: int, timeout: float) -> tuple[int, int, float]:
    """Poll until every delivery of this run is processed; (stored, processed, seconds)."""
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from proposals.models import WebhookDelivery

    began = time.monotonic()
    stored = processed = 0
    while time.monotonic() - began < timeout:
        ours = WebhookDelivery.objects.filter(delivery_id__startswith=f"{run}-")
        stored = ours.count()
        processed = ours.filter(processed_at__isnull=False).count()
        if processed >= total:
            break
        time.sleep(0.1)
    return stored, processed, time.monotonic() - began


def record(text: str) -> None:
    path = ROOT / "bench" / "RESULTS.md"
    current = path.read_text() if path.exists() else "# Benchmark results\n"
    if SECTION in current:  # replace only our own section, keep everyone else's
        head, _, rest = current.partition(SECTION)
        following = rest.find("\n## ")
        tail = rest[following:] if following >= 0 else ""
        current = head.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n" + tail
    else:
        current = current.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n"
    path.write_text(current)


def start_worker(
    args: argparse.Namespace, env: dict[str, str], port: int
) -> subprocess.Popen[bytes]:
    nice = ["nice", "-n", str(args.worker_nice)] if args.worker_nice else []
    return subprocess.Popen(
        [
            *nice,
            str(VENV / "celery"),
            "-A",
            "marin_site",
            "worker",
            "-l",
            "WARNING",
            "--concurrency",
            str(args.celery_concurrency),
            "-n",
            f"bench-webhooks-{port}@%h",
        ],
        cwd=ROOT,
        env=env,
        start_new_session=True,
    )


def server_command(args: argparse.Namespace, port: int) -> list[str]:
    return [
        str(VENV / "gunicorn"),
        "marin_site.wsgi",
        "-b",
        f"{HOST}:{port}",
        "-w",
        str(args.workers),
        "-k",
        args.worker_class,
        *(["--threads", str(args.threads)] if args.worker_class == "gthread" else []),
        "--log-level",
        "warning",
    ]


def server_label(args: argparse.Namespace) -> str:
    threads = f" x {args.threads} threads" if args.worker_class == "gthread" else ""
    return f"gunicorn {args.workers} {args.worker_class} workers{threads}"


def main() -> int:  # noqa: PLR0915  (a script: arguments, processes, report)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=200)
    parser.add_argument("--duration", type=float, default=30)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument(
        "--warm-up",
        type=float,
        default=3,
        help="seconds of deliveries sent and drained before the measured runs (0: none)",
    )
    parser.add_argument("--workers", type=int, default=3, help="gunicorn workers")
    parser.add_argument("--threads", type=int, default=4, help="threads a gunicorn gthread worker")
    parser.add_argument(
        "--worker-nice",
        type=int,
        default=10,
        help="the Celery worker's niceness (default 10, as the README's production commands)",
    )
    parser.add_argument(
        "--worker-class",
        default="sync",
        choices=["sync", "gthread"],
        help="gunicorn worker class (default sync, the README's production command)",
    )
    parser.add_argument("--celery-concurrency", type=int, default=2)
    parser.add_argument(
        "--database",
        default="postgres://postgres@127.0.0.1:5432/h_github_bench",
        help="a PostgreSQL URL, or 'sqlite'",
    )
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/14")
    parser.add_argument(
        "--cache",
        default="redis://127.0.0.1:6379/13",
        help="the shared cache, as in production; '' for per-process memory (a nudge per delivery)",
    )
    parser.add_argument("--settings", default="marin_site.settings")
    parser.add_argument("--drain-timeout", type=float, default=300)
    parser.add_argument("--record", action="store_true", help="append to bench/RESULTS.md")
    parser.add_argument(
        "--worker-after-send",
        action="store_true",
        help="start Celery only when sending ends: acknowledgements without a worker beside them",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="send this many times against the same processes"
    )
    parser.add_argument(
        "--neighbours",
        type=int,
        default=0,
        help="busy loops (niceness 0) running beside the measured runs: a machine busy elsewhere",
    )
    args = parser.parse_args()
    if args.worker_after_send and args.repeat != 1:
        parser.error("--worker-after-send measures one run")

    var_dir = tempfile.mkdtemp(prefix="marin-bench-webhooks-")
    env = environment(args, var_dir)
    prepare_database(args, env)
    port = free_port()
    processes: list[subprocess.Popen[bytes]] = []
    rows: list[Run] = []
    try:
        processes.append(
            subprocess.Popen(server_command(args, port), cwd=ROOT, env=env, start_new_session=True)
        )
        if not args.worker_after_send:
            processes.append(start_worker(args, env, port))
        wait_for(port)
        warm_up(port, count=args.workers * 8)
        if args.warm_up > 0 and not args.worker_after_send:
            # Steady state, as a server that has been up a while: the worker's first drains
            # import, compile and connect while the first measured second would be sent.
            log(f"warm-up: {args.warm_up:g} s at {args.rate:g}/s, not counted")
            warm = f"warm-{uuid.uuid4().hex[:8]}"
            _, _, warm_total = send_all(port, args.rate, args.warm_up, args.clients, warm)
            drain_wait(env, warm, warm_total, args.drain_timeout)
        for _ in range(args.neighbours):  # own sessions: not counted in any CPU column
            processes.append(
                subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            )
        for attempt in range(args.repeat):
            run = f"bench-{uuid.uuid4().hex[:8]}"
            log(
                f"run {attempt + 1}: {int(args.rate * args.duration)} deliveries at {args.rate:g}/s"
            )
            began = time.monotonic()
            cpu_before, parts_before = cpu_times(), session_cpu()
            latencies, statuses, total = send_all(port, args.rate, args.duration, args.clients, run)
            sent_for = time.monotonic() - began
            busy, stolen = cpu_share(cpu_before, cpu_times())
            sessions = {"server": processes[0].pid, "PostgreSQL": -1, "client": os.getsid(0)}
            if not args.worker_after_send:
                sessions["worker"] = processes[1].pid
            cpu = cpu_per_delivery(parts_before, session_cpu(), sessions, total)
            if args.worker_after_send:
                processes.append(start_worker(args, env, port))
            log("waiting for the queue to drain")
            stored, processed, drain = drain_wait(env, run, total, args.drain_timeout)
            rows.append(
                Run(
                    latencies,
                    statuses,
                    total,
                    sent_for,
                    busy,
                    stolen,
                    stored,
                    processed,
                    drain,
                    cpu,
                )
            )
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=20)
        shutil.rmtree(var_dir, ignore_errors=True)

    database = "SQLite" if args.database == "sqlite" else "PostgreSQL"
    lines = [
        SECTION,
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} CPUs; "
        f"{database}; Celery on Redis ({args.celery_concurrency} processes, niceness "
        f"{args.worker_nice}); {server_label(args)}; DEBUG=0; "
        f"the {len(deliveries())} octokit payloads round-robin, signed; {args.repeat} run(s) "
        "one after the other against the same processes"
        + (f"; {args.neighbours} busy loop(s) running beside them." if args.neighbours else "."),
        "",
        "| run | sent | 2xx | stored | processed | ack p50 | ack p99 | ack max "
        "| drain after last ack | CPU busy / stolen | CPU a delivery: server, worker, "
        "PostgreSQL, client |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for number, row in enumerate(rows, 1):
        lines.append(
            f"| {number}: {args.rate:g}/s for {args.duration:g} s (took {row.sent_for:.1f} s)"
            f"{', worker started after' if args.worker_after_send else ''} | {row.total} | "
            f"{row.ok} | {row.stored} | {row.processed} | {row.p50:.1f} ms | {row.p99:.1f} ms | "
            f"{max(row.latencies):.1f} ms | {row.drain:.1f} s | {row.busy:.0f} % / "
            f"{row.stolen:.0f} % | "
            + ", ".join(f"{row.cpu.get(part, 0):.2f}" for part in CPU_PARTS)
            + " ms |"
        )
    met = sum(row.p99 < 20 and row.whole for row in rows)
    lines += [
        "",
        f"Median of {len(rows)}: ack p50 {statistics.median(r.p50 for r in rows):.1f} ms, "
        f"p99 {statistics.median(r.p99 for r in rows):.1f} ms. Target (p99 under 20 ms, none "
        f"lost) met in {met} of {len(rows)}; lost: "
        f"{'none' if all(r.whole for r in rows) else 'SOME'}.",
    ]
    text = "\n".join(lines)
    print(text)
    if args.record:
        record(text)
    return 0 if all(row.whole for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
