"""The ``pool:<name>`` executor: the agents of a pool pull their runs.

The site pushes nothing here. The dispatcher offers a queued run to the pool (within the
pool's, the plan's and the budget's limits: ``runs.services.dispatch.runs_dispatch``), an agent leases it
(``runs.pools.leases.lease_acquire``) and the reconciler settles it from its lease
(``runs.pools.leases.run_reconcile_leased``). A job's external id is its lease, ``lease-<id>``; its log is the
tail the agent last sent.
"""

from __future__ import annotations

from django.utils import timezone

from runs.executors.base import ExecutorError, JobSpec, JobState, JobStatus


def _lease_id(external_id: str) -> int | None:
    prefix, _, number = external_id.partition("-")
    return int(number) if prefix == "lease" and number.isdecimal() else None


class PoolExecutor:
    def __init__(self, pool: str) -> None:
        self.pool = pool
        self.name = f"pool:{pool}"

    def unavailable(self) -> str:
        from runs.pools.models import Pool

        row = Pool.objects.filter(name=self.pool).values_list("retired_at").first()
        if row is None:
            return f"there is no pool named '{self.pool}'"
        if row[0] is not None:
            return f"pool '{self.pool}' is retired"
        return ""

    def limit(self) -> int:
        from runs.pools.models import Pool

        limit = Pool.objects.filter(name=self.pool).values_list("max_concurrent_runs", flat=True)
        return limit.first() or 0

    def submit(self, job: JobSpec) -> str:
        raise ExecutorError(f"runs on {self.name} are pulled by its agents, never submitted")

    def poll(self, external_id: str) -> JobStatus:
        from runs.pools.models import Lease

        lease_id = _lease_id(external_id)
        lease = Lease.objects.filter(pk=lease_id).first() if lease_id else None
        if lease is None:
            return JobStatus(JobState.MISSING, message=f"no lease {external_id}")
        if lease.ended_at is None:
            if lease.expires_at <= timezone.now():
                return JobStatus(JobState.PREEMPTED, message="the lease expired")
            return JobStatus(JobState.RUNNING)
        state = {
            "exited": JobState.SUCCEEDED,
            "preempted": JobState.PREEMPTED,
            "lost": JobState.PREEMPTED,
            "revoked": JobState.PREEMPTED,
            "abandoned": JobState.PREEMPTED,
            "canceled": JobState.STOPPED,
        }.get(lease.end_reason, JobState.STOPPED)
        if state == JobState.SUCCEEDED and lease.outcome.get("classified_as") != "finished":
            state = JobState.FAILED
        return JobStatus(state, message=str(lease.outcome.get("message", "")))

    def cancel(self, external_id: str) -> None:
        """Nothing to push: the agent learns of the cancel from its next renewal's answer."""

    def logs(self, external_id: str, *, tail_bytes: int = 65536) -> str:
        from runs.pools.models import Lease

        lease_id = _lease_id(external_id)
        if lease_id is None:
            return ""
        tail = Lease.objects.filter(pk=lease_id).values_list("log_tail", flat=True).first()
        return (tail or "")[-tail_bytes:]
