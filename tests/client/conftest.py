"""A running run on a live site, with the environment the site gives the jobs it launches."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connections

from runs import tokens
from runs.models import Run, RunState
from runs.services import runs as run_writes
from tests.runs.runs_helpers import launched_plan


@pytest.fixture
def job(recipe: Any, live_server: Any, monkeypatch: pytest.MonkeyPatch) -> Run:
    """A running run; RUN_API_URL, RUN_ID and RUN_TOKEN point at it on the live server."""
    run = Run.objects.filter(plan=launched_plan(recipe)).order_by("pk").first()
    assert run is not None
    run = run_writes.run_transition(
        run_id=run.pk,
        to_state=RunState.RUNNING,
        door="worker",
        changes={"token_hash": tokens.token_hash(tokens.run_token(run=run))},
    )
    monkeypatch.setenv("RUN_API_URL", f"{live_server.url}/api/v1/")
    monkeypatch.setenv("RUN_ID", str(run.pk))
    monkeypatch.setenv("RUN_TOKEN", tokens.run_token(run=run))
    monkeypatch.setitem(connections.databases["default"], "CONN_MAX_AGE", 0)
    return run
