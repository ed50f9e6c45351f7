"""Steady-state throughput: the median after the recipe's warm-up, kept by the series
refresh, and what the run table and the plan summary show instead of the last step."""

from __future__ import annotations

import statistics
from typing import Any

import pytest

from runs.metrics import ingest, steady
from runs.metrics.parse import PointBatch
from runs.models import MetricSummary, Plan, Recipe, Run, RunState
from runs.results import run_table
from runs.results import summary as results
from runs.series import rollup
from runs.services import runs as run_writes
from runs.specs.compute import validate_compute_model
from tests.runs.runs_helpers import launched_plan

pytestmark = pytest.mark.django_db

# A run that starts slow (warm-up), settles near 1000 tokens/s, and stalls at its last step.
SPEEDS = [50.0, 200.0, 400.0, 990.0, 1010.0, 1000.0, 995.0, 1005.0, 998.0, 1002.0, 120.0]


def _report(run: Run, key: str, values: list[float], *, first: int = 1) -> None:
    steps = list(range(first, first + len(values)))
    batch = PointBatch(
        keys=[key] * len(values), steps=steps, values=values, times=[None] * len(values)
    )
    ingest.metrics_ingest(run=Run.objects.get(pk=run.pk), batch=batch)
    rollup.series_refresh(run_id=run.pk)


def _running(plan: Plan) -> Run:
    run = Run.objects.filter(plan=plan).select_related("entry").order_by("entry__index").first()
    assert run is not None
    run_writes.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door="worker")
    return run


def _with_warmup(recipe: Recipe, steps: int | None, *, declared: int | None = None) -> Recipe:
    """The recipe with ``steps`` as its compute model's warm-up and ``declared`` as each
    throughput key's declared one (None: not declared)."""
    model = dict(recipe.compute_model)
    model.pop("steady_state_warmup_steps", None)
    if steps is not None:
        model["steady_state_warmup_steps"] = steps
    recipe.compute_model = model
    declarations = []
    for given in recipe.metrics:
        item = {k: v for k, v in given.items() if k != "warmup_steps"}
        if declared is not None and steady.is_steady_state_key(item["key"]):
            item["warmup_steps"] = declared
        declarations.append(item)
    recipe.metrics = declarations
    recipe.save(update_fields=["compute_model", "metrics"])
    return recipe


def test_throughput_summary_is_the_median_after_the_declared_warm_up(recipe: Any) -> None:
    run = _running(launched_plan(_with_warmup(recipe, 3)))
    _report(run, "throughput/tokens_per_second", SPEEDS)
    _report(run, "train/loss", [3.0, 2.0, 1.5])
    summary = MetricSummary.objects.get(run=run, key="throughput/tokens_per_second")
    assert summary.last == 120.0  # the stalled last step
    assert summary.steady == statistics.median(SPEEDS[3:]) == 999.0  # steps 4.. (after 3)
    assert MetricSummary.objects.get(run=run, key="train/loss").steady is None
    values = results.final_metrics(runs=[run])[run.pk]
    assert values["throughput/tokens_per_second"] == 999.0
    assert values["train/loss"] == 1.5


def test_a_keys_declared_warm_up_comes_before_the_compute_models(recipe: Any) -> None:
    run = _running(launched_plan(_with_warmup(recipe, 1, declared=3)))
    _report(run, "throughput/tokens_per_second", SPEEDS)
    summary = MetricSummary.objects.get(run=run, key="throughput/tokens_per_second")
    assert summary.steady == statistics.median(SPEEDS[3:])  # after step 3, not step 1


def test_the_declared_warm_up_is_the_keys_own() -> None:
    assert (
        steady.warmup_last_step(
            compute_model={"steady_state_warmup_steps": 1},
            first_step=1,
            last_step=11,
            declared_steps=4,
        )
        == 4
    )
    assert (
        steady.warmup_last_step(
            compute_model={"steady_state_warmup_steps": 1}, first_step=1, last_step=11
        )
        == 1
    )


def test_median_follows_points_that_arrive_later(recipe: Any) -> None:
    run = _running(launched_plan(_with_warmup(recipe, 3)))
    _report(run, "throughput/mfu", [0.01, 0.02, 0.03, 0.30, 0.32])
    assert MetricSummary.objects.get(run=run, key="throughput/mfu").steady == pytest.approx(0.31)
    _report(run, "throughput/mfu", [0.34, 0.36, 0.05], first=6)
    summary = MetricSummary.objects.get(run=run, key="throughput/mfu")
    assert summary.last == 0.05
    assert summary.steady == pytest.approx(0.32)  # median of .30 .32 .34 .36 .05


def test_without_a_declared_warm_up_the_first_tenth_is_skipped(recipe: Any) -> None:
    run = _running(launched_plan(_with_warmup(recipe, None)))
    _report(run, "throughput/tokens_per_second", [10.0] * 10 + [500.0] * 81 + [5.0] * 10)
    # Steps 1..101: the warm-up ends at step 1 + 10, and the stalls at the end are outvoted.
    assert MetricSummary.objects.get(run=run).steady == 500.0
    assert steady.warmup_last_step(compute_model={}, first_step=1, last_step=101) == 11


def test_a_run_shorter_than_its_warm_up_gets_the_median_of_every_point(recipe: Any) -> None:
    run = _running(launched_plan(_with_warmup(recipe, 50)))
    _report(run, "throughput/tokens_per_second", [100.0, 300.0, 200.0, 250.0])
    assert MetricSummary.objects.get(run=run).steady == 225.0


def test_run_table_shows_the_steady_median_and_marks_a_cached_runs_throughput(
    recipe: Any,
) -> None:
    first = launched_plan(_with_warmup(recipe, 3))
    for run in Run.objects.filter(plan=first):
        run_writes.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door="worker")
        _report(run, "throughput/tokens_per_second", SPEEDS)
        run_writes.run_transition(run_id=run.pk, to_state=RunState.FINISHED, door="worker")
    table = run_table.plan_run_table(plan=first)
    assert {row.values["throughput/tokens_per_second"] for row in table.rows} == {999.0}
    second = launched_plan(recipe)
    table = run_table.plan_run_table(plan=second)
    assert all(row.run.cached_from_id for row in table.rows)
    assert {row.values["throughput/tokens_per_second"] for row in table.rows} == {999.0}


def test_compute_model_checks_the_declared_warm_up() -> None:
    model = {
        "active_params": 1.0,
        "tokens": 1.0,
        "peak_flops_per_accelerator": 1.0,
        "assumed_mfu": 0.5,
    }
    assert validate_compute_model({**model, "steady_state_warmup_steps": 10}) == []
    for bad in (-1, 2.5, True, "10"):
        assert validate_compute_model({**model, "steady_state_warmup_steps": bad}) == [
            "'steady_state_warmup_steps' must be a whole number of steps from 0 to 1000000000000"
        ]
