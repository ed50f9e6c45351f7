"""The results pages at a laptop's size, and what they keep between pages.

At 1366x768 the run table of a plan whose runs reported every metric the tiny recipe declares
fits without horizontal scrolling, the sidebar giving way; other columns come on demand.
Runs ticked for comparison stay ticked across proposal pages until cleared, and the compare
chart can set the line style by a second axis.
"""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from proposals.models import Proposal, State
from runs.metrics import ingest
from runs.metrics.parse import PointBatch
from runs.models import Plan, Run, RunState
from runs.series import charts as series_charts
from runs.series import rollup
from runs.services import runs as run_writes
from tests.browser.conftest import BrowserSession, sign_in
from tests.factories import ProposalFactory
from tests.runs.runs_helpers import launched_plan

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Two axes, so the compare chart has something to colour by and something to dash by.
SPEC = "axes:\n  capacity_factor: [1.0, 1.5]\n  weight_decay: [0.0, 0.1]\n"
DECLARED = {  # every column the tiny recipe declares, with values of realistic width
    "train/loss": [4.1, 3.6, 3.2123],
    "eval/loss": [4.0, 3.55, 3.3456],
    "throughput/tokens_per_second": [125_000.0, 130_500.0, 131_234.5],
    "throughput/mfu": [41.0, 43.0, 43.21],  # percent, as Levanter logs it
    "moe/drop_fraction": [0.12, 0.08, 0.0654],
}


def _finished_plan(recipe: Any, contributor: Any, title: str) -> tuple[Proposal, Plan]:
    plan = launched_plan(recipe, SPEC)
    proposal = ProposalFactory.create(
        author=contributor, recipe=recipe, state=State.APPROVED, plan=plan, title=title
    )
    for index, run in enumerate(Run.objects.filter(plan=plan).order_by("pk")):
        if run.state != RunState.QUEUED:
            continue  # a cached copy of a run an earlier plan finished
        run_writes.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door="worker")
        for key, values in DECLARED.items():
            bumped = [v * (1 + 0.01 * index) for v in values]
            batch = PointBatch(
                keys=[key] * len(bumped),
                steps=[10 * i for i in range(len(bumped))],
                values=bumped,
                times=[None] * len(bumped),
            )
            ingest.metrics_ingest(run=Run.objects.get(pk=run.pk), batch=batch)
        rollup.series_refresh(run_id=run.pk)
        Run.objects.filter(pk=run.pk).update(
            final_metrics={"run_seconds": 12.5 + index}, external_id=f"job-{run.pk}"
        )
        run_writes.run_transition(run_id=run.pk, to_state=RunState.FINISHED, door="worker")
    return proposal, plan


def _laptop_page(browser_session: BrowserSession, browser: Browser) -> Page:
    page = browser_session.new_page()
    page.set_viewport_size({"width": 1366, "height": 768})
    return page


FITS = """() => {
  const wrap = document.querySelector('#run-table .table-wrap');
  const root = document.scrollingElement;
  return {
    table: [wrap.scrollWidth, wrap.clientWidth],
    page: [root.scrollWidth, root.clientWidth],
  };
}"""


def test_run_table_fits_a_1366_pixel_screen_with_its_default_columns(
    browser_session: BrowserSession,
    chromium: Browser,
    recipe: Any,
    contributor: Any,
    maintainer: Any,
) -> None:
    proposal, _plan = _finished_plan(recipe, contributor, "Capacity factor and weight decay")
    page = _laptop_page(browser_session, chromium)
    sign_in(page, "max")  # a maintainer's page has the most in its sidebar
    page.goto(proposal.get_absolute_url())
    table = page.locator("#runs-table")
    expect(table).to_be_visible()
    headers = page.eval_on_selector_all(
        "#runs-table thead th", "cells => cells.map(c => c.textContent.trim())"
    )
    for label in ("Train loss", "Eval loss", "Throughput", "MFU", "Dropped tokens"):
        assert any(h.startswith(label) for h in headers), f"no {label} column in {headers}"
    assert not any(h.startswith(("Attempt", "Executor", "Run time")) for h in headers)

    sizes = page.evaluate(FITS)
    assert sizes["table"][0] <= sizes["table"][1], f"the run table scrolls sideways: {sizes}"
    assert sizes["page"][0] <= sizes["page"][1], f"the page scrolls sideways: {sizes}"
    # The sidebar gave way: the actions are below the results, reachable from the top.
    side = page.locator(".proposal-side").bounding_box()
    results = page.locator("#results").bounding_box()
    assert side is not None and results is not None
    assert side["y"] > results["y"], "the sidebar still sits beside the results"
    expect(page.locator(".head-links a[href='#actions-heading']")).to_be_visible()

    # Other columns on demand: the picker adds them without a reload.
    page.locator("#column-picker summary").click()
    page.locator("#column-picker input[value='run_seconds']").check()
    expect(page.locator("#runs-table td[data-metric-key='run_seconds']").first).to_be_visible()
    assert "columns=run_seconds" in page.url


ROW_IDS = "rows => rows.map(r => r.dataset.runId)"


def test_ticked_runs_persist_across_proposals_and_compare_dashes_by_a_second_axis(
    browser_session: BrowserSession, chromium: Browser, recipe: Any, contributor: Any
) -> None:
    first, first_plan = _finished_plan(recipe, contributor, "Routing, first try")
    second, _second_plan = _finished_plan(recipe, contributor, "Routing, second try")
    page = _laptop_page(browser_session, chromium)
    page.goto(first.get_absolute_url())
    expect(page.locator("#compare-picked")).to_be_hidden()
    for box in page.locator("#runs-table input[name=ids]").all():
        box.check()
    first_ids = sorted(Run.objects.filter(plan=first_plan).values_list("pk", flat=True))
    expect(page.locator("#compare-picked-count")).to_have_text(str(len(first_ids)))

    page.goto(second.get_absolute_url())  # another proposal: the picks came along
    expect(page.locator("#compare-picked")).to_be_visible()
    expect(page.locator("#compare-picked-count")).to_have_text(str(len(first_ids)))
    for box in page.locator("#runs-table input[name=ids]").all():
        box.check()
    every = sorted(Run.objects.values_list("pk", flat=True))
    expect(page.locator("#compare-picked-count")).to_have_text(str(len(every)))
    page.get_by_role("button", name="Compare the selected runs").click()
    page.wait_for_url("**/runs/compare/**")
    shown = sorted(
        int(i)
        for i in page.eval_on_selector_all(
            "[data-run-id]", "rows => [...new Set(rows.map(r => r.dataset.runId))]"
        )
    )
    assert shown == every, f"the compare page shows {shown}, not every picked run {every}"

    chart = page.locator('[data-chart-key="eval/loss"]')
    expect(chart).to_have_attribute("data-drawn", "true", timeout=30_000)
    page.select_option("#chart-colour", "capacity_factor")
    page.select_option("#chart-dash", "weight_decay")
    expect(chart).to_have_attribute("data-line-styles", "2")
    expect(page.locator("#chart-legend .legend-dash")).to_have_count(2)
    expect(page.locator("#chart-legend .legend-dash").first).to_contain_text("weight_decay = 0")
    page.select_option("#chart-dash", "")
    expect(chart).to_have_attribute("data-line-styles", "1")

    page.goto(first.get_absolute_url())  # still picked until cleared
    expect(page.locator("#compare-picked-count")).to_have_text(str(len(every)))
    page.locator("#compare-clear").click()
    expect(page.locator("#compare-picked")).to_be_hidden()
    assert page.locator("#runs-table input[name=ids]:checked").count() == 0
    page.goto(second.get_absolute_url())
    expect(page.locator("#compare-picked")).to_be_hidden()


def test_a_chart_whose_key_has_no_points_yet_says_so_instead_of_drawing(
    browser_session: BrowserSession,
    chromium: Browser,
    recipe: Any,
    contributor: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run has logged train/loss, but the chart rollup has not caught up (the worker's
    refresh is pending, and the read rolls up nothing itself: more series are stale than a
    read refreshes): the chart says "No points yet." instead of drawing empty axes."""
    monkeypatch.setattr(series_charts, "FRESH_ON_READ_MAX", 0)
    plan = launched_plan(recipe, SPEC)
    proposal = ProposalFactory.create(
        author=contributor, recipe=recipe, state=State.APPROVED, plan=plan, title="Catching up"
    )
    run = Run.objects.filter(plan=plan).order_by("pk").first()
    assert run is not None
    run_writes.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door="worker")
    batch = PointBatch(keys=["train/loss"] * 2, steps=[0, 10], values=[4.0, 3.5], times=[None] * 2)
    ingest.metrics_ingest(run=Run.objects.get(pk=run.pk), batch=batch)  # no series refresh
    page = _laptop_page(browser_session, chromium)
    page.goto(proposal.get_absolute_url())
    chart = page.locator('[data-chart-key="train/loss"]')
    expect(chart.locator(".chart-empty-note")).to_have_text("No points yet.", timeout=15_000)
    assert chart.get_attribute("data-drawn") == "false"
    assert chart.locator("canvas").count() == 0
