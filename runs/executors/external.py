"""The executor of runs executed elsewhere and claimed through a tracker door (MLflow's
``runs/create`` with a maintainer's token): nothing is started here. The run reports with
its token or the maintainer's; its heartbeat (any write counts) keeps it alive, and a
cancel is answered at its next write, which is refused once the run is killed.
"""

from __future__ import annotations

from runs.executors.base import JobSpec, JobState, JobStatus

PREFIX = "external-"


class ExternalExecutor:
    name = "external"

    def unavailable(self) -> str:
        return "waiting for a tracker to claim it (MLflow runs/create)"

    def submit(self, job: JobSpec) -> str:
        return PREFIX + job.job_id  # nothing to start: the job runs elsewhere

    def poll(self, external_id: str) -> JobStatus:
        from runs.models import Run

        cancel = (
            Run.objects.filter(external_id=external_id)
            .values_list("cancel_requested_at", flat=True)
            .first()
        )
        if cancel is not None:
            return JobStatus(JobState.STOPPED, message="canceled on the site")
        return JobStatus(JobState.RUNNING)

    def cancel(self, external_id: str) -> None:
        """Nothing to stop here; ``poll`` reports STOPPED once the cancel is recorded."""

    def logs(self, external_id: str, *, tail_bytes: int = 65536) -> str:
        return ""
