"""The runner's doors (metrics, heartbeat, status, tracker import) and metrics out."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import hypothesis
import psycopg
import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import resolve
from django.utils import timezone
from hypothesis import strategies as st
from rest_framework.test import APIClient

from marin_site.middleware import RUNNER_LANE, RUNNER_LANE_PATH
from runs import tokens
from runs.alerts import services as alerts
from runs.metrics import ingest as metric_writes
from runs.metrics import parse as metrics_parse
from runs.models import Alert, MetricPoint, MetricSummary, Run, RunState
from runs.runner_api import RunMetricsView
from runs.services import reconcile
from runs.services import runs as run_writes
from tests.concurrency import race
from tests.runs.runs_helpers import eager_tasks, launched_plan  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("eager_tasks")]


@pytest.fixture(autouse=True)
def _fresh_rate_windows() -> None:
    cache.clear()


def start(run: Run) -> tuple[Run, str]:
    """Mark a queued run running as dispatch would (without an executor) and give its token."""
    run = run_writes.run_transition(
        run_id=run.pk,
        to_state=RunState.RUNNING,
        door="worker",
        changes={"token_hash": tokens.token_hash(tokens.run_token(run=run))},
    )
    return run, tokens.run_token(run=run)


@pytest.fixture
def running(recipe: Any) -> tuple[Run, str]:
    run = Run.objects.filter(plan=launched_plan(recipe)).order_by("pk").first()
    assert run is not None
    return start(run)


def post(api: APIClient, run: Run, token: str, path: str, body: Any) -> Any:
    raw = body if isinstance(body, str) else json.dumps(body)
    return api.post(
        f"/api/v1/runs/{run.pk}/{path}",
        data=raw,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )


def batch(key: str, steps: range, value: float = 1.0) -> dict[str, Any]:
    return {"points": [{"key": key, "step": s, "value": value + s, "time": 1.8e9} for s in steps]}


def test_points_are_stored_with_summaries(api: APIClient, running: tuple[Run, str]) -> None:
    run, token = running
    response = post(api, run, token, "metrics/", batch("train/loss", range(10), value=-5.0))
    assert response.status_code == 200, response.content
    assert response.json() == {
        "stored": 10,
        "refused": [],
        "refused_keys": 0,
        "flagged": [],
        "alerts_opened": 0,
    }
    assert MetricPoint.objects.filter(run=run).count() == 10
    summary = MetricSummary.objects.get(run=run, key="train/loss")
    assert (summary.last, summary.min, summary.max, summary.step) == (4.0, -5.0, 4.0, 9)


def test_resent_batch_changes_nothing(api: APIClient, running: tuple[Run, str]) -> None:
    run, token = running
    body = batch("eval/loss", range(5))
    post(api, run, token, "metrics/", body)
    before = list(MetricPoint.objects.filter(run=run).values_list("key", "step", "value"))
    assert post(api, run, token, "metrics/", body).status_code == 200
    after = list(MetricPoint.objects.filter(run=run).values_list("key", "step", "value"))
    assert before == after
    summary = MetricSummary.objects.get(run=run, key="eval/loss")
    assert (summary.last, summary.min, summary.max) == (5.0, 1.0, 5.0)


def test_overlapping_batches_count_each_point_once(
    api: APIClient, running: tuple[Run, str]
) -> None:
    run, token = running
    assert post(api, run, token, "metrics/", batch("train/loss", range(10))).json()["stored"] == 10
    overlap = batch("train/loss", range(5, 15))  # 5..9 again, with the same values
    assert post(api, run, token, "metrics/", overlap).json()["stored"] == 10
    assert MetricPoint.objects.filter(run=run).count() == 15
    summary = MetricSummary.objects.get(run=run, key="train/loss")
    assert (summary.count, summary.last, summary.step, summary.min) == (15, 15.0, 14, 1.0)


def test_a_step_resent_with_a_new_value_is_replaced(
    api: APIClient, running: tuple[Run, str]
) -> None:
    run, token = running
    post(api, run, token, "metrics/", batch("eval/loss", range(3)))
    body = {"points": [{"key": "eval/loss", "step": 2, "value": 0.25}]}
    assert post(api, run, token, "metrics/", body).status_code == 200
    assert MetricPoint.objects.get(run=run, key="eval/loss", step=2).value == 0.25
    summary = MetricSummary.objects.get(run=run, key="eval/loss")
    assert (summary.count, summary.last, summary.min, summary.stale_from) == (3, 0.25, 0.25, 0)


def test_the_last_of_repeated_points_in_a_batch_wins(
    api: APIClient, running: tuple[Run, str]
) -> None:
    run, token = running
    points = [{"key": "a", "step": 1, "value": v} for v in (1.0, 2.0, 3.0)]
    assert post(api, run, token, "metrics/", {"points": points}).json()["stored"] == 1
    assert MetricPoint.objects.get(run=run).value == 3.0


def test_integer_values_and_times_are_taken(api: APIClient, running: tuple[Run, str]) -> None:
    run, token = running
    body = {"points": [{"key": "a", "step": 0, "value": 3, "time": 1_800_000_000}]}
    assert post(api, run, token, "metrics/", body).status_code == 200
    point = MetricPoint.objects.get(run=run)
    assert (point.value, point.time.timestamp()) == (3.0, 1_800_000_000)


def test_a_batch_mixing_given_and_missing_times_keeps_each(
    api: APIClient, running: tuple[Run, str]
) -> None:
    run, token = running
    before = timezone.now()
    points = [
        {"key": "a", "step": 0, "value": 1.5, "time": 1_800_000_000.25},
        {"key": "a", "step": 1, "value": 2.5},  # stamped on arrival
        {"key": "b/c", "step": 2**40, "value": -7},
    ]
    assert post(api, run, token, "metrics/", {"points": points}).status_code == 200
    stored = {(p.key, p.step): p for p in MetricPoint.objects.filter(run=run)}
    assert stored["a", 0].time.timestamp() == 1_800_000_000.25
    assert abs((stored["a", 1].time - before).total_seconds()) < 60  # the (test) transaction's now
    assert (stored["b/c", 2**40].value, stored["a", 1].value) == (-7.0, 2.5)


def test_points_out_of_order_are_stored_and_summarised(
    api: APIClient, running: tuple[Run, str]
) -> None:
    """Keys interleaved and steps backwards: every point is kept, and ``last`` is the value
    of the highest step, not of the last point sent."""
    run, token = running
    points = [
        {"key": key, "step": step, "value": float(10 * step + n)}
        for step in (5, 3, 9, 0)
        for n, key in enumerate(("b", "a"))
    ]
    assert post(api, run, token, "metrics/", {"points": points}).json()["stored"] == 8
    stored = {
        (k, s): v
        for k, s, v in MetricPoint.objects.filter(run=run).values_list("key", "step", "value")
    }
    assert stored == {(p["key"], p["step"]): p["value"] for p in points}
    a = MetricSummary.objects.get(run=run, key="a")
    assert (a.last, a.step, a.min, a.max, a.count, a.stale_from) == (91.0, 9, 1.0, 91.0, 4, 0)
    later = [{"key": "a", "step": 7, "value": -1.0}, {"key": "a", "step": 12, "value": 4.0}]
    assert post(api, run, token, "metrics/", {"points": later}).status_code == 200
    a.refresh_from_db()
    assert (a.last, a.step, a.min, a.count) == (4.0, 12, -1.0, 6)


@pytest.mark.django_db(transaction=True)
def test_two_ingests_of_the_same_points_at_once_store_and_count_each_once(
    running: tuple[Run, str],
) -> None:
    """The second batch meets the first one's uncommitted points (on PostgreSQL it waits on
    their primary key, then takes the upsert path): every (run, key, step) is stored once
    and the summary counts it once."""
    run, _token = running

    def ingest(steps: range) -> int:
        parsed = metrics_parse.points_parse(data=batch("train/loss", steps))
        return metric_writes.metrics_ingest(run=run, batch=parsed)

    assert race(lambda: ingest(range(10)), lambda: ingest(range(5, 15))) == (10, 10)

    assert MetricPoint.objects.filter(run=run, key="train/loss").count() == 15
    summary = MetricSummary.objects.get(run=run, key="train/loss")
    assert (summary.count, summary.min, summary.max) == (15, 1.0, 15.0)
    assert (summary.last, summary.step) == (15.0, 14)


def test_order_and_fold() -> None:
    batch = metrics_parse.PointBatch(
        ["b", "a", "b", "a", "a"],
        [2, 7, 1, 3, 5],
        [2.0, 7.0, 1.0, 3.0, -5.0],
        [None, 1.8e9, None, None, None],
    )
    ordered, folds = metric_writes.points_order_and_fold(batch)
    assert list(zip(ordered.keys, ordered.steps, ordered.values, ordered.times, strict=True)) == [
        ("a", 3, 3.0, None),
        ("a", 5, -5.0, None),
        ("a", 7, 7.0, 1.8e9),
        ("b", 1, 1.0, None),
        ("b", 2, 2.0, None),
    ]
    assert folds == [
        metric_writes.KeyFold(key="a", last=7.0, min=-5.0, max=7.0, step=7, count=3, first=3),
        metric_writes.KeyFold(key="b", last=2.0, min=1.0, max=2.0, step=2, count=2, first=1),
    ]


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(
    keys=st.lists(st.sampled_from("abcdefg"), min_size=1, max_size=5, unique=True),
    rounds=st.integers(1, 8),
    cut=st.integers(0, 4),
    shuffle=st.booleans(),
    seed=st.randoms(use_true_random=False),
)
def test_order_and_fold_of_a_cyclic_or_any_batch_is_the_batch_sorted_by_key_and_step(
    keys: list[str], rounds: int, cut: int, shuffle: bool, seed: Any
) -> None:
    """A batch that repeats a cycle of keys (ordered by slices) or any other (by index
    lists): the points sorted by (key, step), each key folded from its own."""
    pairs = [(key, step) for step in range(rounds) for key in keys][
        : max(1, rounds * len(keys) - cut)
    ]
    steps_of = {key: seed.sample(range(100), rounds) for key in keys}  # a key's steps may fall
    points = [(key, steps_of[key][step], seed.uniform(-5, 5), None) for key, step in pairs]
    if shuffle:
        seed.shuffle(points)
    batch = metrics_parse.PointBatch(*(list(column) for column in zip(*points, strict=True)))
    ordered, folds = metric_writes.points_order_and_fold(batch)
    expected = sorted(points, key=lambda p: (p[0], p[1]))
    assert (
        list(zip(ordered.keys, ordered.steps, ordered.values, ordered.times, strict=True))
        == expected
    )
    by_key: dict[str, list[tuple[int, float]]] = {}
    for key, step, value, _ in expected:
        by_key.setdefault(key, []).append((step, value))
    assert folds == [
        metric_writes.KeyFold(
            key=key,
            last=group[-1][1],
            min=min(v for _, v in group),
            max=max(v for _, v in group),
            step=group[-1][0],
            count=len(group),
            first=group[0][0],
        )
        for key, group in sorted(by_key.items())
    ]


def test_key_columns_cut_an_ordered_batch_by_its_folds() -> None:
    """The alerts read each key's points in step order from the ingest's ordering."""
    batch = metrics_parse.PointBatch(
        ["b", "a", "b", "a"], [2, 7, 1, 3], [2.0, 7.0, 1.0, 3.0], [None] * 4
    )
    ordered, folds = metric_writes.points_order_and_fold(batch)
    assert metric_writes.key_columns(ordered, folds) == {
        "a": ([3, 7], [3.0, 7.0]),
        "b": ([1, 2], [1.0, 2.0]),
    }
    assert metric_writes.key_columns(ordered, folds) == alerts._columns(None, batch)  # type: ignore[arg-type]


def test_portable_path_matches(running: tuple[Run, str]) -> None:
    """SQLite's path (the embedded default), run here on PostgreSQL: same results."""
    run, _ = running
    points = metrics_parse.PointBatch(
        ["a", "a", "b"], [0, 1, 0], [2.0, 1.0, 5.0], [None, 1.8e9, None]
    )
    assert metric_writes.ingest_portable(run_id=run.pk, batch=points) == 2
    assert metric_writes.ingest_portable(run_id=run.pk, batch=points) == 0  # a resent batch
    changed = metrics_parse.PointBatch(["a"], [0], [0.5], [None])
    assert metric_writes.ingest_portable(run_id=run.pk, batch=changed) == 1
    summary = MetricSummary.objects.get(run=run, key="a")
    assert (summary.count, summary.last, summary.step, summary.min, summary.max) == (
        2,
        1.0,
        1,
        0.5,
        2.0,
    )
    assert summary.stale_from == 0
    assert MetricPoint.objects.filter(run=run).count() == 3


def test_points_and_series_go_with_their_run(api: APIClient, running: tuple[Run, str]) -> None:
    """No foreign key in the database: Django's cascade deletes the points."""
    run, token = running
    post(api, run, token, "metrics/", batch("train/loss", range(3)))
    run.plan.delete()
    assert not MetricPoint.objects.filter(run_id=run.pk).exists()
    assert not MetricSummary.objects.filter(run_id=run.pk).exists()


def test_token_of_another_run_is_refused(api: APIClient, recipe: Any) -> None:
    one, other = (start(r) for r in Run.objects.filter(plan=launched_plan(recipe)))
    response = post(api, one[0], other[1], "metrics/", batch("train/loss", range(1)))
    assert response.status_code == 403
    assert MetricPoint.objects.count() == 0


def test_a_run_id_beyond_bigint_is_refused_not_an_error(
    api: APIClient, running: tuple[Run, str]
) -> None:
    _, token = running
    for path in ("metrics/", "heartbeat/"):
        response = api.post(
            f"/api/v1/runs/{2**64}/{path}",
            data=json.dumps(batch("a", range(1))),
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {token}",
        )
        assert response.status_code == 403, response.content


def _metrics_answer(api: APIClient, run: Run, token: str | None, body: str, **extra: Any) -> Any:
    if token is not None:
        extra["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    return api.post(
        f"/api/v1/runs/{run.pk}/metrics/{extra.pop('query', '')}",
        data=body,
        content_type="application/json",
        **extra,
    )


_RETRY_IN = re.compile(rb"retry in [0-9]+ s")


def _shape(response: Any) -> tuple[Any, ...]:
    """Status, body and headers; of Retry-After only whether it is there (seconds to a
    minute's end, which the two answers may straddle; so too the body's "retry in N s")."""
    headers: tuple[str, ...] = ("Content-Type", "Allow", "Vary", "WWW-Authenticate")
    headers += ("X-Frame-Options", "X-Content-Type-Options", "Referrer-Policy")
    return (
        response.status_code,
        json.loads(_RETRY_IN.sub(b"retry in N s", response.content)),
        *(response.headers.get(h) for h in headers),
        "Retry-After" in response.headers,
    )


@pytest.mark.parametrize("accept", [None, "*/*", "application/json"])
def test_the_metrics_door_s_short_cycle_answers_as_drf_s_whole_cycle(
    api: APIClient, recipe: Any, accept: str | None, settings: Any
) -> None:
    """A POST accepting JSON skips DRF's request wrapper (runner_api.RunMetricsView.dispatch);
    ``?format=json`` takes DRF's whole cycle: each outcome is answered alike by both."""
    runs = Run.objects.filter(plan=launched_plan(recipe))
    (one, token), (other, other_token) = (start(r) for r in runs)
    extra = {} if accept is None else {"HTTP_ACCEPT": accept}
    good = json.dumps(batch("train/loss", range(3)))
    cases = [
        (one, token, good),  # 200, stored
        (one, token, '{"points": [{"key": "a", "step": 1, "value": "1"}]}'),  # 400, refused
        (one, token, "not json"),  # 400, whole body refused
        (one, other_token, good),  # 403, another run's token
        (one, None, good),  # 401, no token
    ]
    for run, tok, body in cases:
        short = _metrics_answer(api, run, tok, body, **extra)
        whole = _metrics_answer(api, run, tok, body, query="?format=json", **extra)
        assert _shape(short) == _shape(whole), (short.content, whole.content)
    run_writes.run_transition(run_id=other.pk, to_state=RunState.FINISHED, door="runner")
    ended = [
        _metrics_answer(api, other, other_token, good, query=query, **extra)
        for query in ("", "?format=json")
    ]
    assert ended[0].status_code == 409, ended[0].content
    assert _shape(ended[0]) == _shape(ended[1])
    settings.RUNS_METRICS_RATE_PER_MINUTE = 1
    cache.clear()
    limited = [_metrics_answer(api, one, token, good, **extra) for _ in range(2)]
    cache.clear()
    limited_whole = [
        _metrics_answer(api, one, token, good, query="?format=json", **extra) for _ in range(2)
    ]
    assert limited[1].status_code == 429
    assert [_shape(r) for r in limited] == [_shape(r) for r in limited_whole]


def _whole(response: Any) -> tuple[Any, ...]:
    """Status, body and every header but Retry-After's seconds (only whether it is there,
    and the body's "retry in N s" without N: two answers may straddle a second)."""
    headers = sorted((k, v) for k, v in response.headers.items() if k != "Retry-After")
    body = _RETRY_IN.sub(b"retry in N s", response.content)
    return response.status_code, body, headers, "Retry-After" in response.headers


@pytest.mark.parametrize("accept", [None, "application/json"])
def test_the_runner_lane_answers_as_the_whole_middleware_chain(
    recipe: Any, accept: str | None, settings: Any
) -> None:
    """The metrics door's POSTs skip the middleware that does nothing for them
    (marin_site.middleware.RunnerLaneMiddleware): every outcome has the same status, body
    and headers (security, CSP, frame, length) as through the whole chain."""
    runs = Run.objects.filter(plan=launched_plan(recipe))
    (one, token), (other, other_token) = (start(r) for r in runs)
    extra = {} if accept is None else {"HTTP_ACCEPT": accept}
    lane, whole_chain = APIClient(), APIClient()
    without_lane = [m for m in settings.MIDDLEWARE if m != RUNNER_LANE]
    assert without_lane != settings.MIDDLEWARE
    cases = [
        (one, token, json.dumps(batch("train/loss", range(3)))),  # 200, stored
        (one, token, json.dumps(batch("train/loss", range(3)))),  # 200, stored before
        (one, token, '{"points": [{"key": "a", "step": 1, "value": "1"}]}'),  # 400, refused
        (one, token, "not json"),  # 400, whole body refused
        (one, other_token, "{}"),  # 403, another run's token
        (one, None, "{}"),  # 401, no token
        (other, other_token, json.dumps(batch("train/loss", range(3, 6)))),  # 409, ended
    ]
    answers: dict[str, list[Any]] = {"lane": [], "whole": []}
    rate = settings.RUNS_METRICS_RATE_PER_MINUTE
    for name, client in (("lane", lane), ("whole", whole_chain)):
        settings.MIDDLEWARE = settings.MIDDLEWARE if name == "lane" else without_lane
        for at, (run, tok, body) in enumerate(cases):
            if at == len(cases) - 1:
                Run.objects.filter(pk=other.pk).update(state=RunState.FINISHED)
            response = _metrics_answer(client, run, tok, body, **extra)
            assert hasattr(response.wsgi_request, "runner_lane_kwargs") is (name == "lane")
            answers[name].append(_whole(response))
        Run.objects.filter(pk=other.pk).update(state=RunState.RUNNING)
        MetricPoint.objects.all().delete()
        MetricSummary.objects.all().delete()
        settings.RUNS_METRICS_RATE_PER_MINUTE = 1
        cache.clear()
        limited = [_metrics_answer(client, one, token, "{}", **extra) for _ in range(2)]
        answers[name] += [_whole(r) for r in limited]
        settings.RUNS_METRICS_RATE_PER_MINUTE = rate
        cache.clear()
    statuses = [answer[0] for answer in answers["lane"]]
    assert statuses == [200, 200, 400, 400, 403, 401, 409, 400, 429]
    assert answers["lane"] == answers["whole"]
    headers = dict(answers["lane"][0][2])
    for name in ("Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options"):
        assert name in headers
    assert "Content-Length" in headers


def test_the_runner_lane_takes_the_metrics_door_s_route_and_no_other() -> None:
    """The lane's path is the door's route: the same view and ``pk`` as the URLconf's."""
    for pk in ("1", "42", "9" * 30):
        match = resolve(f"/api/v1/runs/{pk}/metrics/")
        lane = RUNNER_LANE_PATH.match(f"/api/v1/runs/{pk}/metrics/")
        assert match.func.view_class is RunMetricsView  # type: ignore[attr-defined]
        assert lane is not None and {"pk": int(lane["pk"])} == match.kwargs
    for path in (
        "/api/v1/runs/1/metrics",
        "/api/v1/runs/1/metrics/x",
        "/api/v1/runs/-1/metrics/",
        "/api/v1/runs/١/metrics/",
        "/api/v1/runs/1/heartbeat/",
        "/runs/1/metrics/",
    ):
        assert RUNNER_LANE_PATH.match(path) is None


def _elsewhere(sql: str, params: list[Any]) -> None:
    """A change of the run's row by another process: its own connection, committed."""
    settings_dict = connection.settings_dict
    with psycopg.connect(
        dbname=settings_dict["NAME"],
        user=settings_dict["USER"],
        password=settings_dict["PASSWORD"] or None,
        host=settings_dict["HOST"] or None,
        port=settings_dict["PORT"] or None,
        autocommit=True,
    ) as other:
        other.execute(sql, params)


def _run_row_read(queries: CaptureQueriesContext) -> bool:
    """Whether the door read the run's row (the full check's query)."""
    return any(q["sql"].startswith("SELECT id, state") for q in queries.captured_queries)


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="admissions are PostgreSQL's")
def test_a_kept_admission_skips_the_run_s_row_and_an_ended_run_is_refused_at_once(
    api: APIClient, recipe: Any
) -> None:
    """After one full check the door stores a run's batches without reading its row; a run
    ended by another process refuses the very next batch, which stores nothing."""
    run, token = start(Run.objects.filter(plan=launched_plan(recipe)).order_by("pk")[0])
    assert post(api, run, token, "metrics/", batch("train/loss", range(5))).status_code == 200
    with CaptureQueriesContext(connection) as queries:
        response = post(api, run, token, "metrics/", batch("train/loss", range(5, 10)))
    assert response.status_code == 200 and response.json()["stored"] == 5
    assert not _run_row_read(queries)
    _elsewhere("UPDATE runs_run SET state = 'finished' WHERE id = %s", [run.pk])
    with CaptureQueriesContext(connection) as queries:
        ended = post(api, run, token, "metrics/", batch("train/loss", range(10, 15)))
    assert ended.status_code == 409, ended.content
    assert "has ended (finished)" in ended.json()["detail"]
    assert _run_row_read(queries)
    assert MetricPoint.objects.filter(run=run).count() == 10
    assert MetricSummary.objects.get(run=run, key="train/loss").count == 10


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="admissions are PostgreSQL's")
@pytest.mark.parametrize(
    "body",
    [
        '{"points": [{"key": "a b", "step": 1, "value": 1}]}',  # nothing storable: 400
        '{"points": [{"key": "a", "step": 1, "value": NaN}]}',  # a NaN alert to open
        "not json",  # refused whole: 400
        "over the rate",  # 429
    ],
)
def test_on_a_kept_admission_a_run_ended_elsewhere_is_refused_before_anything_else(
    api: APIClient, recipe: Any, body: str, settings: Any
) -> None:
    """A batch with nothing to store, one with a NaN, one that is no batch, one over the
    rate: for a run that ended in another process, 409 as without an admission."""
    run, token = start(Run.objects.filter(plan=launched_plan(recipe)).order_by("pk")[0])
    if body == "over the rate":
        settings.RUNS_METRICS_RATE_PER_MINUTE = 1
        body = json.dumps(batch("train/loss", range(5, 10)))
    assert post(api, run, token, "metrics/", batch("train/loss", range(5))).status_code == 200
    _elsewhere("UPDATE runs_run SET state = 'finished' WHERE id = %s", [run.pk])
    ended = post(api, run, token, "metrics/", body)
    assert ended.status_code == 409, ended.content
    assert Alert.objects.filter(run=run).count() == 0
    assert MetricPoint.objects.filter(run=run).count() == 5


def _counted(run: Run) -> int:
    """The run's metric batches counted toward its rate limit, in this minute and the last
    (a minute may turn during the test)."""
    window = int(timezone.now().timestamp() // 60)
    return sum(
        cache.get(metric_writes.metrics_rate_key(run_id=run.pk, window=w)) or 0
        for w in (window - 1, window)
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="admissions are PostgreSQL's")
@pytest.mark.parametrize("body", ["points", "nothing storable", "a NaN", "not json", "over"])
def test_a_batch_refused_by_the_row_after_a_kept_admission_uses_none_of_the_rate(
    api: APIClient, recipe: Any, body: str, settings: Any
) -> None:
    """The door counts a batch toward the run's minute before the storing statement finds
    the row changed; a batch the row then refuses is taken back off the count, as a batch
    refused by the full check is never counted."""
    cache.clear()
    settings.RUNS_METRICS_RATE_PER_MINUTE = 2 if body == "over" else 10
    run, token = start(Run.objects.filter(plan=launched_plan(recipe)).order_by("pk")[0])
    for steps in (range(5), range(5, 10)):
        assert post(api, run, token, "metrics/", batch("train/loss", steps)).status_code == 200
    assert _counted(run) == 2
    run.attempt += 1
    _elsewhere(
        "UPDATE runs_run SET attempt = %s, token_hash = %s WHERE id = %s",
        [run.attempt, tokens.token_hash(tokens.run_token(run=run)), run.pk],
    )
    sent = {
        "points": batch("train/loss", range(10, 15)),
        "nothing storable": '{"points": [{"key": "a b", "step": 1, "value": 1}]}',
        "a NaN": '{"points": [{"key": "a", "step": 1, "value": NaN}]}',
        "not json": "not json",
        "over": batch("train/loss", range(10, 15)),
    }[body]
    stale = post(api, run, token, "metrics/", sent)
    assert stale.status_code == 409, stale.content
    assert _counted(run) == 2
    assert MetricPoint.objects.filter(run=run).count() == 10


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="admissions are PostgreSQL's")
def test_a_kept_admission_refuses_a_token_rotated_or_restarted_by_another_process(
    api: APIClient, recipe: Any
) -> None:
    """A new attempt (a new token) or a new start, written by another process: the old
    token's next batch is refused as the full check refuses it, nothing stored and no sign
    of life written for it; the new token is taken."""
    run, token = start(Run.objects.filter(plan=launched_plan(recipe)).order_by("pk")[0])
    assert post(api, run, token, "metrics/", batch("train/loss", range(5))).status_code == 200
    assert post(api, run, token, "metrics/", batch("train/loss", range(5, 10))).status_code == 200
    run.attempt += 1
    new_token = tokens.run_token(run=run)
    quiet_since = timezone.now() - timedelta(hours=1)
    _elsewhere(
        "UPDATE runs_run SET attempt = %s, token_hash = %s, heartbeat_at = %s WHERE id = %s",
        [run.attempt, tokens.token_hash(new_token), quiet_since, run.pk],
    )
    stale = post(api, run, token, "metrics/", batch("train/loss", range(10, 15)))
    assert stale.status_code == 409, stale.content
    assert f"is of attempt {run.attempt - 1}" in stale.json()["detail"]
    run.refresh_from_db()
    assert run.heartbeat_at == quiet_since
    assert MetricPoint.objects.filter(run=run).count() == 10
    taken = post(api, run, new_token, "metrics/", batch("train/loss", range(10, 15)))
    assert taken.status_code == 200 and taken.json()["stored"] == 5
    assert post(api, run, new_token, "metrics/", batch("eval/loss", range(3))).status_code == 200
    _elsewhere(
        "UPDATE runs_run SET started_at = now() - interval '30 days' WHERE id = %s", [run.pk]
    )
    expired = post(api, run, new_token, "metrics/", batch("train/loss", range(15, 20)))
    assert expired.status_code == 401, expired.content
    assert "expired" in expired.json()["detail"]
    assert MetricPoint.objects.filter(run=run).count() == 18


def test_missing_token_is_refused(api: APIClient, running: tuple[Run, str]) -> None:
    run, _ = running
    response = api.post(f"/api/v1/runs/{run.pk}/metrics/", batch("a", range(1)), format="json")
    assert response.status_code == 401


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ('{"points": [{"key": "train/loss", "step": 1, "value": NaN}]}', "not finite (nan)"),
        ('{"points": [{"key": "train/loss", "step": 1, "value": -Infinity}]}', "(-inf)"),
        ({"points": [{"key": "train/loss", "step": -1, "value": 1}]}, "step must be"),
        ({"points": [{"key": "", "step": 1, "value": 1}]}, "key must be"),
        ({"points": [{"key": "a", "step": 1, "value": "1"}]}, "value must be a number"),
        ({"points": [{"key": "a", "step": 1, "value": True}]}, "value must be a number"),
        ({"points": [{"key": "a", "step": 1.0, "value": 1}]}, "step must be"),
        ({"points": [{"key": "a", "step": 1, "value": 1, "time": 5}]}, "time must be"),
        ('{"points": [{"key": "a", "step": 1, "value": 1e999}]}', "(inf)"),
        ({"points": [5]}, "points[0]: must be an object"),
        ({"points": [{"key": "a\n", "step": 1, "value": 1}]}, "key must be"),
        ({"points": [{"key": "a b", "step": 1, "value": 1}]}, "(no spaces)"),
        ({"points": [{"key": "k" * 10_000, "step": 1, "value": 1}]}, "1-200 characters"),
        ({"points": [{"key": "a", "step": 1, "value": 2**63}]}, "beyond 64 bits"),
        ({"points": [{"key": "a", "step": 2**62, "value": 1}]}, "step must be"),
    ],
)
def test_a_batch_with_nothing_storable_is_400_naming_each_key(
    api: APIClient, running: tuple[Run, str], body: Any, fragment: str
) -> None:
    run, token = running
    response = post(api, run, token, "metrics/", body)
    assert response.status_code == 400
    answer = response.json()
    assert answer["stored"] == 0 and len(answer["refused"]) == 1
    assert fragment in answer["refused"][0]["reason"]
    assert len(json.dumps(answer)) < 2_000  # a 10 KB key is cut in the answer
    assert MetricPoint.objects.count() == 0


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"values": []}, "points"),
        ({"points": {"key": "a"}}, "points"),
        ([1, 2], "points"),
        ("{not json", "JSON"),
    ],
)
def test_a_body_that_is_no_batch_is_refused_whole(
    api: APIClient, running: tuple[Run, str], body: Any, fragment: str
) -> None:
    run, token = running
    response = post(api, run, token, "metrics/", body)
    assert response.status_code == 400
    assert fragment in response.content.decode()
    assert MetricPoint.objects.count() == 0


def test_bad_keys_are_refused_alone_and_every_good_point_is_stored(
    api: APIClient, running: tuple[Run, str]
) -> None:
    """Per key, never the whole batch: NaN, infinities, strings, booleans, a key with a space
    or of 10 KB, a negative step each refuse their own points, with their reason and first
    step; everything else of the batch is stored, a step lower than one stored included."""
    run, token = running
    assert post(api, run, token, "metrics/", batch("train/loss", range(5, 8))).status_code == 200
    raw = json.dumps(
        {
            "points": [
                {"key": "train/loss", "step": 2, "value": 2.5},  # backwards: a resumed run
                {"key": "train/loss", "step": 8, "value": 2.25},
                {"key": "grad/norm", "step": 9, "value": "__NAN__"},
                {"key": "grad/norm", "step": 4, "value": "__NAN__"},
                {"key": "grad/norm", "step": 5, "value": 0.5},
                {"key": "lr", "step": 3, "value": "3e-4"},
                {"key": "flag", "step": 3, "value": False},
                {"key": "has space", "step": 3, "value": 1.0},
                {"key": "x" * 10_240, "step": 3, "value": 1.0},
                {"key": "eval/loss", "step": -2, "value": 1.0},
                {"key": "eval/loss", "step": 3, "value": 3.0},
                {"key": "inf", "step": 3, "value": "__INF__"},
            ]
        }
    )
    raw = raw.replace('"__NAN__"', "NaN").replace('"__INF__"', "Infinity")
    response = post(api, run, token, "metrics/", raw)
    assert response.status_code == 200, response.content
    answer = response.json()
    assert answer["stored"] == 4
    reasons = {r["key"][:20]: (r["reason"], r["step"], r["points"]) for r in answer["refused"]}
    assert reasons["grad/norm"][1:] == (4, 2)
    assert "not finite" in reasons["grad/norm"][0]
    assert "value must be a number" in reasons["lr"][0]
    assert "value must be a number" in reasons["flag"][0]
    assert "no spaces" in reasons["has space"][0]
    assert "1-200 characters" in reasons["x" * 20][0]
    assert "step must be" in reasons["eval/loss"][0] and reasons["eval/loss"][1] is None
    assert "(inf)" in reasons["inf"][0]
    assert answer["refused_keys"] == 7
    rows = MetricPoint.objects.values_list("key", "step", "value")
    kept = {(k, s): v for k, s, v in rows}
    assert kept[("train/loss", 2)] == 2.5 and kept[("train/loss", 8)] == 2.25
    assert kept[("grad/norm", 5)] == 0.5 and kept[("eval/loss", 3)] == 3.0
    assert len(kept) == 7  # three from the first batch, four from this one


def test_values_a_fast_check_cannot_vouch_for_are_judged_point_by_point(
    api: APIClient, running: tuple[Run, str]
) -> None:
    """Large finite values whose sum overflows, and integers just inside int64, are taken."""
    run, token = running
    points = [
        {"key": "a", "step": 0, "value": 1.5e308},
        {"key": "a", "step": 1, "value": 1.5e308},
        {"key": "b", "step": 0, "value": 2**63 - 1},
        {"key": "b", "step": 1, "value": -(2**63)},
        {"key": "c", "step": 0, "value": 1e30},
    ]
    assert post(api, run, token, "metrics/", {"points": points}).status_code == 200
    stored = {
        (key, step): value
        for key, step, value in MetricPoint.objects.filter(run=run).values_list(
            "key", "step", "value"
        )
    }
    assert stored == {
        ("a", 0): 1.5e308,
        ("a", 1): 1.5e308,
        ("b", 0): float(2**63 - 1),
        ("b", 1): float(-(2**63)),
        ("c", 0): 1e30,
    }


def test_batch_over_the_point_cap_is_413(api: APIClient, running: tuple[Run, str]) -> None:
    run, token = running
    response = post(api, run, token, "metrics/", batch("train/loss", range(1001)))
    assert response.status_code == 413


def test_body_over_one_megabyte_is_413(api: APIClient, running: tuple[Run, str]) -> None:
    run, token = running
    body = {"points": [{"key": "k" * 150, "step": s, "value": 1.0} for s in range(1000)]}
    body["pad"] = "x" * 1_000_000  # type: ignore[assignment]
    assert post(api, run, token, "metrics/", body).status_code == 413


def test_rate_over_the_per_run_limit_is_429_with_retry_after(
    api: APIClient, running: tuple[Run, str], settings: Any
) -> None:
    settings.RUNS_METRICS_RATE_PER_MINUTE = 2
    run, token = running
    codes = [post(api, run, token, "metrics/", batch("a", range(1))).status_code for _ in range(3)]
    assert codes == [200, 200, 429]
    response = post(api, run, token, "metrics/", batch("a", range(1)))
    assert 1 <= int(response["Retry-After"]) <= 60


def test_metrics_for_a_finished_run_are_refused(api: APIClient, running: tuple[Run, str]) -> None:
    run, token = running
    run_writes.run_transition(run_id=run.pk, to_state=RunState.FINISHED, door="worker")
    assert post(api, run, token, "metrics/", batch("a", range(1))).status_code == 409


def test_heartbeat_records_and_reports_cancel(
    api: APIClient, running: tuple[Run, str], maintainer: Any
) -> None:
    run, token = running
    Run.objects.filter(pk=run.pk).update(heartbeat_at=None)
    response = post(api, run, token, "heartbeat/", {})
    assert response.json() == {"state": "running", "cancel_requested": False}
    run.refresh_from_db()
    assert run.heartbeat_at is not None
    run_writes.run_cancel(run_id=run.pk, actor=maintainer)
    assert post(api, run, token, "heartbeat/", {}).json()["cancel_requested"] is True


def test_metrics_are_a_sign_of_life_a_refused_batch_is_not(
    api: APIClient, running: tuple[Run, str], django_capture_on_commit_callbacks: Any
) -> None:
    """A job that reports metrics and sends no heartbeat is alive: the reconciler's silence
    rule leaves it running and the silence check opens no alert."""
    run, token = running
    long_ago = timezone.now() - timedelta(hours=1)
    Run.objects.filter(pk=run.pk).update(heartbeat_at=long_ago)
    refused = {"points": [{"key": "train/loss", "step": 1, "value": "nan"}]}
    assert post(api, run, token, "metrics/", refused).status_code == 400  # nothing usable
    assert Run.objects.get(pk=run.pk).heartbeat_at == long_ago  # nothing stored
    assert post(api, run, token, "metrics/", batch("train/loss", range(3))).status_code == 200
    run.refresh_from_db()
    assert run.heartbeat_at is not None and run.heartbeat_at > long_ago
    with CaptureQueriesContext(connection) as again:  # a second right after: no write
        assert (
            post(api, run, token, "metrics/", batch("train/loss", range(3, 6))).status_code == 200
        )
    assert not [q for q in again.captured_queries if 'SET "heartbeat_at"' in q["sql"]]
    with django_capture_on_commit_callbacks(execute=True):
        assert reconcile._crash_if_stale(run, executor_cancel=None).state == RunState.RUNNING
    assert alerts.alerts_silence_check()["opened"] == 0
    Run.objects.filter(pk=run.pk).update(heartbeat_at=long_ago)  # silent since: now it is
    run.refresh_from_db()
    with django_capture_on_commit_callbacks(execute=True):
        crashed = reconcile._crash_if_stale(run, executor_cancel=None)
    assert crashed.state == RunState.CRASHED and "no heartbeat" in crashed.state_reason


def test_runner_may_finish_or_fail_but_not_kill(api: APIClient, recipe: Any) -> None:
    (one, one_token), (two, two_token) = (
        start(r) for r in Run.objects.filter(plan=launched_plan(recipe))
    )
    assert post(api, one, one_token, "status/", {"state": "killed"}).status_code == 400
    assert post(api, one, one_token, "status/", {"state": "finished"}).json() == {
        "state": "finished"
    }
    failed = post(api, two, two_token, "status/", {"state": "failed", "failure_kind": "oom"})
    assert failed.json() == {"state": "failed"}
    two.refresh_from_db()
    assert (two.failure_kind, two.events.last().door) == ("oom", "runner")  # type: ignore[union-attr]
    assert post(api, two, two_token, "status/", {"state": "finished"}).status_code == 409


def test_series_keeps_spikes_when_downsampled(api: APIClient, running: tuple[Run, str]) -> None:
    run, token = running
    for start_step in range(0, 5000, 1000):
        points = [
            {"key": "train/loss", "step": s, "value": 100.0 if s == 3217 else 1.0 / (s + 1)}
            for s in range(start_step, start_step + 1000)
        ]
        assert post(api, run, token, "metrics/", {"points": points}).status_code == 200
    cache.clear()
    response = api.get(f"/api/v1/runs/{run.pk}/series/", {"key": "train/loss", "points": "100"})
    data = response.json()
    assert data["total"] == 5000
    assert data["downsampled"] is True
    assert len(data["points"]) <= 100
    assert [3217, 100.0] in data["points"]
    steps = [p[0] for p in data["points"]]
    assert steps == sorted(steps)
    full = api.get(f"/api/v1/runs/{run.pk}/series/", {"key": "train/loss", "points": "10000"})
    assert full.json()["downsampled"] is False
    assert len(full.json()["points"]) == 5000


def test_csv_export_has_every_point(api: APIClient, running: tuple[Run, str]) -> None:
    run, token = running
    post(api, run, token, "metrics/", batch("train/loss", range(3)))
    response = api.get(f"/api/v1/runs/{run.pk}/metrics.csv/", {"key": "train/loss"})
    lines = b"".join(response.streaming_content).decode().splitlines()  # type: ignore[attr-defined]
    assert lines[0] == "key,step,value,time"
    assert [line.split(",")[:3] for line in lines[1:]] == [
        ["train/loss", "0", "1.0"],
        ["train/loss", "1", "2.0"],
        ["train/loss", "2", "3.0"],
    ]


TRACKER = '{"config": {"width": 32}, "summary": {"eval/loss": 2.5, "note": "x"}}\n'


def test_tracker_metrics_import_by_run_token(api: APIClient, running: tuple[Run, str]) -> None:
    run, token = running
    response = post(api, run, token, "tracker-metrics/", {"jsonl": TRACKER})
    assert response.json() == {"final_metrics": {"eval/loss": 2.5}}
    run.refresh_from_db()
    assert run.tracker_config == {"width": 32}


def test_tracker_metrics_import_by_maintainer_only(
    api_as: Any, running: tuple[Run, str], maintainer: Any, contributor: Any
) -> None:
    run, _ = running
    url = f"/api/v1/runs/{run.pk}/tracker-metrics/"
    assert api_as(contributor).post(url, {"jsonl": TRACKER}, format="json").status_code == 403
    assert api_as(maintainer).post(url, {"jsonl": TRACKER}, format="json").status_code == 200


def test_run_list_and_detail_are_public(
    api: APIClient, running: tuple[Run, str], django_assert_num_queries: Any
) -> None:
    run, token = running
    post(api, run, token, "metrics/", batch("train/loss", range(3)))
    with django_assert_num_queries(2):
        listing = api.get("/api/v1/runs/")
    assert listing.status_code == 200
    assert listing.json()["count"] == 2
    with django_assert_num_queries(4):  # the run, its summaries, events and artifacts
        detail = api.get(f"/api/v1/runs/{run.pk}/")
    body = detail.json()
    assert body["state"] == "running"
    assert body["summaries"][0]["key"] == "train/loss"
    assert [e["verb"] for e in body["events"]] == ["queued", "running"]
    assert "token" not in json.dumps(body).lower() or body["secret_env_names"] == []


# A run's token ends: no write once the run is terminal, none at all past its lifetime.


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("tracker-metrics/", {"jsonl": '{"summary": {"eval/loss": 0.1}, "config": {}}\n'}),
        ("metrics/", batch("eval/loss", range(1))),
        ("heartbeat/", {}),
        ("status/", {"state": "finished"}),
    ],
)
def test_a_finished_run_s_token_writes_nothing_more(
    api: APIClient, running: tuple[Run, str], path: str, body: Any
) -> None:
    run, token = running
    assert (
        post(api, run, token, "metrics/", batch("eval/loss", range(3), value=2.0)).status_code
        == 200
    )
    assert post(api, run, token, "status/", {"state": "finished"}).status_code == 200
    before = Run.objects.get(pk=run.pk)
    points = MetricPoint.objects.filter(run=run).count()
    response = post(api, run, token, path, body)
    assert response.status_code == 409, response.content
    assert "ended" in response.json()["detail"]
    after = Run.objects.get(pk=run.pk)
    assert (after.state, after.final_metrics) == (before.state, before.final_metrics)
    assert MetricPoint.objects.filter(run=run).count() == points


def test_a_run_token_expires_after_the_time_limit_and_grace(
    api: APIClient, running: tuple[Run, str], settings: Any
) -> None:
    run, token = running
    settings.RUNS_TOKEN_GRACE_SECONDS = 60
    assert post(api, run, token, "heartbeat/", {}).status_code == 200
    Run.objects.filter(pk=run.pk).update(
        started_at=timezone.now() - timedelta(seconds=run.time_limit_seconds + 61)
    )
    response = post(api, run, token, "metrics/", batch("train/loss", range(2)))
    assert response.status_code == 401
    assert "expired" in response.json()["detail"]
    assert not MetricPoint.objects.filter(run=run).exists()


@pytest.mark.parametrize(
    "raw",
    [
        '{"points": [{"key": ["a"], "step": 1, "value": 1.0}]}',
        '{"points": [{"key": {"a": 1}, "step": 1, "value": 1.0}]}',
        '{"points": [{"key": "a\\u0000b", "step": 1, "value": 1.0}]}',
        '{"points": [{"key": "\\ud800", "step": 1, "value": 1.0}]}',
        '{"points": [{"key": "a", "step": 99999999999999999999999, "value": 1.0}]}',
        '{"points": [{"key": "a", "step": "1", "value": 1.0}]}',
        '{"points": [{"key": "a", "step": 1, "value": "x"}]}',
        '{"points": ' + "[" * 300 + "]" * 300 + "}",
        '{"points": {"key": "a"}}',
    ],
)
def test_hostile_metric_batches_are_refused_and_store_nothing(
    api: APIClient, running: tuple[Run, str], raw: str
) -> None:
    run, token = running
    response = post(api, run, token, "metrics/", raw)
    assert 400 <= response.status_code < 500, (response.status_code, response.content[:200])
    assert not MetricPoint.objects.filter(run=run).exists()
