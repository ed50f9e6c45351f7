"""The board in Chromium: the Pareto chart drawn by uPlot from /board/chart.json (its points
and frontier counted, its axes titled), the table's provenance labels, at a laptop's and a
phone's width, with no console error (the page's CSP allows only its own scripts)."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Page

from runs.board.rank import track_rank
from runs.models import RunOrigin
from tests.browser.conftest import artifact_path
from tests.runs.board.board_helpers import finish, four_runs, track

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_pareto_chart_is_drawn_with_its_frontier(page: Page, recipe: Any) -> None:
    a, b, c, d = four_runs(recipe)
    finish(a, bpb=1.2, flops=1e18)
    finish(b, bpb=1.25, flops=2e18, origin=RunOrigin.IMPORTED, git_sha="")  # off the frontier
    finish(c, bpb=1.1, flops=3e18)
    finish(d, bpb=1.29, flops=5e17, origin=RunOrigin.IMPORTED, git_sha="")
    track_rank(track())
    for width in (1280, 390):
        page.set_viewport_size({"width": width, "height": 900})
        response = page.goto("/board/")
        assert response is not None and response.ok
        figure = page.locator('figure[data-chart-kind="pareto"]')
        page.wait_for_function(
            "() => document.querySelector('figure[data-chart-kind=pareto]').dataset.drawn === 'true'",
            timeout=15_000,
        )
        assert figure.get_attribute("data-points") == "4"
        assert figure.get_attribute("data-frontier") == "3"  # 5e17, 1e18, 3e18; not b
        assert figure.locator("canvas").count() == 1
        assert "training FLOPs" in figure.locator(".axis-title-x").inner_text()
        assert "c4_en/bpb" in figure.locator(".axis-title-y").inner_text()
        assert (figure.get_attribute("data-x-ticks") or "") != ""
        labels = page.locator("table.board .badge").all_inner_texts()
        assert labels == ["unverified", "verified", "unverified", "verified"]
        scroll = page.evaluate("document.documentElement.scrollWidth")
        assert scroll <= width + 1, f"the board scrolls sideways at {width}px"
        page.screenshot(path=artifact_path(f"pages/board-{width}.png"), full_page=True)
