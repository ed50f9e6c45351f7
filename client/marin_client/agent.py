#!/usr/bin/env python3
"""marin-site-agent: run the approved experiments of a marin-site on this machine.

Standard library only: download this one file from the site (its footer links it) and run
it with any Python 3.9 or newer.

    python3 marin-site-agent.py register --url https://SITE --token mreg_...   # once
    python3 marin-site-agent.py run                                            # and leave it

``register`` turns the pool's registration token into this agent's own credential and keeps
it in a file only you can read (``--state``, default ``~/.config/marin-site-agent/agent.json``).
``run`` long-polls the site for work (one request held up to ~30 s, answered at once when a
run is offered to the pool) and executes one run at a time:

- the run's working directory gets ``config.json`` and ``marin_run_client.py`` (the client
  the job reports through, served by the site); the job starts in its own process group with
  this agent's environment plus ``RUN_ID``, ``RUN_TOKEN``, ``RUN_API_URL``, ``RUN_ATTEMPT``
  and ``RUN_GIT_SHA`` (the code version pinned at approval: check it out before you trust
  the numbers). Your own secrets (``WANDB_API_KEY``, ...) reach the job from your
  environment; the site never sends any.
- while it runs, the agent renews its lease every few seconds with the tail of the job's
  log; if the site says the run was canceled, or the run's time limit passes, the job gets
  SIGTERM, a grace period, then SIGKILL.
- when the job ends, the agent reports the evidence (exit status or signal, and the
  cgroup's OOM-kill counter when it can read one) and the site classifies it.
- SIGTERM or Ctrl-C to the agent stops the job the same way and reports it as preempted:
  the site puts the run back in the queue for its next attempt.
- if the site stops answering for longer than the lease, or answers that the lease is over
  (409), the run is no longer this agent's: the job is stopped and not reported. If the
  agent is revoked (401), it stops its job and exits.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

VERSION = "1.0"
DEFAULT_STATE = Path.home() / ".config" / "marin-site-agent" / "agent.json"
LOG_TAIL_BYTES = 16_384
RUN_CLIENT_NAME = "marin_run_client.py"
PR_SET_PDEATHSIG = 1

log = logging.getLogger("marin-site-agent")


class Unauthorized(Exception):
    """The site refused this agent's credential (revoked, or its pool retired)."""


class LeaseOver(Exception):
    """The site says the lease ended: the run belongs to someone else now."""


class SiteError(Exception):
    """The site refused a request for a reason retrying will not fix."""


class Interrupted(Exception):
    """SIGTERM or SIGINT while waiting for work: there is nothing to stop but the wait."""


# --- talking to the site -------------------------------------------------------------------


class Site:
    def __init__(self, url: str, credential: str = "") -> None:
        self.url = url.rstrip("/")
        self.credential = credential

    def api(self, path: str) -> str:
        return f"{self.url}/api/v1/{path}"

    def post(
        self, path: str, body: dict[str, Any], *, token: str = "", timeout: float = 30.0
    ) -> tuple[int, dict[str, Any]]:
        data = json.dumps(body).encode()
        request = urllib.request.Request(  # noqa: S310  (the site the agent registered with)
            self.api(path),
            data=data,
            method="POST",
            headers={
                "Authorization": f"Bearer {token or self.credential}",
                "Content-Type": "application/json",
                "User-Agent": f"marin-site-agent/{VERSION}",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
                text = response.read().decode() or "{}"
                status = response.status
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:1000]
            if exc.code == 401:
                raise Unauthorized(detail) from exc
            if exc.code == 409:
                raise LeaseOver(detail) from exc
            if exc.code in {408, 425, 429, 500, 502, 503, 504}:
                raise OSError(f"{path}: {exc.code} {detail}") from exc
            raise SiteError(f"{path} refused with {exc.code}: {detail}") from exc
        if status == 204:
            return status, {}
        answer = json.loads(text)
        return status, answer if isinstance(answer, dict) else {}

    def fetch(self, path: str, target: Path, *, timeout: float = 300.0) -> None:
        """Save what ``path`` (an agent's door) answers to ``target``, with the credential;
        LeaseOver on 409, SiteError on another refusal, OSError when the site is away."""
        request = urllib.request.Request(  # noqa: S310  (the site the agent registered with)
            f"{self.url}{path}",
            headers={
                "Authorization": f"Bearer {self.credential}",
                "User-Agent": f"marin-site-agent/{VERSION}",
            },
        )
        try:
            with (
                urllib.request.urlopen(request, timeout=timeout) as response,  # noqa: S310
                target.open("wb") as out,
            ):
                shutil.copyfileobj(response, out)
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:1000]
            if exc.code == 409:
                raise LeaseOver(detail) from exc
            raise SiteError(f"{path} refused with {exc.code}: {detail}") from exc

    def download(self, path: str, target: Path) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}{path}", timeout=30) as response:  # noqa: S310
                target.write_bytes(response.read())
        except (OSError, urllib.error.URLError) as exc:
            log.warning("could not fetch %s: %s", path, exc)
            return False
        return True


# --- evidence about how a job ended --------------------------------------------------------


def oom_counter() -> tuple[int | None, str]:
    """This process's cgroup's OOM-kill count and where it was read, or (None, "")."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None, ""
    candidates = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2, mounted alone or beside v1 ("hybrid")
            for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
                candidates.append(Path(root) / path.lstrip("/") / "memory.events")
        elif "memory" in controllers.split(","):  # cgroup v1
            base = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            candidates.append(base / "memory.oom_control")
    for candidate in candidates:
        try:
            text = candidate.read_text()
        except OSError:
            continue
        for row in text.splitlines():
            name, _, value = row.partition(" ")
            if name == "oom_kill" and value.strip().isdigit():
                return int(value), str(candidate.parent)
    return None, ""


def _die_with_agent() -> None:
    """In the job's child process: get SIGKILL if the agent dies (Linux), so a killed agent
    leaves no orphan reporting for a lease that is no longer its own."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def log_tail(path: Path, size: int = LOG_TAIL_BYTES) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - size))
            data = handle.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    while len(text.encode()) > size:  # a replaced byte may have grown
        text = text[1:]
    return text


# --- the agent -----------------------------------------------------------------------------


class Agent:
    def __init__(self, site: Site, work_dir: Path, *, wait: float = 30.0) -> None:
        self.site = site
        self.work_dir = work_dir
        self.wait = wait
        self.stopping = threading.Event()
        self.idle = False

    def stop(self, signum: int, frame: Any) -> None:
        log.info("got %s: stopping", signal.Signals(signum).name)
        self.stopping.set()
        if self.idle:  # break out of the held poll; a lease it brought would expire unused
            raise Interrupted

    def run(self, *, once: bool = False) -> int:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        backoff = 1.0
        while not self.stopping.is_set():
            try:
                self.idle = True
                _, offer = self.site.post(
                    "agent/poll/", {"wait": self.wait}, timeout=self.wait + 30
                )
            except Interrupted:
                break
            except Unauthorized as exc:
                log.error("the site refused this agent (revoked, or its pool retired): %s", exc)
                return 3
            except (OSError, ValueError, SiteError) as exc:
                log.warning("polling failed (%s); again in %.0f s", exc, backoff)
                self.stopping.wait(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            finally:
                self.idle = False
            backoff = 1.0
            if not offer:
                continue
            try:
                self.execute(offer)
            except Unauthorized as exc:
                log.error("the site refused this agent mid-run: %s", exc)
                return 3
            if once:
                break
        return 0

    def execute(self, offer: dict[str, Any]) -> None:
        lease, run, job = offer["lease"], offer["run"], offer["job"]
        lease_id = int(lease["id"])
        if self.stopping.is_set():  # stopped while the offer was on its way: hand it back
            self.report(lease_id, lease, {"outcome": "preempted", "message": "agent stopping"})
            return
        workdir = self.work_dir / f"run-{int(run['id'])}" / f"attempt-{int(run['attempt'])}"
        workdir.mkdir(parents=True, exist_ok=True)
        for name, content in job.get("files", {}).items():
            if "/" in name or name.startswith("."):
                continue
            (workdir / name).write_text(content)
        self.site.download(f"/agent/{RUN_CLIENT_NAME}", workdir / RUN_CLIENT_NAME)
        code_paths: list[str] = []
        if (job.get("code") or {}).get("archive"):
            try:
                code_paths = code_import_paths(self.code(job["code"]), job["code"].get("paths"))
            except LeaseOver as exc:
                log.warning("lease %s: over before its code came: %s", lease_id, exc)
                return
            except (OSError, SiteError, tarfile.TarError) as exc:
                message = f"could not fetch the pinned code: {exc}"[:1000]
                self.report(lease_id, lease, {"outcome": "start_failed", "message": message})
                return
        placeholder = job.get("python_placeholder", "{python}")
        argv = [sys.executable if part == placeholder else part for part in job["argv"]]
        env = dict(os.environ)
        env.update({k: str(v) for k, v in job.get("env", {}).items()})
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(workdir), *code_paths, os.environ.get("PYTHONPATH", "")) if p
        )
        env["PYTHONUNBUFFERED"] = "1"
        log.info(
            "lease %s: run %s attempt %s (%s v%s at %s): %s",
            lease_id,
            run["id"],
            run["attempt"],
            run.get("recipe"),
            run.get("recipe_version"),
            run.get("git_sha") or "no pinned ref",
            " ".join(argv),
        )
        log_path = workdir / "log.txt"
        oom_before, cgroup = oom_counter()
        try:
            with log_path.open("ab") as out:
                child = subprocess.Popen(  # noqa: S603  (the site's recipe command, by design)
                    argv,
                    cwd=workdir,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    preexec_fn=_die_with_agent,  # noqa: PLW1509  (one call to prctl)
                )
        except OSError as exc:
            self.report(lease_id, lease, {"outcome": "start_failed", "message": str(exc)[:1000]})
            return
        outcome = self.supervise(
            child, lease_id=lease_id, lease=lease, run=run, job=job, log_path=log_path
        )
        if outcome is None:
            return  # the lease is over: nothing of this job is ours to report
        returncode = child.returncode
        oom_after, _ = oom_counter()
        report: dict[str, Any] = {"outcome": outcome, "log_tail": log_tail(log_path)}
        if outcome == "exited":
            if returncode is not None and returncode < 0:
                report["signal"] = -returncode
            else:
                report["exit_code"] = returncode
        if oom_before is not None and oom_after is not None:
            report["oom_kills"] = max(0, oom_after - oom_before)
            report["cgroup"] = cgroup
        log.info("lease %s: job ended (%s, return code %s)", lease_id, outcome, returncode)
        self.report(lease_id, lease, report)

    def code(self, code: dict[str, Any]) -> Path:
        """The pinned commit's source, fetched from the site once per commit and unpacked
        under the work folder's ``code/<sha>``: the job imports its code from there."""
        ref = re.sub(r"[^0-9A-Za-z._-]", "_", str(code.get("ref") or "unknown"))[:80]
        target = self.work_dir / "code" / ref
        if (target / ".complete").exists():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            archive = Path(tmp) / "code.tar.gz"
            self.site.fetch(str(code["archive"]), archive)
            unpacked = Path(tmp) / "tree"
            unpacked.mkdir()
            with tarfile.open(archive, "r:gz") as tar:
                _extract(tar, unpacked)
            (unpacked / ".complete").write_text(str(code.get("ref") or ""))
            shutil.rmtree(target, ignore_errors=True)
            unpacked.rename(target)
        return target

    def supervise(
        self,
        child: subprocess.Popen[bytes],
        *,
        lease_id: int,
        lease: dict[str, Any],
        run: dict[str, Any],
        job: dict[str, Any],
        log_path: Path,
    ) -> str | None:
        """Renew the lease while the job runs; how it ended, or None if the lease is over."""
        renew_every = float(lease.get("renew_every", 15))
        lease_seconds = float(lease.get("seconds", 60))
        grace = float(job.get("grace_seconds", 30))
        time_limit = float(run.get("time_limit_seconds") or 0)
        started = last_renewed = time.monotonic()
        next_renewal = started + renew_every
        while True:
            if child.poll() is not None:
                self._sweep(child)
                return "exited"
            now = time.monotonic()
            reason = ""
            if self.stopping.is_set():
                reason = "preempted"
            elif time_limit and now - started > time_limit:
                reason = "time_limit"
            if now >= next_renewal:
                try:
                    _, answer = self.site.post(
                        f"agent/leases/{lease_id}/renew/", {"log_tail": log_tail(log_path)}
                    )
                    last_renewed = time.monotonic()
                    if answer.get("cancel_requested"):
                        reason = reason or "canceled"
                except LeaseOver as exc:
                    log.warning("lease %s is over (%s): stopping its job", lease_id, exc)
                    self._stop(child, grace=0)
                    return None
                except Unauthorized:
                    self._stop(child, grace=0)
                    raise
                except (OSError, ValueError, SiteError) as exc:
                    log.warning("renewing lease %s failed: %s", lease_id, exc)
                    if time.monotonic() - last_renewed > lease_seconds:
                        log.warning("lease %s has run out: stopping its job", lease_id)
                        self._stop(child, grace=0)
                        return None
                next_renewal = time.monotonic() + renew_every
            if reason:
                log.info("lease %s: stopping the job (%s)", lease_id, reason)
                self._stop(child, grace=grace)
                return reason
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=0.2)

    @staticmethod
    def _stop(child: subprocess.Popen[bytes], *, grace: float) -> None:
        """SIGTERM to the job's process group, ``grace`` seconds, then SIGKILL."""
        if grace > 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=grace)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()

    @staticmethod
    def _sweep(child: subprocess.Popen[bytes]) -> None:
        """What the job left behind in its process group goes with it."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)

    def report(self, lease_id: int, lease: dict[str, Any], body: dict[str, Any]) -> None:
        deadline = time.monotonic() + float(lease.get("seconds", 60))
        delay = 0.5
        while True:
            try:
                self.site.post(f"agent/leases/{lease_id}/report/", body)
                return
            except LeaseOver as exc:
                log.warning("lease %s was over before its report: %s", lease_id, exc)
                return
            except (OSError, ValueError) as exc:
                if time.monotonic() + delay > deadline:
                    log.error("could not report lease %s: %s", lease_id, exc)
                    return
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
            except SiteError as exc:
                log.error("the report of lease %s was refused: %s", lease_id, exc)
                return


# --- the command line ----------------------------------------------------------------------


def code_import_paths(tree: Path, paths: Any) -> list[str]:
    """The folders of an unpacked commit the job imports from: the lease's ``paths``
    (relative to the tree; "" is its root), those that are inside it and exist; the root
    when the lease names none."""
    wanted = paths if isinstance(paths, list) and paths else [""]
    root = tree.resolve()
    found: list[str] = []
    for item in wanted[:8]:
        if not isinstance(item, str):
            continue
        folder = (root / item).resolve()
        if folder.is_dir() and (folder == root or root in folder.parents):
            found.append(str(folder))
    return found


def _extract(tar: tarfile.TarFile, into: Path) -> None:
    """Unpack a source archive, refusing members that would land outside ``into`` (and
    links and devices, where Python has no ``data`` filter yet)."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(into, filter="data")
        return
    root = into.resolve()
    for member in tar.getmembers():
        where = (into / member.name).resolve()
        if not (member.isfile() or member.isdir()) or not str(where).startswith(str(root)):
            raise tarfile.TarError(f"refused member {member.name!r}")
    tar.extractall(into)  # noqa: S202  (every member checked above)


def load_state(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"no agent state in {path} ({exc}); run 'register' first") from exc
    if not isinstance(data, dict) or not data.get("url") or not data.get("credential"):
        raise SystemExit(f"{path} holds no agent credential; run 'register' again")
    return data


def register(args: argparse.Namespace) -> int:
    site = Site(args.url)
    labels = [label.strip() for label in (args.labels or "").split(",") if label.strip()]
    try:
        _, answer = site.post(
            "agent/register/",
            {"name": args.name, "labels": labels, "version": VERSION},
            token=args.token,
        )
    except Unauthorized as exc:
        print(f"registration refused: {exc}", file=sys.stderr)  # noqa: T201
        return 3
    except (SiteError, OSError) as exc:
        print(f"registration failed: {exc}", file=sys.stderr)  # noqa: T201
        return 1
    state: Path = args.state
    state.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(state, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump({"url": site.url, **answer}, handle, indent=2)
    agent = answer.get("agent", {})
    print(  # noqa: T201
        f"registered as agent {agent.get('id')} ({agent.get('name')}) of pool "
        f"{agent.get('pool')}; credential saved in {state}. Now: {sys.argv[0]} run"
    )
    return 0


def run(args: argparse.Namespace) -> int:
    state = load_state(args.state)
    work_dir = args.work_dir or args.state.parent / "work"
    agent = Agent(Site(state["url"], state["credential"]), Path(work_dir), wait=args.wait)
    log.info(
        "agent %s of pool %s polling %s (version %s)",
        state.get("agent", {}).get("id"),
        state.get("agent", {}).get("pool"),
        state["url"],
        VERSION,
    )
    return agent.run(once=args.once)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="marin-site-agent", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--version", action="version", version=f"marin-site-agent {VERSION}")
    parser.add_argument(
        "--state",
        type=Path,
        default=Path(os.environ.get("MARIN_AGENT_STATE", DEFAULT_STATE)),
        help="where the agent's credential is kept (default: %(default)s)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    reg = commands.add_parser("register", help="turn a registration token into a credential")
    reg.add_argument("--url", required=True, help="the site, e.g. https://marin.example.org")
    reg.add_argument("--token", required=True, help="the pool's registration token")
    reg.add_argument(
        "--name", default=socket.gethostname() or platform.node(), help="shown on the site"
    )
    reg.add_argument("--labels", default="", help="comma-separated, e.g. gpu:a5000,cuda:12")
    go = commands.add_parser("run", help="poll for runs and execute them, one at a time")
    go.add_argument("--work-dir", type=Path, help="where runs' directories go")
    go.add_argument("--wait", type=float, default=30.0, help="seconds one poll may be held")
    go.add_argument("--once", action="store_true", help="exit after one run")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    if args.command == "register":
        return register(args)
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
