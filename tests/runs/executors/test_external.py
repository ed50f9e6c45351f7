"""Runs claimed through MLflow are executed elsewhere: the reconciler watches their
heartbeat (any write) and settles a cancel without an executor to stop."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from runs.mlflow import services
from runs.models import Run, RunState
from runs.services import reconcile
from runs.services import runs as run_writes
from tests.runs.runs_helpers import launched_plan

pytestmark = pytest.mark.django_db


def claimed(recipe: Any, maintainer: Any) -> Run:
    plan = launched_plan(recipe)
    services.run_create(
        caller=services.Caller(user=maintainer), experiment_id=str(plan.pk), tags=[], run_name=""
    )
    run = Run.objects.get(plan=plan, executor="external")
    assert run.state == RunState.RUNNING
    return run


def test_a_claimed_run_silent_past_its_timeout_is_crashed(recipe: Any, maintainer: Any) -> None:
    run = claimed(recipe, maintainer)
    assert reconcile.run_reconcile(run_id=run.pk).state == RunState.RUNNING  # type: ignore[union-attr]
    Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    settled = reconcile.run_reconcile(run_id=run.pk)
    assert settled is not None and settled.state == RunState.CRASHED
    assert settled.failure_kind == "infra"


def test_a_claimed_run_is_killed_once_canceled(recipe: Any, maintainer: Any) -> None:
    run = claimed(recipe, maintainer)
    run_writes.run_cancel(run_id=run.pk, actor=maintainer)
    settled = reconcile.run_reconcile(run_id=run.pk)
    assert settled is not None and settled.state == RunState.KILLED


def test_claiming_takes_queued_runs_in_plan_order_until_none_is_left(
    recipe: Any, maintainer: Any
) -> None:
    plan = launched_plan(recipe)
    order = list(
        Run.objects.filter(plan=plan).order_by("entry__index").values_list("pk", flat=True)
    )
    caller = services.Caller(user=maintainer)
    got = [
        services.run_create(caller=caller, experiment_id=str(plan.pk), tags=[], run_name="")[
            "info"
        ]["run_id"]
        for _ in order
    ]
    assert got == [str(pk) for pk in order]
    with pytest.raises(services.MlflowError, match="no queued run to claim"):
        services.run_create(caller=caller, experiment_id=str(plan.pk), tags=[], run_name="")
