"""Results: the plan summary against the baseline, the verdict, plan_finished; rerun, retry,
cancel through the API with their permissions."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser

from marin_site.errors import Conflict, TransitionNotAllowed
from runs.models import MetricSummary, PlanLaunch, Run, RunState
from runs.results import summary as results
from runs.services import dispatch
from runs.services import plans as plan_services
from runs.services import runs as run_writes
from runs.signals import plan_finished
from tests.runs.runs_helpers import eager_tasks, launched_plan  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("eager_tasks")]


def finish(run: Run, **metrics: float) -> None:
    run_writes.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door="worker")
    for key, value in metrics.items():
        MetricSummary.objects.create(
            run=run, key=key.replace("__", "/"), last=value, min=value, max=value, step=10
        )
    run_writes.run_transition(run_id=run.pk, to_state=RunState.FINISHED, door="worker")


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
    run_writes.run_transition(
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
    again = run_writes.run_rerun(run_id=ablation.pk, actor=maintainer)
    assert run_writes.run_rerun(run_id=ablation.pk, actor=maintainer).pk == again.pk  # asked twice
    assert (again.state, again.sequence, again.entry_id) == ("queued", 1, ablation.entry_id)
    ablation.refresh_from_db()
    assert ablation.state == RunState.FINISHED  # terminal states never change
    assert PlanLaunch.objects.get(plan=plan).finished_at is None
    assert [r.pk for r in results.latest_runs(plan_id=plan.pk)] == [baseline.pk, again.pk]


def test_rerun_and_retry_refused_once_the_plan_is_cancelled(
    api_as: Any, recipe: Any, maintainer: Any
) -> None:
    plan = launched_plan(recipe)
    finished, failed = Run.objects.filter(plan=plan).order_by("pk")
    finish(finished)
    run_writes.run_transition(
        run_id=failed.pk, to_state="failed", failure_kind="code", door="worker"
    )
    plan_services.plan_cancel(plan_id=plan.pk, actor=maintainer)
    with pytest.raises(Conflict, match="its plan was cancelled"):
        run_writes.run_rerun(run_id=finished.pk, actor=maintainer)
    with pytest.raises(Conflict, match="its plan was cancelled"):
        run_writes.run_retry(run_id=failed.pk, actor=maintainer)
    response = api_as(maintainer).post(f"/api/v1/runs/{finished.pk}/rerun/")
    assert response.status_code == 409
    assert "cancelled" in response.json()["detail"]
    assert Run.objects.filter(plan=plan).count() == 2  # no run that nothing would start
    assert dispatch.runs_dispatch() == []


def test_retry_refused_for_a_finished_run(recipe: Any, maintainer: Any) -> None:
    run = Run.objects.filter(plan=launched_plan(recipe)).first()
    assert run is not None
    finish(run)
    with pytest.raises(TransitionNotAllowed) as refused:
        run_writes.run_retry(run_id=run.pk, actor=maintainer)
    assert refused.value.allowed == ["crashed", "failed", "killed"]


def test_cancel_refused_for_a_terminal_run(recipe: Any, maintainer: Any) -> None:
    run = Run.objects.filter(plan=launched_plan(recipe)).first()
    assert run is not None
    finish(run)
    with pytest.raises(TransitionNotAllowed):
        run_writes.run_cancel(run_id=run.pk, actor=maintainer)


def test_plan_cancel_kills_queued_runs_and_stops_dispatch(recipe: Any) -> None:
    plan = launched_plan(recipe)
    assert plan_services.plan_cancel(plan_id=plan.pk, actor=AnonymousUser()) == 2
    assert plan_services.plan_cancel(plan_id=plan.pk) == 0
    assert set(Run.objects.filter(plan=plan).values_list("state", flat=True)) == {"killed"}
    assert dispatch.runs_dispatch() == []


def test_plan_cancel_kills_preempted_runs_and_asks_running_ones_once(recipe: Any) -> None:
    plan = launched_plan(recipe)
    running, preempted = Run.objects.filter(plan=plan).order_by("pk")
    for run in (running, preempted):
        run_writes.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door="worker")
    run_writes.run_transition(run_id=preempted.pk, to_state=RunState.PREEMPTED, door="worker")

    assert plan_services.plan_cancel(plan_id=plan.pk) == 2
    assert plan_services.plan_cancel(plan_id=plan.pk) == 0

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
        run_writes.run_transition(
            run_id=run.pk, to_state="failed", failure_kind="code", door="worker"
        )
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


# --- seeds, cached throughput, the ladder in the summary -----------------------------------

SEEDED_SPEC = """axes:
  capacity_factor: [2.0]
seeds: [0, 1, 2]
"""


def _by_seed(plan: Any) -> dict[tuple[bool, int | None], Run]:
    return {
        (run.entry.is_baseline, run.entry.seed): run
        for run in Run.objects.filter(plan=plan).select_related("entry")
    }


def test_seeds_give_mean_std_and_delta_and_noise_makes_the_verdict_inconclusive(
    recipe: Any,
) -> None:
    plan = launched_plan(recipe, SEEDED_SPEC)
    runs = _by_seed(plan)
    # 0.02 better at every seed (each run beats its baseline by the 0.01 threshold), but
    # the seeds spread by 0.1: Welch's test puts the difference inside the noise.
    for seed, (base, ablation) in enumerate([(3.00, 2.98), (3.10, 3.08), (2.90, 2.88)]):
        finish(runs[(True, seed)], eval__loss=base)
        finish(runs[(False, seed)], eval__loss=ablation)
    assert results.plan_check_finished(plan_id=plan.pk)
    summary = PlanLaunch.objects.get(plan=plan).summary
    assert summary is not None
    assert all(row["meets_threshold"] for row in summary["comparisons"])  # run by run
    assert summary["suggested_verdict"] == "inconclusive"
    assert (
        summary["verdict_reason"] == "every difference from the baseline is inside the seed noise"
    )
    base, ablation = summary["groups"]
    assert (base["seeds"], ablation["seeds"]) == (3, 3)
    assert base["stats"]["eval/loss"]["std"] == pytest.approx(0.1)
    assert ablation["delta"] == pytest.approx(-0.02)
    assert ablation["delta_se"] == pytest.approx((2 * 0.1**2 / 3) ** 0.5)
    markdown = summary["markdown"]
    assert "**Across seeds** (mean ± sample standard deviation" in markdown
    # Numbers and labels as the pages write them (runs.results.presentation): a loss to 4 places,
    # a true minus sign, the override as in the canonical config, never the diff's dict.
    assert "| baseline | – | 3 | 3.0000 ± 0.1000 | – |" in markdown
    assert (
        "| capacity_factor=2 | – | 3 | 2.9800 ± 0.1000 | −0.0200 ± 0.0816 (inside the noise) |"
        in markdown
    )
    ablation_run = runs[(False, 0)]
    assert f"| {ablation_run.pk} | – | 0 | capacity_factor=2 | finished |" in markdown
    assert "'value'" not in markdown
    assert "Suggested verdict: **Inconclusive**: every difference" in markdown


def test_seeds_outside_the_noise_can_work(recipe: Any) -> None:
    plan = launched_plan(recipe, SEEDED_SPEC)
    runs = _by_seed(plan)
    for seed, (base, ablation) in enumerate([(3.00, 2.90), (3.01, 2.91), (3.02, 2.92)]):
        finish(runs[(True, seed)], eval__loss=base)
        finish(runs[(False, seed)], eval__loss=ablation)
    results.plan_check_finished(plan_id=plan.pk)
    summary = PlanLaunch.objects.get(plan=plan).summary
    assert summary is not None
    assert summary["suggested_verdict"] == "worked"
    assert "(outside the noise)" in summary["markdown"]
    assert "tested against the seed spread (Welch's t-test, 95%)" in summary["verdict_reason"]


def test_one_seed_says_no_spread_is_known(recipe: Any) -> None:
    plan = launched_plan(recipe)
    baseline, ablation = baseline_and_ablation(plan)
    finish(baseline, eval__loss=3.0)
    finish(ablation, eval__loss=2.0)
    results.plan_check_finished(plan_id=plan.pk)
    summary = PlanLaunch.objects.get(plan=plan).summary
    assert summary is not None
    assert summary["suggested_verdict"] == "worked"
    assert "One seed per point: no seed spread is known" in summary["markdown"]
    assert "**Across seeds**" not in summary["markdown"]


def test_cached_run_marks_its_reused_throughput(recipe: Any) -> None:
    first = launched_plan(recipe)
    for run in Run.objects.filter(plan=first):
        finish(run, eval__loss=3.0, throughput__tokens_per_second=1000.0)
    second = launched_plan(recipe)
    cached = Run.objects.filter(plan=second).exclude(cached_from=None)
    assert cached.count() == 2
    assert results.plan_check_finished(plan_id=second.pk)
    summary = PlanLaunch.objects.get(plan=second).summary
    assert summary is not None
    assert all(row["cached_from"] for row in summary["runs"])
    assert "| 1,000 (reused) |" in summary["markdown"]
    assert "*(reused)*: a cached run shows what the run it reuses measured" in summary["markdown"]


LADDER_SPEC = """axes:
  capacity_factor: [2.0]
scales: [small, medium, large]
"""


def test_summary_of_a_flat_ladder_states_no_multiplier_and_says_why(recipe: Any) -> None:
    plan = launched_plan(recipe, LADDER_SPEC)
    flat = {"small": 3.00, "medium": 2.98, "large": 3.01}  # loss does not fall with compute
    for run in Run.objects.filter(plan=plan).select_related("entry"):
        finish(run, eval__loss=flat[run.entry.scale] - (0.0 if run.entry.is_baseline else 0.01))
    results.plan_check_finished(plan_id=plan.pk)
    summary = PlanLaunch.objects.get(plan=plan).summary
    assert summary is not None
    ladder = summary["ladder"]
    assert ladder["metric"] == "eval/loss"
    assert [v["multiplier"] for v in ladder["variants"]] == [None, None]
    assert "below 0.9" in ladder["variants"][1]["refusals"][0]
    assert (
        "capacity_factor=2: no multiplier, because the baseline's fit has R²"
        in (summary["markdown"])
    )


def test_the_result_table_writes_a_declared_unit_as_the_pages_do() -> None:
    row = {
        "run": 1,
        "scale": "",
        "seed": None,
        "overrides": {},
        "state": "finished",
        "cached_from": None,
        "metrics": {"throughput/mfu": 41.0},
    }
    summary: dict[str, Any] = {
        "keys": ["throughput/mfu"],
        "runs": [row],
        "groups": [],
        "criteria": {},
        "units": {"throughput/mfu": "percent"},  # Marin's recipe: MFU declared in percent
    }
    assert "| 41.0% |" in results.summary_markdown(summary)
    assert "| MFU (%) |" not in results.summary_markdown(summary)  # a summary kept before names
    declared = {"throughput/mfu": {"unit": "percent", "logged_as": "fraction", "display": "MFU"}}
    as_fraction = {**summary, "declared": declared}
    as_fraction["runs"] = [{**row, "metrics": {"throughput/mfu": 0.41}}]
    markdown = results.summary_markdown(as_fraction)
    assert "| MFU (%) |" in markdown  # the column is titled as on the pages
    assert "| 41.0% |" in markdown
    assert "| 41.0000 |" in results.summary_markdown({**summary, "units": {}})  # as logged
