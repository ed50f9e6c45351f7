"""The public run page and the run table the proposal page can include."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from runs.models import MetricSummary, Run, RunState
from runs.services import runs as run_writes
from tests.runs.runs_helpers import eager_tasks, frozen_plan, launched_plan  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("eager_tasks")]


def test_run_page_is_public_and_shows_state_metrics_and_timeline(
    client: Client, recipe: Any, django_assert_max_num_queries: Any
) -> None:
    run = Run.objects.filter(plan=launched_plan(recipe)).first()
    assert run is not None
    run_writes.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door="worker")
    MetricSummary.objects.create(run=run, key="eval/loss", last=2.25, min=2.0, max=5.0, step=9)
    with django_assert_max_num_queries(8):
        response = client.get(run.get_absolute_url())
    page = response.content.decode()
    assert response.status_code == 200
    assert "running" in page
    assert "eval/loss" in page
    assert "2.2500" in page  # runs.presentation writes it
    assert "queued → running" in page


def test_missing_run_is_404(client: Client) -> None:
    assert client.get("/runs/999999/").status_code == 404


def test_a_plans_run_table_lists_its_runs(client: Client, recipe: Any) -> None:
    plan = launched_plan(recipe)
    html = client.get(f"/plans/{plan.pk}/runs/").content.decode()
    assert html.count('href="/runs/') == 2
    assert "baseline" in html
    assert "<code>capacity_factor=2</code>" in html
    not_launched = frozen_plan(recipe)
    assert "No runs yet" in client.get(f"/plans/{not_launched.pk}/runs/").content.decode()
