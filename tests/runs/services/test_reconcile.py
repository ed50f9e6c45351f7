"""The reconciler and a running run no executor of this site knows (made by hand): it is
crashed at once, saying why, and a cancel still ends it as killed."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from runs.models import Run, RunState
from runs.services import reconcile
from runs.services import runs as run_writes
from tests.runs.runs_helpers import eager_tasks, launched_plan  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("eager_tasks")]


def _running_without_executor(recipe: Any, *, quiet_seconds: int) -> Run:
    run = Run.objects.filter(plan=launched_plan(recipe)).order_by("pk").first()
    assert run is not None
    run_writes.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door="worker")
    Run.objects.filter(pk=run.pk).update(
        executor="",
        external_id="",
        heartbeat_timeout_seconds=60,
        heartbeat_at=timezone.now() - timedelta(seconds=quiet_seconds),
    )
    return run


def test_a_run_without_a_known_executor_is_crashed_at_once_with_the_reason(recipe: Any) -> None:
    heard = _running_without_executor(recipe, quiet_seconds=10)
    done = reconcile.run_reconcile(run_id=heard.pk)
    assert done is not None
    assert done.state == RunState.CRASHED
    assert done.failure_kind == "infra"
    assert "no executor of this site runs it: Unknown executor ''" in done.state_reason


def test_a_run_without_a_known_executor_can_be_canceled(recipe: Any) -> None:
    run = _running_without_executor(recipe, quiet_seconds=10)
    Run.objects.filter(pk=run.pk).update(cancel_requested_at=timezone.now())
    done = reconcile.run_reconcile(run_id=run.pk)
    assert done is not None
    assert done.state == RunState.KILLED
