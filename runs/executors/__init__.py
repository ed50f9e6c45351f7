"""Executors: where a run's process actually runs, behind one small interface.

``get_executor(name)`` returns the executor registered under ``name`` (``local``, ``ray``).
"""

from __future__ import annotations

from django.conf import settings

from runs.executors.base import Executor, ExecutorError, JobSpec, JobState, JobStatus


def get_executor(name: str) -> Executor:
    if name == "local":
        from runs.executors.local import LocalExecutor

        return LocalExecutor()
    if name == "ray":
        from runs.executors.ray import RayExecutor

        return RayExecutor()
    raise ExecutorError(f"Unknown executor '{name}'; known: local, ray.")


def executor_unavailable(name: str) -> str:
    """Why this site cannot start runs on ``name`` now, or "" when it can.

    Runs for an executor the site has not set up wait in the queue with this reason, rather
    than fail: the ``ray`` executor needs ``RAY_ADDRESS``.
    """
    if name == "ray" and not settings.RAY_ADDRESS:
        return "no Ray cluster is set up on this site (RAY_ADDRESS)"
    return ""


__all__ = [
    "Executor",
    "ExecutorError",
    "JobSpec",
    "JobState",
    "JobStatus",
    "executor_unavailable",
    "get_executor",
]
