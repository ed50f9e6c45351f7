"""Executors: where a run's process actually runs, behind one small interface.

``get_executor(name)`` returns the executor registered under ``name`` (``local``, ``ray``).
"""

from __future__ import annotations

from runs.executors.base import Executor, ExecutorError, JobSpec, JobState, JobStatus


def get_executor(name: str) -> Executor:
    if name == "local":
        from runs.executors.local import LocalExecutor

        return LocalExecutor()
    if name == "ray":
        from runs.executors.ray import RayExecutor

        return RayExecutor()
    raise ExecutorError(f"Unknown executor '{name}'; known: local, ray.")


__all__ = ["Executor", "ExecutorError", "JobSpec", "JobState", "JobStatus", "get_executor"]
