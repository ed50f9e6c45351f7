"""The proposal page follows its runs without a reload: the outcome panel, the results and
the actions change with the run table beside them (one poll, ``proposals/live.py``), and the
poll stops once nothing can change. Claiming a run lands on the run's page with its token
and the exact command to use it, once.

No worker runs here: the test moves the runs itself (expansion, states, metrics), as a
worker would, and watches the page.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from playwright.sync_api import Request, expect

from proposals.models import Proposal
from proposals.services import proposal_transition
from runs.metrics import ingest
from runs.metrics.parse import PointBatch
from runs.models import Run, RunState
from runs.results import summary as results
from runs.series import rollup
from runs.services import dispatch
from runs.services import runs as run_writes
from tests.browser.conftest import BrowserSession, artifact_path, sign_in
from tests.factories import ProposalFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SPEC = "axes:\n  capacity_factor: [1.0, 1.5]\n"
POLL_SECONDS = 3.0


@pytest.fixture
def approved(recipe: Any, contributor: Any, maintainer: Any) -> Proposal:
    """Approved by a maintainer; its runs not created yet (no worker expands the plan)."""
    proposal = ProposalFactory.create(
        author=contributor,
        recipe=recipe,
        title="Capacity factor, followed live",
        baseline={"steps": 20, "width": 32},
        ablation_spec=SPEC,
        success_metric="eval/loss",
        success_direction="lower",
        success_threshold=0.01,
    )
    proposal_transition(proposal_id=proposal.pk, action="submit", actor=contributor)
    proposal_transition(proposal_id=proposal.pk, action="approve", actor=maintainer)
    return Proposal.objects.get(pk=proposal.pk)


def _plan_id(proposal: Proposal) -> int:
    assert proposal.plan_id is not None
    return proposal.plan_id


def _finish(run: Run, loss: float) -> None:
    run_writes.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door="worker")
    keys = ["eval/loss"] * 3 + ["throughput/mfu"] * 3
    batch = PointBatch(
        keys, [0, 10, 20] * 2, [loss + 1, loss + 0.5, loss, 20.0, 21.0, 21.5], [None] * 6
    )
    ingest.metrics_ingest(run=Run.objects.get(pk=run.pk), batch=batch)
    rollup.series_refresh(run_id=run.pk)
    run_writes.run_transition(run_id=run.pk, to_state=RunState.FINISHED, door="worker")


def test_the_outcome_panel_follows_the_runs_and_the_poll_stops_when_they_end(
    browser_session: BrowserSession, approved: Proposal
) -> None:
    page = browser_session.new_page()
    sign_in(page, "max")
    polls: list[tuple[float, str]] = []

    def on_request(request: Request) -> None:
        if request.resource_type in {"fetch", "xhr"}:
            polls.append((time.monotonic(), request.url))

    page.goto(approved.get_absolute_url())
    outcome = page.locator('[data-live-slot="outcome"]')
    expect(outcome).to_contain_text("the plan's runs are not created yet")
    page.on("request", on_request)
    navigations: list[str] = []
    page.on("framenavigated", lambda frame: navigations.append(frame.url))
    started = time.monotonic()

    dispatch.plan_expand(plan_id=_plan_id(approved))  # what the worker would do
    expect(page.locator("[data-run-state]")).to_have_count(2, timeout=15_000)
    expect(outcome).to_contain_text("2 of 2 runs not terminal yet", timeout=15_000)
    expect(outcome).not_to_contain_text("not created yet")

    runs = list(Run.objects.filter(plan_id=_plan_id(approved)).order_by("pk"))
    for run, loss in zip(runs, (3.0, 2.9), strict=True):
        _finish(run, loss)
    assert results.plan_check_finished(plan_id=_plan_id(approved))  # the summary, as on a worker

    expect(page.locator("#suggested-verdict")).to_contain_text("Worked", timeout=15_000)
    expect(outcome).not_to_contain_text("not terminal")
    expect(outcome.locator("summary")).to_have_text("Record the outcome")
    expect(page.locator("#results")).to_have_attribute("data-live", "false", timeout=15_000)
    ended = time.monotonic()
    page.wait_for_timeout(2.5 * POLL_SECONDS * 1000)  # the poll has stopped
    page.screenshot(path=artifact_path("proposal-live-panels.png"), full_page=True)
    assert navigations == []  # never reloaded

    live = [t for t, url in polls if "/live/" in url]
    assert live, "the page never asked for its panels"
    assert not [t for t in live if t > ended + 1.0], "the poll went on after everything ended"
    # One answer brings the table and the panels: at most one such request a poll interval.
    assert len(live) <= (ended - started) / POLL_SECONDS + 2, (len(live), ended - started)
    others = {re.sub(r"\?.*", "", url) for _, url in polls if "/live/" not in url}
    assert all("/series/" in url for url in others), others  # and the charts' data, as before


def test_claiming_a_run_lands_on_its_page_with_the_token_and_command_once(
    browser_session: BrowserSession, approved: Proposal
) -> None:
    dispatch.plan_expand(plan_id=_plan_id(approved))
    run = Run.objects.filter(plan_id=_plan_id(approved)).order_by("pk").first()
    assert run is not None and run.state == RunState.QUEUED
    page = browser_session.new_page()
    sign_in(page, "max")
    page.goto(f"/runs/{run.pk}/")
    page.fill("#claim-where", "our lab, 8×A100")
    page.get_by_role("button", name=f"Claim run #{run.pk}").click()

    expect(page.locator("#claim-heading")).to_have_text("You claimed this run")
    assert re.search(rf"/runs/{run.pk}/claim/$", page.url), page.url  # a page, not the API
    token = page.locator("#run-token").inner_text().strip()
    assert len(token) > 20
    command = page.locator("#claim-heading ~ pre").first.inner_text()
    assert f"RUN_TOKEN={token}" in command and f"RUN_ID={run.pk}" in command
    assert Run.objects.get(pk=run.pk).state == RunState.RUNNING

    page.goto(f"/runs/{run.pk}/")
    expect(page.locator("#run-state")).to_have_text("running")
    assert token not in page.content()  # shown once
