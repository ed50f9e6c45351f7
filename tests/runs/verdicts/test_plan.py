"""A plan's preregistered verdict from its finished runs: inputs named, missing ones too."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from runs.models import MetricPoint, MetricSummary, Run, RunState
from runs.results.summary import plan_summarize
from runs.services import runs as run_writes
from runs.verdicts.gates import speedup_at
from tests.runs.runs_helpers import launched_plan

pytestmark = pytest.mark.django_db

SPEC = """axes:
  capacity_factor: [2.0]
scales: [small, medium]
"""
RULE = {"kind": "effective_speedup", "metric": "eval/loss"}


def _finish(run: Run, *, loss: float, speeds: list[float], state: str = RunState.FINISHED) -> None:
    run_writes.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door="worker")
    MetricSummary.objects.create(run=run, key="eval/loss", last=loss, min=loss, max=loss, step=10)
    now = timezone.now()
    MetricPoint.objects.bulk_create(
        MetricPoint(run=run, key="throughput/tokens_per_second", step=i, value=v, time=now)
        for i, v in enumerate(speeds)
    )
    run_writes.run_transition(run_id=run.pk, to_state=state, door="worker")


def _runs(plan: Any) -> dict[tuple[bool, str], Run]:
    return {
        (run.entry.is_baseline, run.entry.scale): run
        for run in Run.objects.filter(plan=plan).select_related("entry")
    }


def test_effective_speedup_from_finished_runs(recipe: Any) -> None:
    plan = launched_plan(recipe, SPEC, criteria={"metric": "eval/loss", "rule": RULE})
    runs = _runs(plan)
    # 150 steps of throughput: the first 50 slow (warm-up), the last 100 are what counts.
    slow_then = [1.0] * 50
    _finish(runs[(True, "small")], loss=3.0, speeds=slow_then + [1000.0] * 100)
    _finish(runs[(False, "small")], loss=2.9, speeds=slow_then + [950.0] * 100)
    _finish(runs[(True, "medium")], loss=2.6, speeds=slow_then + [800.0] * 100)
    _finish(runs[(False, "medium")], loss=2.55, speeds=slow_then + [800.0] * 100)
    summary = plan_summarize(plan_id=plan.pk)
    verdicts = summary["verdicts"]
    assert verdicts["rule"] == "effective_speedup" and verdicts["parameters"]["alpha"] == 0.0941
    (row,) = verdicts["variants"]
    assert row["missing"] == []
    scales = {s["name"]: s for s in row["verdict"]["result"]["scales"]}
    assert scales["small"]["speedup"] == pytest.approx(
        speedup_at(
            baseline_loss=3.0,
            variant_loss=2.9,
            baseline_tps=1000,
            variant_tps=950,
            asymptote=1.6,
            alpha=0.0941,
        )[1]
    )
    assert scales["medium"]["speedup"] == pytest.approx((1.0 / 0.95) ** (1 / 0.0941))
    assert row["verdict"]["passed"] is True
    inputs = " ".join(row["verdict"]["inputs"])
    assert f"runs {runs[(True, 'small')].pk} (seeds" in inputs
    assert "mean of the last 100 steps" in inputs
    assert "Preregistered rule" in summary["markdown"]
    assert "stepwise" in summary["markdown"] and "**passes**" in summary["markdown"]


def test_a_failed_run_is_no_input_and_is_named(recipe: Any) -> None:
    plan = launched_plan(recipe, SPEC, criteria={"metric": "eval/loss", "rule": RULE})
    runs = _runs(plan)
    _finish(runs[(True, "small")], loss=3.0, speeds=[1000.0] * 10)
    _finish(runs[(False, "small")], loss=2.9, speeds=[950.0] * 10)
    _finish(runs[(True, "medium")], loss=2.6, speeds=[800.0] * 10)
    _finish(runs[(False, "medium")], loss=2.0, speeds=[800.0] * 10, state=RunState.FAILED)
    summary = plan_summarize(plan_id=plan.pk)
    (row,) = summary["verdicts"]["variants"]
    assert row["verdict"] is None
    assert row["missing"] == [
        f"medium: the variant has no finished run (run {runs[(False, 'medium')].pk} is failed)"
    ]
    assert "no verdict, an input is missing" in summary["markdown"]


def test_a_board_rule_gives_no_plan_verdict(recipe: Any) -> None:
    plan = launched_plan(
        recipe, SPEC, criteria={"metric": "eval/loss", "rule": {"kind": "speedrun_threshold"}}
    )
    summary = plan_summarize(plan_id=plan.pk)
    assert "board" in summary["verdicts"]["refused"]


def test_the_page_shows_the_rule_then_its_arithmetic(recipe: Any) -> None:
    from django.template import Context, Template

    plan = launched_plan(recipe, SPEC, criteria={"metric": "eval/loss", "rule": RULE})
    page = Template("{% load runs_results %}{% plan_results plan %}")
    waiting = page.render(Context({"plan": plan}))
    assert "Preregistered verdict" in waiting and "<code>effective_speedup</code>" in waiting
    assert "once every run has ended" in waiting
    runs = _runs(plan)
    for (is_baseline, scale), run in runs.items():
        loss = {"small": 3.0, "medium": 2.6}[scale] - (0 if is_baseline else 0.05)
        _finish(run, loss=loss, speeds=[1000.0] * 10)
    launch = plan.launch
    launch.summary = plan_summarize(plan_id=plan.pk)
    launch.save(update_fields=["summary"])
    plan.refresh_from_db()
    done = Template("{% load runs_results %}{% plan_results plan %}").render(
        Context({"plan": plan})
    )
    assert 'data-verdict="passed"' in done
    assert "stepwise = C / budget" in done and "mean of the last 100 steps" in done
