"""The downsampled series rollup (runs/series/) and the chart series endpoints."""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence
from typing import Any

import pytest
from django.core.cache import cache
from rest_framework.test import APIClient

from runs.metrics import ingest
from runs.metrics import parse as metrics_parse
from runs.models import MetricSeries, MetricSummary, Plan, Run, RunState
from runs.series import buckets as series_buckets
from runs.series import rollup
from runs.services import runs as run_writes
from tests.runs.runs_helpers import eager_tasks, launched_plan  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("eager_tasks")]

GRID_SPEC = """axes:
  capacity_factor: [2.0, 3.0]
seeds: [0, 1]
"""


def start(run: Run) -> Run:
    return run_writes.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door="worker")


def running_runs(plan: Plan) -> list[Run]:
    return [start(run) for run in Run.objects.filter(plan=plan).order_by("entry__index")]


def write(run: Run, key: str, steps: Sequence[int], values: Sequence[float]) -> None:
    """Through the service, 1000 points a batch, as the API would."""
    for at in range(0, len(steps), 1000):
        batch = metrics_parse.PointBatch(
            [key] * len(steps[at : at + 1000]),
            list(steps[at : at + 1000]),
            [float(v) for v in values[at : at + 1000]],
            [None] * len(steps[at : at + 1000]),
        )
        ingest.metrics_ingest(run=run, batch=batch)


def plan_series(api: APIClient, plan: Plan, **params: Any) -> dict[str, Any]:
    response = api.get(f"/api/v1/plans/{plan.pk}/series/", params)
    assert response.status_code == 200, response.content
    return response.json()


def assert_exact(entry: dict[str, Any], raw: dict[int, float]) -> None:
    """Each bucket (the steps after the previous bucket's last step, up to its own) has the
    true min, max and mean of the raw points in it, and the buckets cover every point."""
    steps = sorted(raw)
    previous = -1
    for last, value, low, high in zip(
        entry["step"], entry["value"], entry["min"], entry["max"], strict=True
    ):
        inside = [
            raw[s]
            for s in steps[bisect.bisect_right(steps, previous) : bisect.bisect_right(steps, last)]
        ]
        assert inside, (previous, last)
        assert (low, high) == (min(inside), max(inside))
        assert value == pytest.approx(sum(inside) / len(inside))
        previous = last
    assert previous == steps[-1]


@pytest.fixture
def plan(recipe: Any) -> Plan:
    return launched_plan(recipe)


def test_band_is_the_true_min_and_max_of_each_bucket_with_a_ragged_last(
    api: APIClient, plan: Plan
) -> None:
    run = running_runs(plan)[0]
    rng = random.Random(5)  # noqa: S311  (test data)
    raw = {step: rng.uniform(-1, 1) for step in range(10_007)}
    raw[7777] = 50.0  # a spike survives
    chunks = [list(range(at, min(at + 1000, 10_007))) for at in range(0, 10_007, 1000)]
    rng.shuffle(chunks)  # batches arrive out of order
    for chunk in chunks:
        write(run, "train/loss", chunk, [raw[s] for s in chunk])
    assert rollup.series_refresh(run_id=run.pk) == 1
    for points in (2000, 500, 300, 100, 2):  # from the fine and from the coarse copy
        (entry,) = plan_series(api, plan, points=points)["series"]["train/loss"]
        assert entry["run"] == run.pk
        assert points / 2 < len(entry["step"]) <= points
        assert 50.0 in entry["max"]
        assert_exact(entry, raw)
        assert entry["step"][-1] == 10_006


def test_every_point_when_they_fit(api: APIClient, plan: Plan) -> None:
    run = running_runs(plan)[0]
    write(run, "eval/loss", [0, 10, 20], [3.0, 2.0, 1.5])
    rollup.series_refresh(run_id=run.pk)
    (entry,) = plan_series(api, plan)["series"]["eval/loss"]
    assert entry == {
        "run": run.pk,
        "step": [0, 10, 20],
        "value": [3.0, 2.0, 1.5],
        "min": [3.0, 2.0, 1.5],
        "max": [3.0, 2.0, 1.5],
    }


def test_lower_steps_arriving_late_rebuild_from_a_new_origin(api: APIClient, plan: Plan) -> None:
    run = running_runs(plan)[0]
    raw = {step: float((step * 7919) % 1000) for step in range(6000)}
    late = list(range(5000, 6000))
    write(run, "train/loss", late, [raw[s] for s in late])
    rollup.series_refresh(run_id=run.pk)
    assert MetricSeries.objects.get(run=run).origin == 5000
    early = list(range(5000))
    write(run, "train/loss", early, [raw[s] for s in early])
    rollup.series_refresh(run_id=run.pk)
    stored = MetricSeries.objects.get(run=run)
    assert (stored.origin, stored.width) == (0, 4)
    (entry,) = plan_series(api, plan, points=2000)["series"]["train/loss"]
    assert_exact(entry, raw)


def test_growing_series_doubles_its_width_and_equals_a_rebuild(plan: Plan) -> None:
    run = running_runs(plan)[0]
    rng = random.Random(7)  # noqa: S311  (test data)
    values = [rng.gauss(0, 1) for _ in range(20_000)]
    for at in range(0, 20_000, 2500):  # a refresh after each stretch, as while a run trains
        write(run, "train/loss", list(range(at, at + 2500)), values[at : at + 2500])
        rollup.series_refresh(run_id=run.pk)
    grown = MetricSeries.objects.get(run=run)
    assert grown.width == 16  # 20,000 steps in at most 2048 buckets
    summary = MetricSummary.objects.get(run=run)
    assert (summary.count, summary.min, summary.max) == (20_000, min(values), max(values))
    MetricSeries.objects.filter(run=run).delete()
    MetricSummary.objects.filter(run=run).update(stale_from=0)
    rollup.series_refresh(run_id=run.pk)
    rebuilt = MetricSeries.objects.get(run=run)
    assert (rebuilt.origin, rebuilt.width) == (grown.origin, grown.width)
    old, new = (
        series_buckets.Buckets.unpack(grown.buckets),
        series_buckets.Buckets.unpack(rebuilt.buckets),
    )
    assert old.last.tolist() == new.last.tolist()
    assert old.count.tolist() == new.count.tolist()
    assert (old.low.tolist(), old.high.tolist()) == (new.low.tolist(), new.high.tolist())
    assert old.total == pytest.approx(new.total)


def test_resent_batch_leaves_the_rollup_alone(plan: Plan) -> None:
    run = running_runs(plan)[0]
    steps, values = list(range(3000)), [1.0 / (s + 1) for s in range(3000)]
    write(run, "train/loss", steps, values)
    rollup.series_refresh(run_id=run.pk)
    before = MetricSeries.objects.get(run=run)
    write(run, "train/loss", steps, values)
    assert MetricSummary.objects.get(run=run).stale_from is None
    assert rollup.series_refresh(run_id=run.pk) == 0
    after = MetricSeries.objects.get(run=run)
    assert (bytes(after.buckets), after.refreshed_at) == (
        bytes(before.buckets),
        before.refreshed_at,
    )
    assert MetricSummary.objects.get(run=run).count == 3000


def test_a_step_resent_with_a_new_value_replaces_it_everywhere(api: APIClient, plan: Plan) -> None:
    run = running_runs(plan)[0]
    raw = dict.fromkeys(range(5000), 1.0)
    raw[1234] = 99.0
    write(run, "train/loss", list(raw), list(raw.values()))
    rollup.series_refresh(run_id=run.pk)
    raw[1234] = 0.5  # a run resumed from a checkpoint logs the step again
    write(run, "train/loss", [1234], [0.5])
    summary = MetricSummary.objects.get(run=run)
    assert summary.stale_from == 1234
    rollup.series_refresh(run_id=run.pk)
    summary.refresh_from_db()
    assert (summary.min, summary.max, summary.count) == (0.5, 1.0, 5000)
    (entry,) = plan_series(api, plan, points=100)["series"]["train/loss"]
    assert 99.0 not in entry["max"]
    assert_exact(entry, raw)


def test_plan_series_shape(api: APIClient, recipe: Any) -> None:
    plan = launched_plan(recipe, GRID_SPEC)
    runs = running_runs(plan)
    for run in runs[:2]:
        write(run, "train/loss", [0, 1], [2.0, 1.0])
        write(run, "eval/loss", [1], [2.5])
    rollup.series_refresh(run_id=runs[0].pk)
    rollup.series_refresh(run_id=runs[1].pk)
    body = plan_series(api, plan)
    assert set(body) == {"plan", "active", "keys", "metrics", "runs", "series"}
    assert body["plan"] == plan.pk
    assert body["active"] is True
    assert body["keys"] == ["eval/loss", "train/loss"]
    assert [r["id"] for r in body["runs"]] == [r.pk for r in runs]
    first = body["runs"][0]
    assert set(first) == {"id", "state", "label", "baseline", "axes", "url"}
    assert first["state"] == "running"
    assert first["url"] == f"/runs/{runs[0].pk}/"
    assert set(first["axes"]) == {"capacity_factor", "seed"}
    baselines = [r for r in body["runs"] if r["baseline"]]
    assert baselines
    assert all(r["label"].startswith("baseline") for r in baselines)
    by_axes = {(r["axes"]["capacity_factor"], r["axes"]["seed"]) for r in body["runs"]}
    assert {(2.0, 0), (3.0, 1)} <= by_axes
    assert [e["run"] for e in body["series"]["train/loss"]] == [runs[0].pk, runs[1].pk]
    assert set(body["series"]["train/loss"][0]) == {"run", "step", "value", "min", "max"}


def test_plan_goes_inactive_when_every_run_ended_and_its_series_caught_up(
    api: APIClient, plan: Plan
) -> None:
    runs = running_runs(plan)
    write(runs[0], "train/loss", [0, 1], [2.0, 1.0])
    for run in runs:
        run_writes.run_transition(run_id=run.pk, to_state=RunState.FINISHED, door="worker")
    # The read rolls the last points up itself (charts.series_refresh_on_read): nothing is
    # left to change, and the points are there.
    body = plan_series(api, plan)
    assert body["active"] is False
    [line] = [s for s in body["series"]["train/loss"] if s["run"] == runs[0].pk]
    assert line["step"] == [0, 1]


@pytest.mark.parametrize("spec", [None, GRID_SPEC])
def test_plan_series_queries_do_not_grow_with_runs_or_keys(
    api: APIClient, recipe: Any, spec: str | None, django_assert_num_queries: Any
) -> None:
    plan = launched_plan(recipe, spec) if spec else launched_plan(recipe)
    keys = ["train/loss", "eval/loss"] + (["throughput/mfu", "moe/drop_fraction"] if spec else [])
    for run in running_runs(plan):
        for key in keys:
            write(run, key, list(range(100)), [1.0] * 100)
        rollup.series_refresh(run_id=run.pk)
    with django_assert_num_queries(4):
        body = plan_series(api, plan)
    assert len(body["keys"]) == len(keys)
    assert all(len(body["series"][k]) == len(body["runs"]) for k in keys)


def test_keys_choose_the_series(api: APIClient, plan: Plan) -> None:
    run = running_runs(plan)[0]
    write(run, "train/loss", [0], [1.0])
    write(run, "eval/loss", [0], [2.0])
    rollup.series_refresh(run_id=run.pk)
    body = plan_series(api, plan, keys="train/loss,never/logged")
    assert body["keys"] == ["train/loss", "never/logged"]
    assert len(body["series"]["train/loss"]) == 1
    assert body["series"]["never/logged"] == []


def test_cached_run_draws_the_run_it_reuses(api: APIClient, recipe: Any) -> None:
    first = launched_plan(recipe)
    for run in running_runs(first):
        write(run, "train/loss", [0, 1], [2.0, 1.0])
        run_writes.run_transition(run_id=run.pk, to_state=RunState.FINISHED, door="worker")
        rollup.series_refresh(run_id=run.pk)
    second = launched_plan(recipe)
    cached = Run.objects.filter(plan=second).exclude(cached_from=None)
    assert cached.exists()
    body = plan_series(api, second)
    drawn = {e["run"] for e in body["series"]["train/loss"]}
    assert drawn == set(cached.values_list("pk", flat=True))


def test_runs_series_for_the_compare_page(
    api: APIClient, recipe: Any, django_assert_num_queries: Any
) -> None:
    one, two = launched_plan(recipe), launched_plan(recipe, GRID_SPEC)
    picked = [running_runs(two)[3], running_runs(one)[0]]
    for run in picked:
        write(run, "train/loss", [0, 5], [2.0, 1.0])
        rollup.series_refresh(run_id=run.pk)
    ids = f"{picked[0].pk},{picked[1].pk},{picked[0].pk},999999"
    with django_assert_num_queries(4):
        response = api.get("/api/v1/runs/series/", {"ids": ids, "points": "100"})
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"active", "keys", "metrics", "runs", "series"}
    assert [r["id"] for r in body["runs"]] == [picked[0].pk, picked[1].pk]
    assert set(body["runs"][0]["axes"]) == {"capacity_factor", "seed"}
    assert body["runs"][1]["axes"] == {"capacity_factor": 1.0}  # the baseline's value
    assert [e["run"] for e in body["series"]["train/loss"]] == [picked[0].pk, picked[1].pk]


@pytest.mark.parametrize(
    ("ids", "fragment"),
    [
        (",".join(str(i) for i in range(1, 102)), "at most 100"),
        ("1,two,3", "positive integers"),
        ("1,-2", "positive integers"),
        ("", "give run ids"),
    ],
)
def test_runs_series_refuses_bad_or_too_many_ids(api: APIClient, ids: str, fragment: str) -> None:
    response = api.get("/api/v1/runs/series/", {"ids": ids})
    assert response.status_code == 400
    assert fragment in response.content.decode()


def test_runs_series_takes_a_hundred_ids(api: APIClient) -> None:
    ids = ",".join(str(i) for i in range(1, 101))
    assert api.get("/api/v1/runs/series/", {"ids": ids}).json()["runs"] == []


@pytest.mark.parametrize("points", ["1", "2001", "many"])
def test_points_out_of_bounds_are_refused(api: APIClient, plan: Plan, points: str) -> None:
    response = api.get(f"/api/v1/plans/{plan.pk}/series/", {"points": points})
    assert response.status_code == 400


def test_bad_key_is_refused(api: APIClient, plan: Plan) -> None:
    response = api.get(f"/api/v1/plans/{plan.pk}/series/", {"keys": "train/loss,<b>"})
    assert response.status_code == 400


def test_unknown_plan_is_404(api: APIClient) -> None:
    assert api.get("/api/v1/plans/999999/series/").status_code == 404


def test_ingest_asks_for_one_refresh_a_period(
    plan: Plan, django_capture_on_commit_callbacks: Any
) -> None:
    run = running_runs(plan)[0]
    cache.clear()
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        write(run, "train/loss", list(range(10)), [1.0] * 10)
        write(run, "train/loss", list(range(10, 20)), [1.0] * 10)
    assert len(callbacks) == 1
    summary = MetricSummary.objects.get(run=run)
    assert summary.stale_from is None  # the eager task refreshed it
    assert MetricSeries.objects.filter(run=run).exists()


def test_a_run_that_ends_is_refreshed_at_once(
    plan: Plan, django_capture_on_commit_callbacks: Any
) -> None:
    run = running_runs(plan)[0]
    write(run, "train/loss", list(range(10)), [1.0] * 10)  # its nudge is never run here
    assert MetricSummary.objects.get(run=run).stale_from == 0
    with django_capture_on_commit_callbacks(execute=True):
        run_writes.run_transition(run_id=run.pk, to_state=RunState.FINISHED, door="runner")
    assert MetricSummary.objects.get(run=run).stale_from is None
    assert MetricSeries.objects.filter(run=run).exists()


def test_the_sweep_refreshes_what_a_lost_nudge_left(plan: Plan) -> None:
    runs = running_runs(plan)
    for run in runs:
        write(run, "train/loss", [0, 1], [1.0, 2.0])
        write(run, "eval/loss", [0], [1.0])
    assert rollup.series_refresh_stale() == 2 * len(runs)
    assert not MetricSummary.objects.filter(stale_from__isnull=False).exists()
    assert rollup.series_refresh_stale() == 0


def test_width_is_the_smallest_power_of_two_that_fits() -> None:
    assert series_buckets.width_for(0) == 1
    assert series_buckets.width_for(2047) == 1
    assert series_buckets.width_for(2048) == 2
    assert series_buckets.width_for(99_999) == 64
