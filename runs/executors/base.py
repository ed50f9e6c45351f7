"""The executor interface: submit a job, poll its status, cancel it, fetch its logs."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


class ExecutorError(Exception):
    """The executor could not do what was asked (a transient error unless said otherwise)."""


class JobState(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # canceled on our request
    PREEMPTED = "preempted"
    KILLED = "killed"  # ended by a signal from outside that no evidence ties to a cause
    MISSING = "missing"  # the executor no longer knows the job: it vanished


@dataclass(frozen=True)
class JobStatus:
    state: JobState
    failure_kind: str = ""  # one of Run's failure kinds when state is FAILED
    message: str = ""

    @property
    def is_done(self) -> bool:
        return self.state not in {JobState.PENDING, JobState.RUNNING}


@dataclass(frozen=True)
class JobSpec:
    job_id: str  # stable per run and attempt: submitting it twice starts one job
    argv: list[str]
    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # written into workdir before start
    # Names among ``files`` that hold secrets (a manifest's tokens): a scheduler that ships
    # the folder must not ship these in it (Iris hands them over as its secrets).
    secret_files: frozenset[str] = frozenset()
    time_limit_seconds: int = 3600
    # A clean checkout of the pinned commit to run from (``runs/executors/code.py``): the
    # job imports its code from there (and a remote executor ships it); None: the site's tree.
    code_dir: Path | None = None
    resources: dict[str, Any] = field(default_factory=dict)  # the recipe's, for a scheduler


class Executor(Protocol):
    name: str

    def unavailable(self) -> str:
        """Why this site cannot start jobs here now (not set up), or "" when it can."""
        ...

    def submit(self, job: JobSpec) -> str:
        """Start the job unless it already exists; return its external id."""
        ...

    def poll(self, external_id: str) -> JobStatus: ...

    def cancel(self, external_id: str) -> None:
        """Ask the job to stop (idempotent); ``poll`` reports STOPPED once it has."""
        ...

    def logs(self, external_id: str, *, tail_bytes: int = 65536) -> str: ...


# The job's first step when files holding secrets come as a variable (a scheduler that ships
# the job's folder must not ship them): write them (mode 0600), then become the job, the
# variable gone from its environment.
FILES_VARIABLE = "RUNS_JOB_FILES"
FILES_WRITER = (
    "import json, os, sys\n"
    "for name, text in json.loads(os.environ.pop(%r, '{}')).items():\n"
    "    fd = os.open(name, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)\n"
    "    os.write(fd, text.encode()); os.close(fd)\n"
    "os.execvp(sys.argv[1], sys.argv[1:])"
)


def secret_files_step(job: JobSpec, *, python: str) -> tuple[dict[str, str], list[str]]:
    """The variable that carries ``job``'s secret files and the argument list that writes
    them before it runs the job's own (``python``: an interpreter where the job runs);
    ``({}, job.argv)`` when it has none."""
    hidden = {name: text for name, text in job.files.items() if name in job.secret_files}
    if not hidden:
        return {}, list(job.argv)
    return (
        {FILES_VARIABLE: json.dumps(hidden)},
        [python, "-c", FILES_WRITER % FILES_VARIABLE, *job.argv],
    )
