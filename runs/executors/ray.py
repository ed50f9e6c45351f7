"""The ``ray`` executor: the Ray Jobs API of an existing cluster at ``RAY_ADDRESS``.

The submission id is the job id (run and attempt), so a repeated submit finds the job
already there instead of starting a second one. The job's working directory travels in the
job's runtime environment (``working_dir``): its config and, when the launch pinned a commit,
a copy of that commit's clean checkout (``runs/executors/code.py``), which the job runs from;
without a pinned commit the site's ``runs`` package travels with it (``py_modules``), so
the cluster needs no copy of marin-site. Files holding secrets (the manifest of a job of
several trainings, every run's token) are not in the working directory: they travel as a
variable of the submission's ``env_vars``, and the job's first step writes them out. Its Python (``RUNS_RAY_PYTHON``, by default this
one) needs numpy.
Ray has no time limit of its own: the reconciler stops a run that outlives its limit.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys
from typing import Any

from django.conf import settings

from runs.executors.base import ExecutorError, JobSpec, JobState, JobStatus, secret_files_step
from runs.executors.code import checkout_copy

OUT_OF_MEMORY = re.compile(r"out of memory|outofmemory|low on memory|\boom\b")
RAY_STATES = {
    "PENDING": JobState.PENDING,
    "RUNNING": JobState.RUNNING,
    "SUCCEEDED": JobState.SUCCEEDED,
    "FAILED": JobState.FAILED,
    "STOPPED": JobState.STOPPED,
}


def ray_status(
    state: JobState, *, message: str, error_type: str, exit_code: int | None
) -> JobStatus:
    """How a Ray job ended, from Ray's own reason (its message and error type) and the
    driver's exit code. A job stopped or failed with a preemption reason is preempted (the
    run is requeued); a SIGKILL is an OOM only when Ray says memory ran out."""
    reason = f"{message} {error_type}".lower()
    if state in {JobState.FAILED, JobState.STOPPED} and "preempt" in reason:
        return JobStatus(JobState.PREEMPTED, message=message or error_type)
    if state != JobState.FAILED:
        return JobStatus(state, message=message)
    if "supervisor" in error_type.lower():
        return JobStatus(JobState.MISSING, message=message or error_type)
    if OUT_OF_MEMORY.search(reason):
        return JobStatus(JobState.FAILED, "oom", message or "Ray reports the job ran out of memory")
    if exit_code in (-9, 137):
        return JobStatus(
            JobState.KILLED,
            message=f"killed by SIGKILL (exit code {exit_code}); Ray gave no memory reason"
            + (f": {message}" if message else ""),
        )
    kind = "config" if exit_code == 2 else "code"
    return JobStatus(JobState.FAILED, kind, message or f"exit code {exit_code}")


class RayExecutor:
    name = "ray"

    def __init__(self, *, address: str | None = None) -> None:
        self.address = address or settings.RAY_ADDRESS

    def unavailable(self) -> str:
        if not self.address:
            return "no Ray cluster is set up on this site (RAY_ADDRESS)"
        if importlib.util.find_spec("ray") is None:  # bin/run installs the site without it
            return "Ray's client is not installed on this site (pip install -e '.[ray]')"
        return ""

    def _client(self) -> Any:
        if reason := self.unavailable():  # Ray would look for a cluster on this machine itself
            raise ExecutorError(reason)
        from ray.job_submission import JobSubmissionClient

        try:
            return JobSubmissionClient(self.address)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ExecutorError(f"Ray at {self.address} does not answer: {exc}") from exc

    def _exists(self, client: Any, job_id: str) -> bool:
        try:
            client.get_job_status(job_id)
        except RuntimeError:
            return False
        return True

    def submit(self, job: JobSpec) -> str:
        job.workdir.mkdir(parents=True, exist_ok=True)
        if job.code_dir is not None:
            checkout_copy(job.code_dir, job.workdir)
        for name, content in job.files.items():
            if name not in job.secret_files:  # a manifest's tokens never go in the bundle
                (job.workdir / name).write_text(content)
        python = settings.RUNS_RAY_PYTHON or sys.executable
        argv = list(job.argv)
        if argv and argv[0] == sys.executable:
            argv[0] = python
        # The files holding secrets go as a variable of this submission's runtime
        # environment, which the job's first step writes out in its folder (mode 0600).
        hidden, argv = secret_files_step(JobSpec(**{**job.__dict__, "argv": argv}), python=python)
        client = self._client()
        if self._exists(client, job.job_id):
            return job.job_id
        try:
            client.submit_job(
                entrypoint=shlex.join(argv),
                submission_id=job.job_id,
                runtime_env={
                    "working_dir": str(job.workdir),
                    # The pinned commit's code is in the working directory; else the site's.
                    **(
                        {}
                        if job.code_dir is not None
                        else {"py_modules": [str(settings.BASE_DIR / "runs")]}
                    ),
                    "env_vars": {"PYTHONUNBUFFERED": "1", **job.env, **hidden},
                },
                metadata={"job_id": job.job_id},
            )
        except RuntimeError as exc:
            if self._exists(client, job.job_id):  # a concurrent submit won: same job
                return job.job_id
            raise ExecutorError(f"Ray refused job {job.job_id}: {exc}") from exc
        return job.job_id

    def poll(self, external_id: str) -> JobStatus:
        client = self._client()
        try:
            info = client.get_job_info(external_id)
        except RuntimeError as exc:
            if "does not exist" in str(exc):
                return JobStatus(JobState.MISSING, message=f"Ray has no job {external_id}")
            raise ExecutorError(str(exc)) from exc
        state = RAY_STATES.get(str(getattr(info.status, "value", info.status)), JobState.MISSING)
        return ray_status(
            state,
            message=info.message or "",
            error_type=str(info.error_type or ""),
            exit_code=getattr(info, "driver_exit_code", None),
        )

    def cancel(self, external_id: str) -> None:
        client = self._client()
        try:
            client.stop_job(external_id)
        except RuntimeError as exc:
            if "does not exist" not in str(exc):
                raise ExecutorError(str(exc)) from exc

    def logs(self, external_id: str, *, tail_bytes: int = 65536) -> str:
        try:
            text: str = self._client().get_job_logs(external_id)
        except RuntimeError:
            return ""
        return text[-tail_bytes:]
