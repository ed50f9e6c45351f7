"""The MLflow tracking API, driven by the real ``mlflow`` client against a live server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import requests
from django.db import connections
from django.utils import timezone
from rest_framework.authtoken.models import Token

from marin_site.events import Verb
from runs import tokens
from runs.models import MetricPoint, MetricSummary, Run, RunEvent, RunState
from runs.services import dispatch
from runs.services import runs as run_writes
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
    run = run_writes.run_transition(
        run_id=run.pk,
        to_state=RunState.RUNNING,
        door="worker",
        changes={"token_hash": tokens.token_hash(tokens.run_token(run=run))},
    )
    return run, tokens.run_token(run=run)


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
    assert (first.executor, first.origin) == ("external", "claimed")
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


# --- bad input: MLflow's error code and status, nothing stored ------------------------------


def stored(run: Run) -> tuple[int, int, Any, Any]:
    run.refresh_from_db()
    return (
        MetricPoint.objects.filter(run=run).count(),
        MetricSummary.objects.filter(run=run).count(),
        run.tracker_config,
        run.tracker_tags,
    )


def metric(key: str = "train/loss", value: Any = 1.0, step: Any = 1) -> dict[str, Any]:
    return {"key": key, "value": value, "timestamp": 1_800_000_000_000, "step": step}


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"metrics": [metric(step="NaN")]}, "metrics[0].step"),
        ({"metrics": [metric(step=1.5)]}, "64-bit integer"),
        ({"metrics": [metric(value="lots")]}, "valid double"),
        ({"metrics": [{**metric(), "timestamp": "NaN"}]}, "timestamp"),
        ({"metrics": [metric(key="bad key!")]}, "names may only contain"),
        ({"metrics": [metric(key="../escape")]}, "resolve to other names"),
        ({"params": [{"key": "lr", "value": 0.1}]}, "must be a string"),
        ({"params": [{"key": "lr", "value": "x" * 6001}]}, "maximum length of 6000"),
        ({"tags": [{"key": "t", "value": "x" * 8001}]}, "maximum length of 8000"),
        ({"params": [{"key": "a", "value": "1"}, {"key": "a", "value": "2"}]}, "Duplicate"),
        ({"metrics": [metric(step=s) for s in range(1001)]}, "at most 1000 metrics"),
        ({"params": [{"key": f"p{i}", "value": "1"} for i in range(101)]}, "at most 100 params"),
        ({"tags": [{"key": f"t{i}", "value": "1"} for i in range(101)]}, "at most 100 tags"),
        ({"metrics": "not a list"}, "must be a list"),
    ],
)
def test_log_batch_refuses_bad_input_and_stores_nothing(
    job: tuple[Run, str], live_server: Any, body: dict[str, Any], fragment: str
) -> None:
    run, token = job
    before = stored(run)
    response = call(
        live_server,
        "POST",
        "runs/log-batch",
        {"run_id": str(run.pk), "metrics": [metric(key="good", step=7)], **body},
        token,
    )
    assert response.status_code == 400, response.text
    assert response.json()["error_code"] == "INVALID_PARAMETER_VALUE"
    assert fragment in response.json()["message"]
    assert stored(run) == before


def test_log_batch_stores_what_it_can_and_names_the_keys_it_cannot_once(
    job: tuple[Run, str], live_server: Any
) -> None:
    """MLflow stores a key with a space and a negative step; the site cannot: those points
    are left out alone (MLflow's answer stays {}), the rest is stored, and the timeline
    names each such key once."""
    run, token = job
    body = {
        "run_id": str(run.pk),
        "metrics": [
            metric(key="good", step=7),
            metric(key="has space", step=7),
            metric(key="neg", step=-1),
            metric(key="nan", value="NaN", step=3),
        ],
    }
    for _ in range(2):
        response = call(live_server, "POST", "runs/log-batch", body, token)
        assert response.status_code == 200, response.text
        assert response.json() == {}
    assert list(MetricPoint.objects.filter(run=run).values_list("key", "step")) == [("good", 7)]
    notes = sorted(
        RunEvent.objects.filter(run=run, verb=Verb.METRIC_REFUSED).values_list("message", flat=True)
    )
    assert notes == [
        "'has space' is not stored: marin-site stores metric keys of at most 200 letters, "
        "digits and _./@:+- (no spaces)",
        "neg at step -1 is not stored: marin-site stores steps from 0",
    ]
    assert RunEvent.objects.filter(run=run, verb=Verb.NOT_FINITE).count() == 1


def test_log_batch_over_one_megabyte_is_refused_unread(
    job: tuple[Run, str], live_server: Any
) -> None:
    run, token = job
    before = stored(run)
    body = json.dumps({"run_id": str(run.pk), "tags": [{"key": "t", "value": "x" * 1_000_100}]})
    response = call(live_server, "POST", "runs/log-batch", body, token)
    assert response.status_code == 400
    assert response.json()["error_code"] == "INVALID_PARAMETER_VALUE"
    assert "at most 1000000 bytes" in response.json()["message"]
    assert stored(run) == before


def test_unknown_run_ids_are_resource_does_not_exist(
    job: tuple[Run, str], live_server: Any
) -> None:
    _, token = job
    for run_id in ("999999", "abc", "0"):
        response = call(live_server, "GET", "runs/get", {"run_id": run_id})
        assert response.status_code == 404
        assert response.json()["error_code"] == "RESOURCE_DOES_NOT_EXIST"
    response = call(live_server, "POST", "runs/log-batch", {"run_id": "999999"}, token)
    assert response.status_code == 404
    assert response.json()["error_code"] == "RESOURCE_DOES_NOT_EXIST"
    missing = call(
        live_server, "GET", "metrics/get-history", {"run_id": "424242", "metric_key": "x"}
    )
    assert missing.json()["error_code"] == "RESOURCE_DOES_NOT_EXIST"


def test_a_run_token_writes_its_own_run_only(
    recipe: Any, job: tuple[Run, str], live_server: Any
) -> None:
    run, token = job
    other = Run.objects.filter(plan=run.plan).exclude(pk=run.pk).first()
    assert other is not None
    before = stored(other)
    for path, body in (
        ("runs/log-batch", {"run_id": str(other.pk), "metrics": [metric()]}),
        ("runs/log-metric", {"run_id": str(other.pk), **metric()}),
        ("runs/log-parameter", {"run_id": str(other.pk), "key": "a", "value": "b"}),
        ("runs/set-tag", {"run_id": str(other.pk), "key": "a", "value": "b"}),
        ("runs/update", {"run_id": str(other.pk), "status": "FAILED"}),
    ):
        response = call(live_server, "POST", path, body, token)
        assert response.status_code == 403, (path, response.text)
        assert response.json()["error_code"] == "PERMISSION_DENIED"
    assert stored(other) == before
    other.refresh_from_db()
    assert other.state == RunState.QUEUED


def test_anonymous_and_bad_tokens_write_nothing(job: tuple[Run, str], live_server: Any) -> None:
    run, _ = job
    before = stored(run)
    body = {"run_id": str(run.pk), "metrics": [metric()]}
    anonymous = call(live_server, "POST", "runs/log-batch", body)
    assert anonymous.status_code == 401
    assert anonymous.json()["error_code"] == "UNAUTHENTICATED"
    forged = call(live_server, "POST", "runs/log-batch", body, f"r{run.pk}." + "0" * 64)
    assert forged.status_code == 401
    unknown = call(live_server, "POST", "runs/log-batch", body, "f" * 40)
    assert unknown.status_code == 401
    assert stored(run) == before


def test_a_contributor_token_may_not_write(
    job: tuple[Run, str], live_server: Any, contributor: Any
) -> None:
    run, _ = job
    token = Token.objects.create(user=contributor).key
    response = call(
        live_server, "POST", "runs/log-batch", {"run_id": str(run.pk), "metrics": [metric()]}, token
    )
    assert response.status_code == 403
    assert response.json()["error_code"] == "PERMISSION_DENIED"
    assert not MetricPoint.objects.filter(run=run).exists()


def test_a_param_rewritten_with_another_value_is_refused(job: tuple[Run, str]) -> None:
    import mlflow
    from mlflow.exceptions import MlflowException

    run, _ = job
    with mlflow.start_run():
        mlflow.log_param("lr", "0.1")
        mlflow.log_param("lr", "0.1")  # the same value again is fine
        with pytest.raises(MlflowException) as refused:
            mlflow.log_param("lr", "0.2")
        assert refused.value.error_code == "INVALID_PARAMETER_VALUE"
        assert "Changing param values is not allowed" in refused.value.message
    run.refresh_from_db()
    assert run.tracker_config == {"lr": "0.1"}


def test_a_rejected_batch_keeps_its_params_and_tags_out_too(
    job: tuple[Run, str], live_server: Any
) -> None:
    run, token = job
    call(
        live_server,
        "POST",
        "runs/log-parameter",
        {"run_id": str(run.pk), "key": "lr", "value": "1"},
        token,
    )
    before = stored(run)
    response = call(
        live_server,
        "POST",
        "runs/log-batch",
        {
            "run_id": str(run.pk),
            "metrics": [metric(step=3)],
            "params": [{"key": "width", "value": "64"}, {"key": "lr", "value": "2"}],
            "tags": [{"key": "t", "value": "v"}],
        },
        token,
    )
    assert response.status_code == 400
    assert stored(run) == before


def test_nan_metric_values_are_not_stored_and_the_timeline_says_so(
    job: tuple[Run, str], live_server: Any
) -> None:
    run, token = job
    body = {
        "run_id": str(run.pk),
        "metrics": [metric(value="NaN", step=5), metric(value=2.0, step=4)],
    }
    for _ in range(2):
        assert call(live_server, "POST", "runs/log-batch", body, token).status_code == 200
    assert list(MetricPoint.objects.filter(run=run).values_list("step", "value")) == [(4, 2.0)]
    notes = list(
        RunEvent.objects.filter(run=run, verb="not_finite").values_list("message", flat=True)
    )
    assert notes == ["train/loss was not finite at step 5: such values are not stored"]


def test_metrics_after_the_run_ended_are_refused(job: tuple[Run, str], live_server: Any) -> None:
    run, token = job
    assert (
        call(
            live_server, "POST", "runs/update", {"run_id": str(run.pk), "status": "FINISHED"}, token
        ).status_code
        == 200
    )
    response = call(
        live_server, "POST", "runs/log-batch", {"run_id": str(run.pk), "metrics": [metric()]}, token
    )
    assert response.status_code == 409
    assert "its token writes nothing more" in response.json()["message"]
    again = call(
        live_server, "POST", "runs/update", {"run_id": str(run.pk), "status": "RUNNING"}, token
    )
    assert again.status_code == 409
    assert not MetricPoint.objects.filter(run=run).exists()


def test_an_ended_or_expired_run_token_writes_nothing_through_mlflow(
    job: tuple[Run, str], live_server: Any, settings: Any
) -> None:
    """The runner doors' token rule (tokens.run_token_refusal) holds at the MLflow door too:
    409 once the run is terminal, whatever the write; 401 past its time limit and grace."""
    run, token = job
    writes = (
        ("runs/log-batch", {"run_id": str(run.pk), "metrics": [metric()]}),
        ("runs/log-metric", {"run_id": str(run.pk), **metric()}),
        ("runs/log-parameter", {"run_id": str(run.pk), "key": "lr", "value": "0.1"}),
        ("runs/set-tag", {"run_id": str(run.pk), "key": "a", "value": "b"}),
        ("runs/update", {"run_id": str(run.pk), "status": "FINISHED"}),
        ("runs/create", {"experiment_id": str(run.plan_id)}),
        ("experiments/create", {"name": "late"}),
    )
    settings.RUNS_TOKEN_GRACE_SECONDS = 60
    Run.objects.filter(pk=run.pk).update(
        started_at=timezone.now() - timedelta(seconds=run.time_limit_seconds + 61)
    )
    for path, body in writes:
        expired = call(live_server, "POST", path, body, token)
        assert expired.status_code == 401, (path, expired.text)
        assert expired.json()["error_code"] == "UNAUTHENTICATED"
    Run.objects.filter(pk=run.pk).update(started_at=timezone.now())
    run_writes.run_transition(run_id=run.pk, to_state=RunState.FINISHED, door="worker")
    before = stored(run)
    for path, body in writes:
        ended = call(live_server, "POST", path, body, token)
        assert ended.status_code == 409, (path, ended.text)
        assert ended.json()["error_code"] == "RESOURCE_CONFLICT"
        assert "has ended (finished)" in ended.json()["message"]
    assert stored(run) == before
    run.refresh_from_db()
    assert run.state == RunState.FINISHED and run.tracker_tags == {}
    # reads stay public
    assert call(live_server, "GET", "runs/get", {"run_id": str(run.pk)}).status_code == 200


def test_wrong_method_and_non_json_bodies_answer_in_mlflows_shape(
    job: tuple[Run, str], live_server: Any
) -> None:
    _, token = job
    wrong = requests.get(f"{live_server.url}/mlflow/api/2.0/mlflow/runs/log-batch", timeout=20)
    assert wrong.status_code == 405
    assert wrong.json()["error_code"] == "BAD_REQUEST"
    garbage = call(live_server, "POST", "runs/log-batch", b"{not json", token)
    assert garbage.status_code == 400
    assert garbage.json()["error_code"] == "BAD_REQUEST"


def test_metric_history_pages(job: tuple[Run, str], live_server: Any) -> None:
    run, token = job
    call(
        live_server,
        "POST",
        "runs/log-batch",
        {"run_id": str(run.pk), "metrics": [metric(value=float(s), step=s) for s in range(25)]},
        token,
    )
    steps: list[int] = []
    page_token = ""
    pages = 0
    while True:
        query = {"run_id": str(run.pk), "metric_key": "train/loss", "max_results": "10"}
        if page_token:
            query["page_token"] = page_token
        body = call(live_server, "GET", "metrics/get-history", query).json()
        steps += [m["step"] for m in body["metrics"]]
        pages += 1
        page_token = body.get("next_page_token", "")
        if not page_token:
            break
    assert steps == list(range(25))
    assert pages == 3


def test_a_launched_job_is_told_where_mlflow_reports(recipe: Any, settings: Any) -> None:
    settings.RUNS_MLFLOW_TRACKING_URI = "https://site.example/mlflow"
    run, token = running_run(recipe)
    env = dispatch.run_job_spec(run=run).env
    assert env["MLFLOW_TRACKING_URI"] == "https://site.example/mlflow"
    assert env["MLFLOW_TRACKING_TOKEN"] == token == env["RUN_TOKEN"]
    assert env["MLFLOW_EXPERIMENT_ID"] == str(run.plan_id)
