"""The ``external`` executor: runs a person claimed to execute by hand, elsewhere.

The site starts nothing and can stop nothing; the run's heartbeat, metrics and final status
through its token are all it knows (``runs/claims.py``). The reconciler crashes a claimed run
silent past its heartbeat timeout and fails one past its time limit, as for any run.
"""

from __future__ import annotations

from runs.executors.base import ExecutorError, JobSpec, JobState, JobStatus

EXTERNAL = "external"


class ExternalExecutor:
    name = EXTERNAL

    def unavailable(self) -> str:
        return "runs executed by hand are claimed by a person, never dispatched"

    def submit(self, job: JobSpec) -> str:
        raise ExecutorError("a claimed run is executed by the person who claimed it")

    def poll(self, external_id: str) -> JobStatus:
        return JobStatus(JobState.RUNNING)  # only its own reports say otherwise

    def cancel(self, external_id: str) -> None:
        """Nothing to stop here: the run's heartbeat answers that a cancel was requested."""

    def logs(self, external_id: str, *, tail_bytes: int = 65536) -> str:
        return ""
