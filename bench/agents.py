#!/usr/bin/env python
"""Many agents long-polling one server while large plans are approved, beside the floor.

    .venv/bin/python bench/agents.py                  # 200 agents, 5 rounds of a 256-run plan
    .venv/bin/python bench/agents.py --agents 50 --rounds 3 --record

Steps: a fresh PostgreSQL database (default ``h_reliability_bench``), migrated; gunicorn
(DEBUG=0) with gthread workers, the worker class the deployment page gives the agent door,
and a Celery worker on Redis; a pool, ``--rounds`` submitted proposals whose plans have 256
runs each, and ``--agents`` agents registered through the API. Each agent is a thread of this
process with a keep-alive connection: it long-polls ``/api/v1/agent/poll/`` (``--wait``
seconds), and when it gets a lease it "runs" for ``--job-seconds`` and reports exit 0, then
polls again.

Each round measures two servers, one after the other on the same machine:

- **the door**: once every agent waits in a held poll, one proposal is approved (in this
  process, as a maintainer would); the lease latency is from the run being offered to the
  pool (its ``offered`` event) to the agent holding the answer, for the leases answered from
  a held poll (the wake-up), and the round ends when its 256 runs have finished;
- **the floor** (``bench/agents_floor.py``'s gthread server, the same worker class and
  threads, doing nothing): the same number of client threads hold a request each and are
  all answered at once; its latency is from that moment to the answer read and parsed.

Each round prints both p50 and p99 and the ratio door / floor; the end prints the medians
of the rounds, and checks, over every round: every run leased exactly once and finished once,
no answer other than 200 or 204. Also printed: the time from each approval's commit to its
last lease, the polls answered at once (a run already waiting), and the server's memory (RSS
of gunicorn's master and workers, and their threads) before the agents, with every agent in
a held poll, and at the peak.

``--record`` adds the figures to bench/RESULTS.md, at the end of "## agents (bench/agents.py)".
"""

from __future__ import annotations

import argparse
import contextlib
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
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import agents_floor  # noqa: E402  (the floor's server and burst, measured in turn)

VENV = ROOT / ".venv" / "bin"
HOST = "127.0.0.1"
SECTION = "## agents (bench/agents.py)"
# 17 learning rates x 5 capacity factors x 3 top-k = 255 points, and the baseline: 256 runs.
SPEC = (
    "axes:\n"
    "  learning_rate: [0.001, 0.002, 0.004, 0.005, 0.006, 0.007, 0.008, 0.009, 0.01, 0.011,"
    " 0.012, 0.013, 0.014, 0.015, 0.016, 0.017, 0.018]\n"
    "  capacity_factor: [1.5, 2.0, 3.0, 4.0, 5.0]\n"
    "  top_k: [2, 3, 4]\n"
)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def environment(args: argparse.Namespace, port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "marin_site.settings",
            "DEBUG": "0",
            "SECRET_KEY": "bench-" + "x" * 40,
            "ALLOWED_HOSTS": HOST,
            "SECURE_COOKIES": "0",
            "DATABASE_URL": args.database,
            "CELERY_BROKER_URL": args.broker,
            "SITE_URL": f"http://{HOST}:{port}",
            "RUNS_PLAN_MAX_CONCURRENT": "100000",  # the pool's limit is the one that counts
            "RUNS_AGENT_POLL_SECONDS": str(args.wait),
            "GITHUB_TOKEN": "",
            "GITHUB_REPOSITORY": "",
            "LOG_LEVEL": "WARNING",
        }
    )
    return env


def fresh_database(args: argparse.Namespace, env: dict[str, str]) -> None:
    name = args.database.rsplit("/", 1)[1]
    for command in (["dropdb", "--if-exists"], ["createdb"]):
        subprocess.run([*command, "-h", HOST, "-U", "postgres", name], env=env, check=True)
    subprocess.run(
        [str(VENV / "python"), "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=env,
        check=True,
    )


def rss_and_threads(pids: list[int]) -> tuple[float, int]:
    """MB of resident memory and threads, summed over the processes."""
    rss_kb = threads = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss_kb += int(line.split()[1])
                elif line.startswith("Threads:"):
                    threads += int(line.split()[1])
    return rss_kb / 1024, threads


def server_pids(master: int) -> list[int]:
    children = Path(f"/proc/{master}/task/{master}/children")
    try:
        return [master, *(int(p) for p in children.read_text().split())]
    except OSError:
        return [master]


@dataclass
class Received:
    run_id: int
    lease_id: int
    sent: float  # time.time() when the poll was sent
    received: float  # time.time() when the answer was read


@dataclass
class Agents:
    port: int
    credentials: list[str]
    wait: float
    job_seconds: float
    received: list[Received] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    waiting: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def post(
        self, conn: http.client.HTTPConnection, path: str, credential: str, body: dict[str, object]
    ) -> tuple[int, bytes]:
        conn.request(
            "POST",
            path,
            body=json.dumps(body),
            headers={"Authorization": f"Bearer {credential}", "Content-Type": "application/json"},
        )
        response = conn.getresponse()
        data = response.read()
        with self.lock:
            self.statuses[response.status] = self.statuses.get(response.status, 0) + 1
        return response.status, data

    def agent(self, credential: str) -> None:
        conn = http.client.HTTPConnection(HOST, self.port, timeout=self.wait + 60)
        while not self.stop.is_set():
            sent = time.time()
            with self.lock:
                self.waiting += 1
            try:
                status, data = self.post(
                    conn, "/api/v1/agent/poll/", credential, {"wait": self.wait}
                )
            except (OSError, http.client.HTTPException):
                conn.close()
                time.sleep(0.5)
                continue
            finally:
                with self.lock:
                    self.waiting -= 1
            if status != 200:
                continue
            offer = json.loads(data)
            with self.lock:
                self.received.append(
                    Received(offer["run"]["id"], offer["lease"]["id"], sent, time.time())
                )
            time.sleep(self.job_seconds)
            self.post(
                conn,
                f"/api/v1/agent/leases/{offer['lease']['id']}/report/",
                credential,
                {"outcome": "exited", "exit_code": 0},
            )
        conn.close()


def register(port: int, token: str, count: int) -> list[str]:
    conn = http.client.HTTPConnection(HOST, port, timeout=180)  # a loaded machine is slow
    credentials = []
    for index in range(count):
        conn.request(
            "POST",
            "/api/v1/agent/register/",
            body=json.dumps({"name": f"bench-{index}", "labels": ["cpu:bench"], "version": "1.0"}),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        response = conn.getresponse()
        body = json.loads(response.read())
        if response.status != 201:
            raise RuntimeError(f"registration refused: {response.status} {body}")
        credentials.append(body["credential"])
    conn.close()
    return credentials


def wait_for_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            socket.create_connection((HOST, port), timeout=0.5).close()
            return
        time.sleep(0.1)
    raise RuntimeError(f"nothing answers on port {port}")


def wait_for_answer(port: int, timeout: float = 180) -> None:
    """Until the server answers a request (both workers, as far as the kernel lets us see)."""
    deadline = time.monotonic() + timeout
    answered = 0
    while time.monotonic() < deadline and answered < 4:
        with contextlib.suppress(OSError, http.client.HTTPException):
            conn = http.client.HTTPConnection(HOST, port, timeout=60)
            conn.request("GET", "/api/v1/pools/")
            answered += conn.getresponse().status == 200
            conn.close()
        time.sleep(0.2)


def main() -> int:  # noqa: PLR0915  (one measured scenario, step by step)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5, help="plans, each beside a floor burst")
    parser.add_argument(
        "--database", default="postgres://postgres@127.0.0.1:5432/h_reliability_bench"
    )
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/10")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")
    parser.add_argument(
        "--threads",
        type=int,
        default=256,
        help="threads per gunicorn worker (the kernel may give one worker most connections)",
    )
    parser.add_argument(
        "--pool-size", type=int, default=10, help="DATABASE_POOL_SIZE of the server (0: none)"
    )
    parser.add_argument("--wait", type=float, default=25.0, help="seconds a poll is held")
    parser.add_argument("--job-seconds", type=float, default=0.5)
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds a round may take")
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    if args.agents > args.threads:
        parser.error("every agent holds a thread, maybe all in one worker: --threads >= --agents")

    port = free_port()
    env = environment(args, port)
    log(f"fresh database {args.database}")
    fresh_database(args, env)
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.contrib.auth.models import Group, User
    from django.db.models import Count

    from proposals.models import Proposal
    from proposals.services import proposal_transition
    from runs.models import Plan, Recipe, Run, RunEvent, RunState
    from runs.pools import services as pools
    from runs.pools.models import Lease
    from runs.recipes.demo import TINY_MOE

    maintainer = User.objects.create_user("bench-max")
    maintainer.groups.add(Group.objects.get_or_create(name="maintainer")[0])
    author = User.objects.create_user("bench-carla")
    recipe = Recipe.objects.create(**dict(TINY_MOE))
    pool = pools.pool_create(
        actor=maintainer, data={"name": "bench", "max_concurrent_runs": 1000}, owner=maintainer
    )
    recipe.executor = pool.executor
    recipe.save()
    proposals = []
    for round_ in range(args.rounds):
        proposal = Proposal.objects.create(
            title=f"Bench: 256 runs on a pool, round {round_ + 1}",
            summary="Many agents, one plan.",
            description="bench",
            hypothesis="Every run is leased once.",
            success_metric="eval/loss",
            success_direction="lower",
            success_threshold=0.01,
            recipe=recipe,
            baseline={"steps": 10 + round_},  # new configs: a run done before is not run again
            ablation_spec=SPEC,
            budget_accelerator_hours=None,
            author=author,
        )
        proposal_transition(proposal_id=proposal.pk, action="submit", actor=author)
        proposals.append(proposal)
    _row, token = pools.registration_token_create(actor=maintainer, pool_id=pool.pk)

    log(f"starting gunicorn ({args.workers} gthread workers x {args.threads} threads) and Celery")
    server = subprocess.Popen(
        [
            str(VENV / "gunicorn"),
            "marin_site.wsgi",
            "-b",
            f"{HOST}:{port}",
            "-k",
            "gthread",
            "-w",
            str(args.workers),
            "--threads",
            str(args.threads),
            "--timeout",
            str(int(args.wait) + 30),
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env={**env, "DATABASE_CONN_MAX_AGE": "0", "DATABASE_POOL_SIZE": str(args.pool_size)},
        start_new_session=True,
    )
    worker = subprocess.Popen(
        [str(VENV / "celery"), "-A", "marin_site", "worker", "-l", "WARNING", "-c", "2"],
        cwd=ROOT,
        env=env,
        start_new_session=True,
    )
    peak = [0.0, 0]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            rss, threads = rss_and_threads(server_pids(server.pid))
            peak[0], peak[1] = max(peak[0], rss), max(peak[1], threads)
            time.sleep(0.1)

    rounds: list[Round] = []
    workdir = tempfile.TemporaryDirectory()
    Path(workdir.name, "floor_app.py").write_text(agents_floor.SERVER)
    try:
        wait_for_port(port)
        wait_for_answer(port)  # the workers have loaded Django
        idle_rss, idle_threads = rss_and_threads(server_pids(server.pid))
        log(f"registering {args.agents} agents")
        credentials = register(port, token, args.agents)
        agents = Agents(port, credentials, args.wait, args.job_seconds)
        threads = [
            threading.Thread(target=agents.agent, args=(c,), daemon=True) for c in credentials
        ]
        for thread in threads:
            thread.start()
        all_waiting(agents, args.agents)
        held_rss, held_threads = rss_and_threads(server_pids(server.pid))
        threading.Thread(target=sample, daemon=True).start()
        load_before = Path("/proc/loadavg").read_text().split()[0]
        for round_, proposal in enumerate(proposals, start=1):
            floor = floor_burst(workdir.name, args.agents)
            all_waiting(agents, args.agents)
            log(f"round {round_}: {agents.waiting} agents in held polls; approving plan {round_}")
            approved_at = time.time()
            proposal_transition(proposal_id=proposal.pk, action="approve", actor=maintainer)
            committed_at = time.time()
            plan_id = Proposal.objects.get(pk=proposal.pk).plan_id
            assert plan_id is not None
            expected = Plan.objects.get(pk=plan_id).run_count
            deadline = time.monotonic() + args.timeout
            plan_runs: set[int] = set()
            while len(plan_runs) < expected and time.monotonic() < deadline:
                time.sleep(0.05)  # the worker expands the plan after the approval
                plan_runs = set(Run.objects.filter(plan_id=plan_id).values_list("pk", flat=True))
            while time.monotonic() < deadline:
                with agents.lock:
                    mine = [r for r in agents.received if r.run_id in plan_runs]
                if len({r.run_id for r in mine}) >= len(plan_runs):
                    break
                time.sleep(0.05)
            while time.monotonic() < deadline:
                if (
                    not Run.objects.filter(plan_id=plan_id)
                    .exclude(state=RunState.FINISHED)
                    .exists()
                ):
                    break
                time.sleep(0.2)
            offered = {
                run_id: at.timestamp()
                for run_id, at in RunEvent.objects.filter(run__plan_id=plan_id, verb="offered")
                .order_by("pk")
                .values_list("run_id", "created_at")
            }
            done = Round(
                plan_id=plan_id,
                floor=floor,
                woken=sorted(
                    (r.received - offered[r.run_id]) * 1000
                    for r in mine
                    if r.run_id in offered and r.sent < offered[r.run_id]
                ),
                at_once=sorted(
                    (r.received - r.sent) * 1000
                    for r in mine
                    if r.run_id in offered and r.sent >= offered[r.run_id]
                ),
                approve_ms=(committed_at - approved_at) * 1000,
                all_leased_s=max((r.received for r in mine), default=time.time()) - committed_at,
            )
            rounds.append(done)
            log(done.line(round_))
        agents.stop.set()
        sampling.set()
        load_after = Path("/proc/loadavg").read_text().split()[0]
    finally:
        workdir.cleanup()
        for proc in (server, worker):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 15)
        for proc in (server, worker):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=20)

    plan_ids = [r.plan_id for r in rounds]
    runs = Run.objects.filter(plan_id__in=plan_ids)
    per_run = dict(
        Lease.objects.filter(run__plan_id__in=plan_ids)
        .values_list("run_id")
        .annotate(n=Count("pk"))
        .values_list("run_id", "n")
    )
    total = runs.count()
    leased_once = sum(1 for n in per_run.values() if n == 1)
    finished = runs.filter(state=RunState.FINISHED).count()
    finished_per_run = dict(
        RunEvent.objects.filter(run__plan_id__in=plan_ids, verb="finished")
        .values_list("run_id")
        .annotate(n=Count("pk"))
        .values_list("run_id", "n")
    )
    finished_once = sum(1 for n in finished_per_run.values() if n == 1)
    refused = {s: n for s, n in agents.statuses.items() if s not in (200, 204)}
    at_once = [ms for r in rounds for ms in r.at_once]

    revision = subprocess.run(
        ["git", "describe", "--always", "--dirty"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()

    def median(values: list[float]) -> float:
        return statistics.median(values) if values else float("nan")

    door_p50 = median([r.door(50) for r in rounds])
    door_p99 = median([r.door(99) for r in rounds])
    floor_p50 = median([r.floor_at(50) for r in rounds])
    floor_p99 = median([r.floor_at(99) for r in rounds])
    ratio = median([r.ratio() for r in rounds])
    lines = [
        f"code {revision or '?'} ({ROOT.name}); lease batch "
        f"{os.environ.get('RUNS_AGENT_LEASE_BATCH', 'default')}",
        f"agents {args.agents}, {len(rounds)} rounds of a plan of {total // max(1, len(rounds))} "
        f"runs, gunicorn {args.workers} gthread workers x {args.threads} threads, database pool "
        f"{args.pool_size or 'off'}, held polls of {args.wait:.0f} s, jobs of {args.job_seconds} s; "
        f"{os.cpu_count()} CPUs, load average {load_before} before, {load_after} after",
        f"leased exactly once: {leased_once} of {total} runs ({sum(per_run.values())} leases); "
        f"finished once: {finished_once} ({finished} finished); answers other than 200/204: "
        f"{refused or 'none'}",
        *(r.line(i) for i, r in enumerate(rounds, start=1)),
        f"median of rounds: door p50 {door_p50:.1f} ms, p99 {door_p99:.1f} ms; floor p50 "
        f"{floor_p50:.1f} ms, p99 {floor_p99:.1f} ms; p99 door / floor {ratio:.2f} "
        f"(target <= 2.00: {'met' if ratio <= 2 else 'not met'})",
        f"poll answered at once (a run waiting), all rounds: n={len(at_once)} "
        f"p50 {percentile(at_once, 50):.1f} ms, p99 {percentile(at_once, 99):.1f} ms",
        "(door: from the run's 'offered' event, written in the dispatcher's transaction just "
        "before it commits and NOTIFYs, to the agent having read and parsed the answer of its "
        "held poll; floor: bench/agents_floor.py's gthread server answering as many held "
        "requests at once, from that moment to the answer read and parsed)",
        f"server RSS: {idle_rss:.0f} MB idle ({idle_threads} threads), {held_rss:.0f} MB with "
        f"{args.agents} held polls ({held_threads} threads), peak {peak[0]:.0f} MB "
        f"({peak[1]} threads)",
    ]
    for line in lines:
        print(line)
    if args.record:
        record(lines)
    return 0 if leased_once == total == finished_once and not refused else 1


@dataclass
class Round:
    plan_id: int
    floor: list[float]  # ms, sorted
    woken: list[float]  # ms, sorted: leases answered from a held poll
    at_once: list[float]
    approve_ms: float
    all_leased_s: float

    def door(self, p: float) -> float:
        return percentile(self.woken, p)

    def floor_at(self, p: float) -> float:
        return percentile(self.floor, p)

    def ratio(self) -> float:
        return self.door(99) / self.floor_at(99)

    def line(self, number: int) -> str:
        return (
            f"round {number}: door p50 {self.door(50):6.1f} ms, p99 {self.door(99):6.1f} ms "
            f"(n={len(self.woken)}, all leased {self.all_leased_s:.2f} s after the commit); "
            f"floor p50 {self.floor_at(50):6.1f} ms, p99 {self.floor_at(99):6.1f} ms; "
            f"p99 door / floor {self.ratio():.2f}"
        )


def all_waiting(agents: Agents, count: int) -> None:
    """Until every agent waits in a held poll (its previous job reported), and a second more."""
    deadline = time.monotonic() + 60
    while agents.waiting < count and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)


def floor_burst(workdir: str, count: int) -> list[float]:
    """bench/agents_floor.py's gthread server: ``count`` held requests answered at once (ms)."""
    port = agents_floor.free_port()
    floor = agents_floor.start("gthread", port, workdir)
    try:
        agents_floor.wait_for_port(port)
        time.sleep(1.5)  # both workers up
        latencies = agents_floor.burst(port, count)
    finally:
        os.killpg(floor.pid, signal.SIGTERM)
        floor.wait(timeout=20)
    if len(latencies) != count:
        raise RuntimeError(f"the floor answered {len(latencies)} of {count} requests")
    return latencies


def record(lines: list[str]) -> None:
    """The figures at the end of the section (the analysis above them stays)."""
    path = ROOT / "bench" / "RESULTS.md"
    current = path.read_text()
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    text = f"### {stamp}\n\n" + "\n".join(f"    {line}" for line in lines) + "\n"
    if SECTION in current:
        head, _, rest = current.partition(SECTION)
        following = rest.find("\n## ")
        body, tail = (rest[:following], rest[following:]) if following >= 0 else (rest, "")
        current = head + SECTION + body.rstrip("\n") + "\n\n" + text + tail
    else:
        current = current.rstrip("\n") + f"\n\n{SECTION}\n\n" + text
    path.write_text(current)


if __name__ == "__main__":
    raise SystemExit(main())
