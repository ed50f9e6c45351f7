"""Executors: where a run's process actually runs, behind one small interface.

``get_executor(name)`` returns the executor registered under ``name`` (``local``, ``ray``).
"""

from __future__ import annotations

from runs.executors.base import Executor, ExecutorError, JobSpec, JobState, JobStatus

EXECUTORS = ("local", "ray")


def get_executor(name: str) -> Executor:
    if name == "local":
        from runs.executors.local import LocalExecutor

        return LocalExecutor()
    if name == "ray":
        from runs.executors.ray import RayExecutor

        return RayExecutor()
    if name == "external":  # runs claimed through a tracker door; no recipe picks it
        from runs.executors.external import ExternalExecutor

        return ExternalExecutor()
    raise ExecutorError(f"Unknown executor '{name}'; known: {', '.join(EXECUTORS)}.")


def executor_unavailable(name: str) -> str:
    """Why this site cannot start runs on ``name`` now, or "" when it can: runs for an
    executor the site has not set up (or does not know) wait in the queue with this reason."""
    try:
        return get_executor(name).unavailable()
    except ExecutorError as exc:
        return str(exc)


__all__ = [
    "EXECUTORS",
    "Executor",
    "ExecutorError",
    "JobSpec",
    "JobState",
    "JobStatus",
    "executor_unavailable",
    "get_executor",
]
