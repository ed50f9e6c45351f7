"""Helpers for the board tests: finished runs of every origin, with final metrics."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from marin_site.celery import app as celery_app
from runs.board.models import BoardTrack
from runs.models import Recipe, Run, RunOrigin, RunState
from tests.runs.runs_helpers import launched_plan

FOUR_RUNS = """axes:
  capacity_factor: [1.5, 2.0, 3.0]
"""
BPB = "eval/paloma/c4_en/bpb"


def four_runs(recipe: Recipe, **kwargs: Any) -> list[Run]:
    plan = launched_plan(recipe, FOUR_RUNS, **kwargs)
    return list(Run.objects.filter(plan=plan).order_by("pk"))


def finish(
    run: Run,
    *,
    bpb: float,
    flops: float | None = None,
    state: str = RunState.FINISHED,
    origin: str = RunOrigin.LAUNCHED,
    git_sha: str = "0123456789abcdef0123456789abcdef01234567",
    **fields: Any,
) -> Run:
    metrics: dict[str, Any] = {BPB: bpb}
    if flops is not None:
        metrics["model_flops"] = flops
    metrics.update(fields.pop("metrics", {}))
    Run.objects.filter(pk=run.pk).update(
        state=state, final_metrics=metrics, origin=origin, git_sha=git_sha, **fields
    )
    run.refresh_from_db()
    return run


def track(slug: str = "bpb-1-3", **fields: Any) -> BoardTrack:
    defaults: dict[str, Any] = {
        "title": "Fastest to 1.3 BPB",
        "metric": BPB,
        "rule": "speedrun_threshold",
        "parameters": {"threshold": 1.3},
        "position": 0,
    }
    BoardTrack.objects.exclude(slug=slug).update(active=False)
    return BoardTrack.objects.create(slug=slug, **(defaults | fields))


@pytest.fixture
def eager() -> Iterator[None]:
    """The nudged tasks run in the test (as a worker would run them after the commit)."""
    before = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    try:
        yield
    finally:
        celery_app.conf.task_always_eager = before
