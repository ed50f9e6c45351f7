"""Executors: where a run's process actually runs, behind one small interface.

``get_executor(name)`` returns the executor registered under ``name``: ``local``, ``ray``, ``iris``, or
``pool:<name>`` (the agents of a pool pull their runs; see ``runs/executors/pool.py``).
"""

from __future__ import annotations

from runs.executors.base import Executor, ExecutorError, JobSpec, JobState, JobStatus
from runs.validators import (
    EXECUTOR_NAME_MAX,
    EXECUTORS,
    POOL_PREFIX,
    is_pull_executor,
    pool_name,
    validate_executor_name,
)


def get_executor(name: str) -> Executor:
    if name == "local":
        from runs.executors.local import LocalExecutor

        return LocalExecutor()
    if name == "ray":
        from runs.executors.ray import RayExecutor

        return RayExecutor()
    if name == "iris":
        from runs.executors.iris import IrisExecutor

        return IrisExecutor()
    if pool := pool_name(name):
        from runs.executors.pool import PoolExecutor

        return PoolExecutor(pool)
    if name == "external":  # claimed by hand or through MLflow; executed elsewhere; never a target
        from runs.executors.external import ExternalExecutor

        return ExternalExecutor()
    raise ExecutorError(
        f"Unknown executor '{name[:60]}'; known: {', '.join(EXECUTORS)} and pool:<name>."
    )


def executor_unavailable(name: str) -> str:
    """Why this site cannot start runs on ``name`` now, or "" when it can: runs for an
    executor the site has not set up (or does not know) wait in the queue with this reason."""
    try:
        return get_executor(name).unavailable()
    except ExecutorError as exc:
        return str(exc)


__all__ = [
    "EXECUTORS",
    "EXECUTOR_NAME_MAX",
    "POOL_PREFIX",
    "Executor",
    "ExecutorError",
    "JobSpec",
    "JobState",
    "JobStatus",
    "executor_unavailable",
    "get_executor",
    "is_pull_executor",
    "pool_name",
    "validate_executor_name",
]
