"""The MLflow tracking API, driven by the real ``mlflow`` client against a live server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from django.db import connections
from rest_framework.authtoken.models import Token

from runs import queue
from runs.models import MetricPoint, MetricSummary, Run, RunEvent, RunState
from tests.runs.runs_helpers import launched_plan

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _mlflow_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No telemetry, no retries that hide an answer, no run left active between tests."""
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("DO_NOT_TRACK", "true")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
    monkeypatch.delenv("MLFLOW_TRACKING_TOKEN", raising=False)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    import mlflow
    import mlflow.tracking.fluent

    # set_experiment() is remembered by the process; each test starts from the default
    monkeypatch.setattr(mlflow.tracking.fluent, "_active_experiment_id", None)
    # The client keeps its HTTP connections open, and the live server's thread its database
    # connection with it: close the latter at the end of each request.
    monkeypatch.setitem(connections.databases["default"], "CONN_MAX_AGE", 0)
    yield
    while mlflow.active_run() is not None:
        mlflow.end_run()


def running_run(recipe: Any) -> tuple[Run, str]:
    run = Run.objects.filter(plan=launched_plan(recipe)).order_by("pk").first()
    assert run is not None
    run = queue.run_transition(
        run_id=run.pk,
        to_state=RunState.RUNNING,
        door="worker",
        changes={"token_hash": queue.token_hash(queue.run_token(run=run))},
    )
    return run, queue.run_token(run=run)


@pytest.fixture
def job(recipe: Any, live_server: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Run, str]:
    """A running run and the MLflow client pointed at the site with the run's token, as a
    launched job's environment has it."""
    import mlflow

    run, token = running_run(recipe)
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", token)
    mlflow.set_tracking_uri(live_server.url + "/mlflow")
    return run, token


def call(live_server: Any, method: str, path: str, body: Any = None, token: str = "") -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = f"{live_server.url}/mlflow/api/2.0/mlflow/{path}"
    if method == "GET":
        return requests.get(url, params=body, headers=headers, timeout=20)
    data = body if isinstance(body, bytes | str) else json.dumps(body)
    return requests.post(
        url, data=data, headers={**headers, "Content-Type": "application/json"}, timeout=20
    )


def test_stock_client_logs_a_run_that_shows_on_its_page(
    job: tuple[Run, str], live_server: Any
) -> None:
    import mlflow
    from mlflow.tracking import MlflowClient

    run, _ = job
    with mlflow.start_run() as active:
        assert active.info.run_id == str(run.pk)
        assert active.info.experiment_id == str(run.plan_id)
        mlflow.log_params({"learning_rate": "0.003", "optimizer": "adam"})
        for step in range(5):
            mlflow.log_metrics({"train/loss": 3.0 - 0.1 * step, "lr": 0.003}, step=step)
        from mlflow.entities import Metric, Param, RunTag

        MlflowClient().log_batch(
            str(run.pk),
            metrics=[Metric("eval/loss", 2.5 - 0.01 * s, 1_800_000_000_000, s) for s in range(100)],
            params=[Param("width", "32")],
            tags=[RunTag("team", "moe")],
        )
        history = MlflowClient().get_metric_history(str(run.pk), "eval/loss")
        assert [m.step for m in history] == list(range(100))
        assert history[3].value == pytest.approx(2.47)
    # leaving the block ends the run FINISHED; a second run shows end_run(status="FAILED")
    run.refresh_from_db()
    assert run.state == RunState.FINISHED
    assert run.tracker_config == {"learning_rate": "0.003", "optimizer": "adam", "width": "32"}
    assert run.tracker_tags["team"] == "moe"
    assert "mlflow.user" in run.tracker_tags or "mlflow.source.name" in run.tracker_tags
    assert MetricSummary.objects.get(run=run, key="train/loss").last == pytest.approx(2.6)
    assert MetricPoint.objects.filter(run=run, key="eval/loss").count() == 100
    events = list(RunEvent.objects.filter(run=run).values_list("verb", "door"))
    assert ("finished", "mlflow") in events

    page = requests.get(f"{live_server.url}/runs/{run.pk}/", timeout=20).text
    assert "train/loss" in page
    assert "eval/loss" in page
    assert "learning_rate" in page
    assert "team" in page


def test_end_run_failed_fails_the_run(job: tuple[Run, str]) -> None:
    import mlflow

    run, _ = job
    mlflow.start_run()
    mlflow.log_metric("train/loss", 9.5, step=1)
    mlflow.end_run(status="FAILED")
    run.refresh_from_db()
    assert run.state == RunState.FAILED
    assert run.failure_kind == "code"
    assert run.finished_at is not None


def test_set_experiment_by_any_name_in_a_job_reports_to_the_job_run(job: tuple[Run, str]) -> None:
    import mlflow

    run, _ = job
    mlflow.set_experiment("my-sweep")
    with mlflow.start_run() as active:
        assert active.info.run_id == str(run.pk)
        mlflow.log_metric("train/loss", 1.0, step=0)
    run.refresh_from_db()
    assert run.tracker_tags["marin.experiment_name"] == "my-sweep"
    assert run.state == RunState.FINISHED


def test_reads_are_public_and_speak_mlflow(job: tuple[Run, str], live_server: Any) -> None:
    import mlflow
    from mlflow.tracking import MlflowClient

    run, token = job
    with mlflow.start_run():
        mlflow.log_metric("train/loss", 2.0, step=3)
    del token
    # no token at all: reads still answer
    import os

    os.environ.pop("MLFLOW_TRACKING_TOKEN", None)
    client = MlflowClient()
    got = client.get_run(str(run.pk))
    assert got.data.metrics == {"train/loss": 2.0}
    assert got.info.status == "FINISHED"
    experiment = client.get_experiment_by_name(f"plan-{run.plan_id}")
    assert experiment is not None and experiment.experiment_id == str(run.plan_id)
    assert client.get_experiment_by_name("no-such-thing") is None
    found = client.search_runs([str(run.plan_id)], filter_string="attributes.status = 'FINISHED'")
    assert [r.info.run_id for r in found] == [str(run.pk)]
    assert client.search_runs([str(run.plan_id)], filter_string="metrics.`train/loss` < 1") == []
    experiments = client.search_experiments(filter_string=f"name = 'plan-{run.plan_id}'")
    assert [e.experiment_id for e in experiments] == [str(run.plan_id)]


def test_maintainer_token_claims_a_queued_run_of_the_plan(
    recipe: Any, maintainer: Any, live_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlflow

    plan = launched_plan(recipe)
    first = Run.objects.filter(plan=plan).order_by("entry__index").first()
    assert first is not None and first.state == RunState.QUEUED
    token = Token.objects.create(user=maintainer).key
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", token)
    mlflow.set_tracking_uri(live_server.url + "/mlflow")
    with mlflow.start_run(experiment_id=str(plan.pk)) as active:
        assert active.info.run_id == str(first.pk)
        mlflow.log_metric("train/loss", 1.5, step=2)
    first.refresh_from_db()
    assert first.executor == "external"
    assert first.state == RunState.FINISHED
    assert RunEvent.objects.filter(run=first, door="mlflow", actor=maintainer).exists()


def test_unsupported_endpoint_answers_in_mlflows_shape(live_server: Any) -> None:
    for path in ("artifacts/list", "registered-models/create", "nothing"):
        response = call(live_server, "POST", path, {})
        assert response.status_code == 404
        body = response.json()
        assert body["error_code"] == "ENDPOINT_NOT_FOUND"
        assert "does not implement" in body["message"]
    response = requests.get(f"{live_server.url}/mlflow/#/experiments", timeout=20)
    assert response.headers["Content-Type"] == "application/json"
    assert response.json()["error_code"] == "ENDPOINT_NOT_FOUND"
