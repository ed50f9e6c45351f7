"""The ``external`` executor: runs executed elsewhere, never dispatched from here.

Two doors put a run on it: a person claims a queued run to execute by hand
(``runs/services/claims.py``), or a tracker claims one through MLflow's ``runs/create`` with a
maintainer's token (``runs/mlflow/``). The site starts nothing and can stop nothing; the
run's heartbeat, metrics and final status through its token are all it knows (any write
counts as a heartbeat). The reconciler crashes a run silent past its heartbeat timeout and
fails one past its time limit, as for any run; a cancel is recorded, answered at the run's
next write, and the reconciler marks the run killed.
"""

from __future__ import annotations

from runs.executors.base import ExecutorError, JobSpec, JobState, JobStatus

EXTERNAL = "external"
PREFIX = "external-"  # every external id starts with it, whichever door claimed the run


class ExternalExecutor:
    name = EXTERNAL

    def unavailable(self) -> str:
        return "runs executed elsewhere are claimed (by hand or through MLflow), never dispatched"

    def submit(self, job: JobSpec) -> str:
        raise ExecutorError("an external run is executed by whoever claimed it")

    def poll(self, external_id: str) -> JobStatus:
        from runs.models import Run

        cancel = (
            Run.objects.filter(executor=EXTERNAL, external_id=external_id)
            .values_list("cancel_requested_at", flat=True)
            .first()
        )
        if cancel is not None:
            return JobStatus(JobState.STOPPED, message="canceled on the site")
        return JobStatus(JobState.RUNNING)  # only its own reports say otherwise

    def cancel(self, external_id: str) -> None:
        """Nothing to stop here; ``poll`` reports STOPPED once the cancel is recorded."""

    def logs(self, external_id: str, *, tail_bytes: int = 65536) -> str:
        return ""
