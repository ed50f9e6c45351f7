"""A maintainer signs in, approves, and watches the tiny recipe's runs train on the page.

The page is never reloaded after the approval: the run table (rows carry ``data-run-state``)
and the charts (containers carry ``data-chart-key``, and ``data-drawn="true"`` once their
lines are drawn) update by themselves. A screenshot of the finished page is kept under
var/artifacts/.
"""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Page, expect

from proposals.models import Proposal, State
from proposals.services import proposal_transition
from runs.models import Run, RunState
from tests.browser.conftest import artifact_path, sign_in
from tests.factories import ProposalFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Three points. `local` starts with no free slot, so all three wait in the queue until the
# page has shown them waiting, however fast this machine trains; then one at a time.
SPEC = "axes:\n  capacity_factor: [1.0, 1.5, 2.0]\n"
BASELINE = {"steps": 150, "width": 32}
RUN_COUNT = 3

WATCH_STATES = """() => {
  window.__seenRunStates = new Set();
  const record = () => document.querySelectorAll('[data-run-state]')
    .forEach((row) => window.__seenRunStates.add(row.dataset.runState));
  record();
  new MutationObserver(record).observe(document.documentElement, {
    subtree: true, childList: true, attributes: true, attributeFilter: ['data-run-state'],
  });
  window.__sameDocument = 'still here';
}"""

ALL_QUEUED = """(count) => {
  const rows = [...document.querySelectorAll('[data-run-state]')];
  return rows.length === count && rows.every((row) => row.dataset.runState === 'queued');
}"""

ALL_FINISHED = """(count) => {
  const rows = [...document.querySelectorAll('[data-run-state]')];
  return rows.length === count && rows.every((row) => row.dataset.runState === 'finished');
}"""

# A drawn chart has painted pixels on its canvas (uPlot) or paths in its SVG.
CHART_PAINT = """(chart) => {
  const canvases = [...chart.querySelectorAll('canvas')];
  const painted = canvases.some((canvas) => {
    const ctx = canvas.getContext('2d');
    if (!ctx || !canvas.width || !canvas.height) return false;
    const data = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
    for (let i = 3; i < data.length; i += 4) if (data[i] !== 0) return true;
    return false;
  });
  return painted || chart.querySelectorAll('svg path').length > 0;
}"""


@pytest.fixture
def submitted(recipe: Any, contributor: Any) -> Proposal:
    proposal = ProposalFactory.create(
        author=contributor,
        recipe=recipe,
        title="Capacity factor on the tiny MoE, watched live",
        baseline=BASELINE,
        ablation_spec=SPEC,
    )
    proposal_transition(proposal_id=proposal.pk, action="submit", actor=contributor)
    return proposal


def test_maintainer_approves_and_watches_runs_finish_without_reloading(
    page: Page,
    runs_worker: None,
    settings: Any,
    submitted: Proposal,
    maintainer: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings.RUNS_EXECUTOR_MAX_CONCURRENT = {"local": 0, "ray": 0}  # opened below
    sign_in(page, "max")
    page.goto(submitted.get_absolute_url())
    expect(page.locator(".proposal-head .badge.state-submitted")).to_be_visible()
    page.locator("form.action-approve").get_by_role("button", name="Approve").click()
    expect(page.locator(".messages")).to_contain_text("Done: approve.")
    expect(page.locator(".proposal-head .badge.state-approved")).to_be_visible()
    assert Proposal.objects.get(pk=submitted.pk).state == State.APPROVED

    page.evaluate(WATCH_STATES)
    navigations: list[str] = []
    page.on(
        "framenavigated",
        lambda frame: navigations.append(frame.url) if frame == page.main_frame else None,
    )
    screenshot = artifact_path("proposal-finished-runs.png")
    try:
        page.wait_for_function(ALL_QUEUED, arg=RUN_COUNT, timeout=30_000, polling=200)
        expect(page.get_by_text("is at its limit of 0 concurrent runs").first).to_be_visible(
            timeout=15_000
        )
        settings.RUNS_EXECUTOR_MAX_CONCURRENT = {"local": 1, "ray": 1}  # beat dispatches
        try:
            page.wait_for_function(ALL_FINISHED, arg=RUN_COUNT, timeout=60_000, polling=200)
        except Exception:
            states = list(Run.objects.values_list("pk", "state", "state_reason"))
            shown = page.eval_on_selector_all(
                "[data-run-state]", "rows => rows.map(r => r.dataset.runState)"
            )
            raise AssertionError(
                f"the page did not show {RUN_COUNT} finished runs; it shows {shown}, "
                f"the database has {states}"
            ) from None
        seen = set(page.evaluate("[...window.__seenRunStates]"))
        assert RunState.QUEUED in seen, f"never saw a queued run on the page, only {seen}"
        assert page.evaluate("window.__sameDocument") == "still here", "the page was reloaded"
        assert navigations == [], f"the page navigated: {navigations}"
        assert set(Run.objects.values_list("state", flat=True)) == {RunState.FINISHED}

        drawn = page.locator('[data-chart-key][data-drawn="true"]')
        expect(drawn.first).to_be_attached(timeout=30_000)
        keys = set(
            page.eval_on_selector_all(
                '[data-chart-key][data-drawn="true"]',
                "charts => charts.map(c => c.dataset.chartKey)",
            )
        )
        assert "train/loss" in keys, f"no drawn train/loss chart; drawn: {sorted(keys)}"
        train_loss = page.locator('[data-chart-key="train/loss"][data-drawn="true"]').first
        train_loss.scroll_into_view_if_needed()
        assert train_loss.evaluate(CHART_PAINT), "the train/loss chart has nothing painted"
        assert page.evaluate("window.__sameDocument") == "still here", "the page was reloaded"
    finally:
        page.screenshot(path=str(screenshot), full_page=True)
        with capsys.disabled():
            print(f"\nscreenshot of the proposal page: {screenshot}")  # noqa: T201 (the artifact, for whoever ran the tests)
