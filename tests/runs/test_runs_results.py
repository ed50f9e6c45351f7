"""Results: the plan summary against the baseline, the verdict, plan_finished; rerun, retry,
cancel through the API with their permissions."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser

from marin_site.errors import TransitionNotAllowed
from runs import queue, results, services
from runs.models import MetricSummary, PlanLaunch, Run, RunState
from runs.signals import plan_finished
from tests.runs.runs_helpers import eager_tasks, launched_plan  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("eager_tasks")]


def finish(run: Run, **metrics: float) -> None:
    queue.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door="worker")
    for key, value in metrics.items():
        MetricSummary.objects.create(
            run=run, key=key.replace("__", "/"), last=value, min=value, max=value, step=10
        )
    queue.run_transition(run_id=run.pk, to_state=RunState.FINISHED, door="worker")


def baseline_and_ablation(plan: Any) -> tuple[Run, Run]:
    baseline = Run.objects.get(plan=plan, entry__is_baseline=True)
    ablation = Run.objects.get(plan=plan, entry__is_baseline=False)
    return baseline, ablation


@pytest.mark.parametrize(
    ("ablation_loss", "verdict"),
    [(2.0, "worked"), (2.995, "promising"), (3.2, "did_not_work")],
)
def test_summary_compares_with_baseline_and_suggests_verdict(
    recipe: Any, django_capture_on_commit_callbacks: Any, ablation_loss: float, verdict: str
) -> None:
    plan = launched_plan(recipe)
    baseline, ablation = baseline_and_ablation(plan)
    heard: list[dict[str, Any]] = []

    def listener(**kwargs: Any) -> None:
        heard.append(kwargs)

    plan_finished.connect(listener)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            finish(baseline, eval__loss=3.0, train__loss=2.9)
            assert results.plan_check_finished(plan_id=plan.pk) is False
            finish(ablation, eval__loss=ablation_loss, train__loss=2.0)
    finally:
        plan_finished.disconnect(listener)
    launch = PlanLaunch.objects.get(plan=plan)
    assert launch.finished_at is not None
    summary = launch.summary
    assert summary is not None
    assert summary["suggested_verdict"] == verdict
    assert summary["comparisons"][0]["baseline_value"] == 3.0
    assert summary["keys"] == ["train/loss", "eval/loss"]
    assert "| run | scale | seed |" in summary["markdown"]
    assert [h["plan_id"] for h in heard] == [plan.pk]  # told once
    assert results.plan_check_finished(plan_id=plan.pk) is False


def test_failed_ablation_makes_the_plan_inconclusive(recipe: Any) -> None:
    plan = launched_plan(recipe)
    baseline, ablation = baseline_and_ablation(plan)
    finish(baseline, eval__loss=3.0)
    queue.run_transition(
        run_id=ablation.pk, to_state=RunState.FAILED, failure_kind="code", door="worker"
    )
    assert results.plan_check_finished(plan_id=plan.pk)
    summary = PlanLaunch.objects.get(plan=plan).summary
    assert summary is not None
    assert summary["suggested_verdict"] == "inconclusive"
    assert summary["states"] == {"finished": 1, "failed": 1}


def test_no_criteria_is_not_evaluated(recipe: Any) -> None:
    plan = launched_plan(recipe, criteria={})
    for run in Run.objects.filter(plan=plan):
        finish(run, eval__loss=1.0)
    results.plan_check_finished(plan_id=plan.pk)
    summary = PlanLaunch.objects.get(plan=plan).summary
    assert summary is not None
    assert summary["suggested_verdict"] == "not_evaluated"


def test_rerun_makes_a_new_run_and_reopens_the_plan(recipe: Any, maintainer: Any) -> None:
    plan = launched_plan(recipe)
    baseline, ablation = baseline_and_ablation(plan)
    finish(baseline, eval__loss=3.0)
    finish(ablation, eval__loss=2.0)
    results.plan_check_finished(plan_id=plan.pk)
    again = queue.run_rerun(run_id=ablation.pk, actor=maintainer)
    assert queue.run_rerun(run_id=ablation.pk, actor=maintainer).pk == again.pk  # asked twice
    assert (again.state, again.sequence, again.entry_id) == ("queued", 1, ablation.entry_id)
    ablation.refresh_from_db()
    assert ablation.state == RunState.FINISHED  # terminal states never change
    assert PlanLaunch.objects.get(plan=plan).finished_at is None
    assert [r.pk for r in results.latest_runs(plan_id=plan.pk)] == [baseline.pk, again.pk]


def test_retry_refused_for_a_finished_run(recipe: Any, maintainer: Any) -> None:
    run = Run.objects.filter(plan=launched_plan(recipe)).first()
    assert run is not None
    finish(run)
    with pytest.raises(TransitionNotAllowed) as refused:
        queue.run_retry(run_id=run.pk, actor=maintainer)
    assert refused.value.allowed == ["crashed", "failed", "killed"]


def test_cancel_refused_for_a_terminal_run(recipe: Any, maintainer: Any) -> None:
    run = Run.objects.filter(plan=launched_plan(recipe)).first()
    assert run is not None
    finish(run)
    with pytest.raises(TransitionNotAllowed):
        queue.run_cancel(run_id=run.pk, actor=maintainer)


def test_plan_cancel_kills_queued_runs_and_stops_dispatch(recipe: Any) -> None:
    plan = launched_plan(recipe)
    assert services.plan_cancel(plan_id=plan.pk, actor=AnonymousUser()) == 2
    assert services.plan_cancel(plan_id=plan.pk) == 0
    assert set(Run.objects.filter(plan=plan).values_list("state", flat=True)) == {"killed"}
    assert queue.runs_dispatch() == []


def test_plan_cancel_kills_preempted_runs_and_asks_running_ones_once(recipe: Any) -> None:
    plan = launched_plan(recipe)
    running, preempted = Run.objects.filter(plan=plan).order_by("pk")
    for run in (running, preempted):
        queue.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door="worker")
    queue.run_transition(run_id=preempted.pk, to_state=RunState.PREEMPTED, door="worker")

    assert services.plan_cancel(plan_id=plan.pk) == 2
    assert services.plan_cancel(plan_id=plan.pk) == 0

    running.refresh_from_db()
    preempted.refresh_from_db()
    assert (running.state, preempted.state) == (RunState.RUNNING, RunState.KILLED)
    assert running.cancel_requested_at is not None
    assert running.events.filter(verb="cancel_requested").count() == 1
    assert preempted.events.get(verb="killed").from_state == RunState.PREEMPTED
    assert PlanLaunch.objects.get(plan=plan).canceled_at is not None


@pytest.mark.parametrize(("action", "state"), [("cancel", "queued"), ("retry", "failed")])
def test_api_actions_need_a_maintainer(
    api_as: Any, recipe: Any, maintainer: Any, contributor: Any, action: str, state: str
) -> None:
    run = Run.objects.filter(plan=launched_plan(recipe)).first()
    assert run is not None
    if state == "failed":
        queue.run_transition(run_id=run.pk, to_state="failed", failure_kind="code", door="worker")
    url = f"/api/v1/runs/{run.pk}/{action}/"
    assert api_as(contributor).post(url).status_code == 403
    response = api_as(maintainer).post(url)
    assert response.status_code == 200, response.content
    expected = "killed" if action == "cancel" else "queued"
    assert response.json()["state"] == expected


def test_api_rerun_refused_for_anonymous_and_409_for_running(
    api: Any, api_as: Any, recipe: Any, maintainer: Any
) -> None:
    run = Run.objects.filter(plan=launched_plan(recipe)).first()
    assert run is not None
    assert api.post(f"/api/v1/runs/{run.pk}/rerun/").status_code in {401, 403}
    response = api_as(maintainer).post(f"/api/v1/runs/{run.pk}/rerun/")
    assert response.status_code == 409
    assert response.json()["current_state"] == "queued"
