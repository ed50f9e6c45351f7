#!/usr/bin/env python
"""The floor under bench/agents.py's lease latency: no Django, no database, no lease.

    .venv/bin/python bench/agents_floor.py             # 5 rounds of each server, alternating
    .venv/bin/python bench/agents_floor.py --agents 200 --rounds 3

``bench/agents.py`` measures a lease from the run's offer to the answer in the agent's hands,
for 200 agents whose polls are held when a 256-run plan is offered: a burst of 200 answers.
This script measures what the same 200 client threads (one keep-alive ``http.client``
connection each, as in ``bench/agents.py``) see when a server that does *nothing* answers
200 held requests at once: each request waits on an event, and one request per worker sets
it at an agreed wall-clock time; the latency is from that time to the client having read
and parsed a 1.6 kB JSON answer. Two servers, taking turns:

- ``gthread``: gunicorn, 2 gthread workers x 256 threads (the agent door's worker class in
  the README and in ``bench/agents.py``), a bare WSGI function;
- ``asgi``: uvicorn, 2 workers, a bare ASGI function (the cheapest way Python holds many
  connections: no thread per request).

Whatever the site does on top (authenticate, lease in a transaction, build the offer) only
adds to these figures; if the floor's p99 is above a target, that target cannot be met on
this machine with clients on it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv" / "bin"
HOST = "127.0.0.1"

SERVER = """
import asyncio, json, threading, time

BODY = json.dumps({"lease": {"id": 1, "expires_at": "x" * 32}, "job": {"env": "y" * 1500}}).encode()
HEADERS = [("Content-Type", "application/json"), ("Content-Length", str(len(BODY)))]
_event = threading.Event()


def wsgi(environ, start_response):
    if environ["PATH_INFO"] == "/go":
        time.sleep(max(0.0, float(environ["QUERY_STRING"]) - time.time()))
        _event.set()
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]
    environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    _event.wait(60)
    start_response("200 OK", HEADERS)
    return [BODY]


_aevent = None


async def asgi(scope, receive, send):
    global _aevent
    if scope["type"] != "http":
        return
    if _aevent is None:
        _aevent = asyncio.Event()
    while (await receive()).get("more_body"):
        pass
    if scope["path"] == "/go":
        await asyncio.sleep(max(0.0, float(scope["query_string"]) - time.time()))
        _aevent.set()
        body, headers = b"ok", [("Content-Type", "text/plain")]
    else:
        await _aevent.wait()
        body, headers = BODY, HEADERS
    await send({"type": "http.response.start", "status": 200,
                "headers": [(k.lower().encode(), v.encode()) for k, v in headers]})
    await send({"type": "http.response.body", "body": body})
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def start(kind: str, port: int, workdir: str) -> subprocess.Popen[bytes]:
    if kind == "gthread":
        argv = [str(VENV / "gunicorn"), "floor_app:wsgi", "-k", "gthread", "-w", "2"]
        argv += ["--threads", "256", "-b", f"{HOST}:{port}", "--log-level", "warning"]
    else:
        argv = [str(VENV / "uvicorn"), "floor_app:asgi", "--workers", "2", "--host", HOST]
        argv += ["--port", str(port), "--log-level", "warning"]
    return subprocess.Popen(argv, cwd=workdir, start_new_session=True)


def wait_for_port(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection((HOST, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing answers on port {port}")


def burst(port: int, agents: int) -> list[float]:
    """``agents`` held requests answered at once: each one's latency in ms."""
    received: list[float] = []
    lock = threading.Lock()
    sent = threading.Semaphore(0)

    def agent() -> None:
        conn = http.client.HTTPConnection(HOST, port, timeout=90)
        conn.connect()
        sent.release()
        conn.request(
            "POST",
            "/api/v1/agent/poll/",
            body=json.dumps({"wait": 25}),
            headers={"Authorization": "Bearer x", "Content-Type": "application/json"},
        )
        response = conn.getresponse()
        json.loads(response.read())
        with lock:
            received.append(time.time())
        conn.close()

    threads = [threading.Thread(target=agent, daemon=True) for _ in range(agents)]
    for thread in threads:
        thread.start()
    for _ in threads:
        sent.acquire()
    time.sleep(2.0)  # every request is read and held
    at = time.time() + 0.5

    def go() -> None:  # several connections, so that each worker process gets one
        conn = http.client.HTTPConnection(HOST, port, timeout=90)
        conn.request("GET", f"/go?{at}")
        conn.getresponse().read()

    goers = [threading.Thread(target=go, daemon=True) for _ in range(8)]
    for thread in goers:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return sorted((r - at) * 1000 for r in received)


def pct(values: list[float], p: float) -> float:
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float]]] = {"gthread": [], "asgi": []}
    with tempfile.TemporaryDirectory() as workdir:
        Path(workdir, "floor_app.py").write_text(SERVER)
        for round_ in range(args.rounds):
            for kind, rows in results.items():
                port = free_port()
                server = start(kind, port, workdir)
                try:
                    wait_for_port(port)
                    time.sleep(1.5)  # both workers up
                    latencies = burst(port, args.agents)
                finally:
                    os.killpg(server.pid, signal.SIGTERM)
                    server.wait(timeout=20)
                if len(latencies) != args.agents:
                    print(f"{kind}: {len(latencies)} of {args.agents} answered", file=sys.stderr)
                    return 1
                p50, p99 = pct(latencies, 50), pct(latencies, 99)
                rows.append((p50, p99))
                print(f"round {round_ + 1} {kind:8} p50 {p50:6.1f} ms  p99 {p99:6.1f} ms")
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(
        f"{args.agents} held requests answered at once, {args.rounds} rounds each, "
        f"{os.cpu_count()} CPUs, load average at the end {' '.join(load)}"
    )
    for kind, rows in results.items():
        print(
            f"{kind:8} median of rounds: p50 {statistics.median(r[0] for r in rows):.1f} ms, "
            f"p99 {statistics.median(r[1] for r in rows):.1f} ms "
            f"(p99 from {min(r[1] for r in rows):.1f} to {max(r[1] for r in rows):.1f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
