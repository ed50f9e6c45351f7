"""The ``local`` executor: each job a subprocess on this machine, under a supervisor.

A job's external id is its working directory. The directory holds everything known
about the job: ``claim`` (written once, so a second submit starts nothing),
``supervisor.json`` and ``child.json`` (process ids), ``log.txt`` and, once it ended,
``exit.json``. Nothing is kept in memory that a restarted worker would need.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings

from runs.executors.base import JobSpec, JobState, JobStatus

logger = logging.getLogger(__name__)

CLAIM_GRACE_SECONDS = 15.0


def _read_json(path: Path) -> dict[str, object] | None:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _alive(pid: int, workdir: Path | None = None) -> bool:
    """Whether ``pid`` runs and is not a zombie (and, when given, belongs to ``workdir``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    if stat.rsplit(")", 1)[-1].split()[0] in {"Z", "X"}:
        return False
    return workdir is None or str(workdir) in cmdline


def _int(data: dict[str, object] | None, key: str) -> int | None:
    value = (data or {}).get(key)
    return value if isinstance(value, int) else None


def _status_from_signal(number: int, ended: dict[str, object]) -> JobStatus:
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    if number == signal.SIGKILL:
        oom_kills, cgroup = ended.get("oom_kills"), ended.get("cgroup") or "its cgroup"
        if isinstance(oom_kills, int) and oom_kills > 0:
            return JobStatus(
                JobState.FAILED,
                "oom",
                f"killed by the kernel's OOM killer (oom_kill +{oom_kills} in {cgroup})",
            )
        evidence = (
            f"no OOM kill was counted in {cgroup}"
            if oom_kills == 0
            else "no OOM counter could be read"
        )
        return JobStatus(JobState.KILLED, message=f"killed by SIGKILL from outside ({evidence})")
    if number == signal.SIGTERM:
        return JobStatus(JobState.PREEMPTED, message="ended by SIGTERM from outside")
    if number in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        return JobStatus(JobState.KILLED, message=f"ended by {name} from outside")
    return JobStatus(JobState.FAILED, "code", f"the job died of {name}")


def _claim(workdir: Path) -> bool:
    """Whether this submit may start the job: the first to create ``claim``, or the one that
    takes over a claim its submitter abandoned (killed after claiming, before its supervisor
    started: no ``supervisor.json`` and no ``exit.json`` after ``CLAIM_GRACE_SECONDS``).

    A submit that finds a younger claim with nothing started waits for the other submit to
    start the job, or for the claim to be abandoned: it returns only once the job is started
    or its own to start, so the run it is for is never given the id of a job that will never
    run (a worker killed in that moment left a run polled as pending, then crashed as
    vanished). The take-over renames the old claim away, which only one submit can do, then
    claims afresh."""
    claim = workdir / "claim"
    while True:
        try:
            os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            return True
        except FileExistsError:
            pass
        try:
            age = time.time() - claim.stat().st_mtime
        except FileNotFoundError:
            continue  # another submit is taking it over right now: look again
        if (workdir / "supervisor.json").exists() or (workdir / "exit.json").exists():
            return False  # started by the submit that claimed it
        if age < CLAIM_GRACE_SECONDS:
            time.sleep(0.1)  # that submit is starting it (a second or so), or died
            continue
        try:
            claim.rename(workdir / f"claim.abandoned-{time.time_ns()}")
            os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except (FileNotFoundError, FileExistsError):
            continue  # another submit took it over first: it is theirs to start
        logger.warning("took over the claim of %s: its submitter died before starting it", workdir)
        return True


class LocalExecutor:
    name = "local"

    def __init__(self, *, grace_seconds: float | None = None) -> None:
        self.grace_seconds = (
            grace_seconds if grace_seconds is not None else settings.RUNS_LOCAL_GRACE_SECONDS
        )

    def unavailable(self) -> str:
        return ""  # the worker's own machine

    def submit(self, job: JobSpec) -> str:
        workdir = job.workdir.resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        if not _claim(workdir):
            return str(workdir)  # already submitted: one job per id
        for name, content in job.files.items():
            (workdir / name).write_text(content)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", str(workdir)),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "PYTHONPATH": str(settings.BASE_DIR),
            "PYTHONUNBUFFERED": "1",
            **job.env,
        }
        argv = [
            sys.executable,
            "-m",
            "runs.executors.supervise",
            "--workdir",
            str(workdir),
            "--time-limit",
            str(job.time_limit_seconds),
            "--grace",
            str(self.grace_seconds),
            "--detach",
            *(["--child-pythonpath", str(job.code_dir)] if job.code_dir else []),
            "--",
            *job.argv,
        ]
        with (workdir / "supervisor.log").open("ab") as log:
            # The supervisor forks, records its pid in supervisor.json and this one returns.
            subprocess.run(  # noqa: S603  (argv is built here from the recipe)
                argv,
                cwd=workdir,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                check=True,
                timeout=30,
            )
        return str(workdir)

    def poll(self, external_id: str) -> JobStatus:
        workdir = Path(external_id)
        ended = _read_json(workdir / "exit.json")
        if ended is not None:
            return self._status_from_exit(ended)
        supervisor = _int(_read_json(workdir / "supervisor.json"), "pid")
        if supervisor is not None and _alive(supervisor, workdir):
            return JobStatus(JobState.RUNNING)
        ended = _read_json(workdir / "exit.json")  # it may have ended between the two reads
        if ended is not None:
            return self._status_from_exit(ended)
        claim = workdir / "claim"
        if (
            supervisor is None
            and claim.exists()
            and time.time() - claim.stat().st_mtime < CLAIM_GRACE_SECONDS
        ):
            return JobStatus(JobState.PENDING)
        return JobStatus(JobState.MISSING, message="the job's supervisor is gone")

    @staticmethod
    def _status_from_exit(ended: dict[str, object]) -> JobStatus:
        """How the job ended, from the evidence its supervisor wrote: never a guess."""
        returncode = ended.get("returncode")
        reason = ended.get("reason")
        if reason == "canceled":
            return JobStatus(JobState.STOPPED, message="stopped on request")
        if reason == "preempted":
            return JobStatus(
                JobState.PREEMPTED, message="the job's supervisor got SIGTERM from outside"
            )
        if reason == "time_limit":
            return JobStatus(JobState.FAILED, "timeout", "the time limit was reached")
        if returncode == 0:
            return JobStatus(JobState.SUCCEEDED)
        if isinstance(returncode, int) and returncode < 0:
            return _status_from_signal(-returncode, ended)
        if returncode == 2:
            return JobStatus(JobState.FAILED, "config", "the job refused its config (exit 2)")
        return JobStatus(JobState.FAILED, "code", f"the job exited with {returncode}")

    def cancel(self, external_id: str) -> None:
        workdir = Path(external_id)
        if (workdir / "exit.json").exists():
            return
        supervisor = _int(_read_json(workdir / "supervisor.json"), "pid")
        if supervisor is not None and _alive(supervisor, workdir):
            (workdir / "cancel").touch()  # so the supervisor tells our SIGTERM from outside's
            with contextlib.suppress(ProcessLookupError):
                os.kill(supervisor, signal.SIGTERM)
            return
        # The supervisor is gone: stop what is left of the job's group ourselves.
        child = _int(_read_json(workdir / "child.json"), "pgid")
        if child is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child, signal.SIGKILL)

    def logs(self, external_id: str, *, tail_bytes: int = 65536) -> str:
        path = Path(external_id) / "log.txt"
        try:
            with path.open("rb") as log:
                log.seek(0, os.SEEK_END)
                size = log.tell()
                log.seek(max(0, size - tail_bytes))
                return log.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""
