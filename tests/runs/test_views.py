"""The public run page and the run table the proposal page can include."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from runs.models import MetricSummary, Run, RunEvent, RunState
from runs.services import plans as plan_services
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
    # A fixed count: the run, its summaries, declarations, imports, events, leases,
    # artifacts, whether a newer run replaced it, the page that shows its plan, its alerts
    # and its flagged metrics.
    with django_assert_max_num_queries(12):
        response = client.get(run.get_absolute_url())
    page = response.content.decode()
    assert response.status_code == 200
    assert "running" in page
    assert "eval/loss" in page
    assert "2.2500" in page  # runs.results.presentation writes it
    assert "queued → running" in page


@pytest.mark.parametrize(
    ("clean", "words"),
    [(True, "(clean checkout)"), (False, "(the checkout was not clean)"), (None, "")],
)
def test_run_page_says_whether_the_pinned_checkout_was_clean(
    client: Client, recipe: Any, clean: bool | None, words: str
) -> None:
    run = Run.objects.filter(plan=launched_plan(recipe)).first()
    assert run is not None
    Run.objects.filter(pk=run.pk).update(git_sha="a" * 40, git_clean=clean)
    page = client.get(run.get_absolute_url()).content.decode()
    assert "aaaaaaaaaaaaaaa" in page
    if words:
        assert words in page
    else:
        assert "clean checkout" not in page and "not clean" not in page


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


# --- a maintainer's controls on the run page ---------------------------------------------


def _two_runs(recipe: Any) -> tuple[Run, Run]:
    plan = launched_plan(recipe)
    first, second = Run.objects.filter(plan=plan).order_by("pk")
    return first, second


def test_run_page_offers_the_actions_the_state_allows_to_maintainers_only(
    client: Client, recipe: Any, maintainer: Any, contributor: Any
) -> None:
    queued, ended = _two_runs(recipe)
    run_writes.run_transition(run_id=ended.pk, to_state=RunState.RUNNING, door="worker")
    run_writes.run_transition(run_id=ended.pk, to_state=RunState.FAILED, door="worker")
    assert 'id="run-actions"' not in client.get(queued.get_absolute_url()).content.decode()
    client.force_login(contributor)
    assert 'id="run-actions"' not in client.get(ended.get_absolute_url()).content.decode()
    client.force_login(maintainer)
    page = client.get(queued.get_absolute_url()).content.decode()
    assert f'action="/runs/{queued.pk}/cancel/"' in page
    assert "/rerun/" not in page and "/retry/" not in page
    page = client.get(ended.get_absolute_url()).content.decode()
    assert f'action="/runs/{ended.pk}/rerun/"' in page
    assert f'action="/runs/{ended.pk}/retry/"' in page
    assert "/cancel/" not in page
    assert 'name="csrfmiddlewaretoken"' in page.split('id="run-actions"')[1]


def test_a_cancelled_plan_s_runs_are_not_offered_again_and_a_forced_rerun_is_refused(
    client: Client, recipe: Any, maintainer: Any
) -> None:
    failed, _ = _two_runs(recipe)
    run_writes.run_transition(run_id=failed.pk, to_state=RunState.RUNNING, door="worker")
    run_writes.run_transition(run_id=failed.pk, to_state=RunState.FAILED, door="worker")
    client.force_login(maintainer)
    page = client.get(failed.get_absolute_url()).content.decode()
    assert "run-action-rerun" in page and "run-action-retry" in page
    plan_services.plan_cancel(plan_id=failed.plan_id, actor=maintainer)
    page = client.get(failed.get_absolute_url()).content.decode()
    assert "run-action-rerun" not in page and "run-action-retry" not in page
    refused = client.post(f"/runs/{failed.pk}/rerun/")
    assert refused.status_code == 409
    assert "its plan was cancelled" in refused.content.decode()
    assert Run.objects.filter(plan_id=failed.plan_id).count() == 2


def test_cancel_rerun_and_retry_from_the_page_say_what_happened(
    client: Client, recipe: Any, maintainer: Any
) -> None:
    queued, ended = _two_runs(recipe)
    client.force_login(maintainer)
    response = client.post(f"/runs/{queued.pk}/cancel/", follow=True)
    assert Run.objects.get(pk=queued.pk).state == RunState.KILLED
    assert f"Run #{queued.pk} canceled before it started." in response.content.decode()
    assert RunEvent.objects.filter(run=queued, verb="cancel_requested", door="web").exists()

    response = client.post(f"/runs/{queued.pk}/retry/")
    again = Run.objects.get(entry=queued.entry, sequence=queued.sequence + 1)
    assert response.status_code == 302 and response["Location"] == again.get_absolute_url()
    page = client.get(again.get_absolute_url()).content.decode()
    assert f"Run #{again.pk} queued: a retry of run #{queued.pk}." in page
    assert again.state == RunState.QUEUED

    run_writes.run_transition(run_id=ended.pk, to_state=RunState.RUNNING, door="worker")
    run_writes.run_transition(run_id=ended.pk, to_state=RunState.FINISHED, door="worker")
    refused = client.post(f"/runs/{ended.pk}/retry/")  # a finished run is rerun, not retried
    assert refused.status_code == 409
    assert "finished" in refused.content.decode()
    response = client.post(f"/runs/{ended.pk}/rerun/", follow=True)
    rerun = Run.objects.get(entry=ended.entry, sequence=ended.sequence + 1)
    assert f"Run #{rerun.pk} queued: a rerun of run #{ended.pk}." in response.content.decode()
    old_page = client.get(ended.get_absolute_url()).content.decode()
    assert f'href="/runs/{rerun.pk}/"' in old_page and "/rerun/" not in old_page


def test_run_actions_are_refused_to_others_and_need_post(
    client: Client, recipe: Any, contributor: Any
) -> None:
    queued, _ended = _two_runs(recipe)
    assert client.post(f"/runs/{queued.pk}/cancel/").status_code == 302  # to the sign-in page
    client.force_login(contributor)
    refused = client.post(f"/runs/{queued.pk}/cancel/")
    assert refused.status_code == 403
    assert "permission to cancel this run" in refused.content.decode()
    assert Run.objects.get(pk=queued.pk).state == RunState.QUEUED
    assert client.get(f"/runs/{queued.pk}/cancel/").status_code == 405
    assert client.post(f"/runs/{queued.pk}/explode/").status_code == 404


def test_run_page_links_back_charts_its_metrics_and_tails_its_log_live(
    client: Client, recipe: Any, contributor: Any
) -> None:
    from proposals.models import State
    from runs.metrics import ingest
    from runs.metrics.parse import PointBatch
    from runs.series import rollup
    from tests.factories import ProposalFactory

    plan = launched_plan(recipe)
    proposal = ProposalFactory.create(
        recipe=recipe, state=State.APPROVED, plan=plan, author=contributor, title="Linked"
    )
    run = Run.objects.filter(plan=plan).order_by("pk").first()
    assert run is not None
    run_writes.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door="worker")
    Run.objects.filter(pk=run.pk).update(external_id="job-1")
    batch = PointBatch(
        keys=["train/loss"] * 3, steps=[0, 1, 2], values=[3.0, 2.5, 2.0], times=[None] * 3
    )
    ingest.metrics_ingest(run=Run.objects.get(pk=run.pk), batch=batch)
    rollup.series_refresh(run_id=run.pk)

    page = client.get(run.get_absolute_url()).content.decode()
    crumbs = page.split('id="run-crumbs"')[1].split("</p>")[0]
    assert f'href="/proposals/{proposal.pk}/"' in crumbs
    assert f'href="/proposals/{proposal.pk}/#results"' in crumbs
    assert client.get(f"/proposals/{proposal.pk}/").status_code == 200
    assert f'data-series-url="/api/v1/runs/series/?ids={run.pk}&amp;keys=train/loss' in page
    assert 'data-chart-key="train/loss"' in page and "/static/js/results.js" in page
    assert f'data-log-url="/api/v1/runs/{run.pk}/logs/"' in page
    assert 'id="run-log"' in page and 'data-live="true"' in page.split('id="run-log"')[1][:300]
    assert "/static/js/run_log.js" in page
    assert client.get(f"/api/v1/runs/{run.pk}/logs/").status_code == 200

    run_writes.run_transition(run_id=run.pk, to_state=RunState.FINISHED, door="worker")
    done = client.get(run.get_absolute_url()).content.decode()
    assert 'data-live="false"' in done.split('id="run-log"')[1][:300]


def test_a_recipe_page_shows_its_command_and_how_it_is_launched(
    client: Client, recipe: Any
) -> None:
    from runs.services.recipes import recipe_update

    recipe_update(
        recipe=recipe,
        data={
            "command_template": ["{python}", "-m", "launch", "--run"],
            "launch": {"trainings": "plan", "dry_run": {"drop": ["--run"]}},
            "resources": {"tpu": "v5p-8", "preemptible": True},
        },
    )
    page = client.get(recipe.get_absolute_url()).content.decode()
    assert "{python} -m launch --run" in page
    assert "<code>trainings: plan</code>" in page
    assert "<code>tpu: v5p-8</code>, <code>preemptible: True</code>" in page
