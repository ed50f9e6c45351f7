"""A simulated campaign fed through the API: three attempts that overlap where they restart."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from rest_framework.test import APIClient

from runs import tokens as run_tokens
from runs.models import Run, RunState
from runs.series.rollup import series_refresh
from runs.services import runs as run_writes

THREE_POINT_SPEC = """axes:
  capacity_factor: [2.0, 4.0]
"""
TOKENS_PER_STEP = 1000


def start(run: Run) -> str:
    """Mark a queued run running as dispatch would (no executor) and give its token."""
    run_writes.run_transition(
        run_id=run.pk,
        to_state=RunState.RUNNING,
        door="worker",
        changes={"token_hash": run_tokens.token_hash(run_tokens.run_token(run=run))},
    )
    return run_tokens.run_token(run=run)


def feed(
    run: Run,
    token: str,
    steps: Iterable[int],
    values: dict[str, Callable[[int], float]],
    api: APIClient | None = None,
) -> None:
    """Post each key's value at each step through the metrics API, in batches."""
    client = api or APIClient()
    points = [
        {"key": key, "step": step, "value": value(step), "time": 1.8e9 + step}
        for step in steps
        for key, value in values.items()
    ]
    for start_at in range(0, len(points), 900):
        response = client.post(
            f"/api/v1/runs/{run.pk}/metrics/",
            data=json.dumps({"points": points[start_at : start_at + 900]}),
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {token}",
        )
        assert response.status_code == 200, response.content
    series_refresh(run_id=run.pk)  # what the worker does after a burst of points


def tokens(step: int) -> float:
    return float(step * TOKENS_PER_STEP)


def campaign_body(**extra: Any) -> dict[str, Any]:
    return {
        "slug": "big-run",
        "name": "Big run",
        "description": "A **long** run.",
        "target_tokens": 4_000_000.0,
        "target_flops": 4_000_000.0 * 6e9,
        "hardware": "v5p-512",
        "links": [{"label": "proposal", "url": "/proposals/1/"}],
        **extra,
    }
