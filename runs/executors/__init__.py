"""Executors: where a run's process actually runs, behind one small interface.

``get_executor(name)`` returns the executor registered under ``name``: ``local``, ``ray``, or
``pool:<name>`` (the agents of a pool pull their runs; see ``runs/executors/pool.py``).
"""

from __future__ import annotations

import re

from django.core.exceptions import ValidationError

from runs.executors.base import Executor, ExecutorError, JobSpec, JobState, JobStatus

EXECUTORS = ("local", "ray")
POOL_PREFIX = "pool:"
EXECUTOR_NAME_MAX = 40
POOL_EXECUTOR = re.compile(r"^pool:([a-z0-9][a-z0-9-]{0,31})\Z")


def pool_name(executor: str) -> str:
    """The pool an executor name targets, or "" when it is not ``pool:<name>``."""
    match = POOL_EXECUTOR.match(executor)
    return match.group(1) if match else ""


def is_pull_executor(executor: str) -> bool:
    """Whether runs on this executor are pulled by agents rather than pushed by the site."""
    return executor.startswith(POOL_PREFIX)


def validate_executor_name(value: str) -> None:
    """A model validator: ``local``, ``ray`` or ``pool:<slug>`` (blank is the field's business)."""
    if value and value not in EXECUTORS and not pool_name(value):
        raise ValidationError(
            f"'{value[:60]}' is no executor; use local, ray or pool:<name> "
            "(a pool's name: lowercase letters, digits and '-', at most 32)."
        )


def get_executor(name: str) -> Executor:
    if name == "local":
        from runs.executors.local import LocalExecutor

        return LocalExecutor()
    if name == "ray":
        from runs.executors.ray import RayExecutor

        return RayExecutor()
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
