"""The campaign page draws its stitched charts with the interventions and restarts on them,
and updates by itself as the running attempt reports: no reload, no CSP refusal, nothing
fetched from outside the site (the browser conftest checks the last two)."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Page, expect

from runs.campaigns import services
from runs.campaigns.models import Campaign
from runs.models import Run
from tests.browser.conftest import artifact_path
from tests.runs.campaigns.campaign_helpers import THREE_POINT_SPEC, feed, start, tokens
from tests.runs.runs_helpers import launched_plan

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

KEYS = ("train/loss", "throughput/mfu")


def telemetry(offset: float) -> dict[str, Any]:
    return {
        "train/loss": lambda s: offset + 5.0 / (1 + s / 50),
        "throughput/mfu": lambda s: 21.0 if s < 150 else 27.0,  # percent, as Levanter logs it
        "throughput/total_tokens": tokens,
        "throughput/tokens_per_second": lambda s: 4e4,
        "mixture/weight/web": lambda s: 0.6 if s < 200 else 0.5,
        "mixture/weight/code": lambda s: 0.4 if s < 200 else 0.5,
    }


@pytest.fixture
def campaign(recipe: Any, maintainer: Any) -> tuple[Campaign, Run, str]:
    campaign = services.campaign_create(
        actor=maintainer,
        data={"slug": "live", "name": "Live run", "target_tokens": 1e6, "target_flops": 6e15},
    )
    first, second, _ = Run.objects.filter(plan=launched_plan(recipe, THREE_POINT_SPEC)).order_by(
        "pk"
    )
    for run in (first, second):
        services.campaign_run_add(campaign=campaign, run=run, actor=maintainer)
    feed(first, start(first), range(120), telemetry(1.0))
    token = start(second)
    feed(second, token, range(100, 220), telemetry(1.0))  # a restart from step 100
    services.intervention_record(
        campaign=campaign,
        actor=maintainer,
        step=150,
        kind="kernel",
        title="New kernels",
        keys=["throughput/mfu"],
        window_steps=40,
    )
    return campaign, second, token


def test_campaign_page_updates_live_with_annotations(
    page: Page, campaign: tuple[Campaign, Run, str]
) -> None:
    _, running, token = campaign
    response = page.goto("/campaigns/live/")
    assert response is not None and response.ok
    page.evaluate("() => { window.__sameDocument = 'still here'; }")
    for key in KEYS:
        figure = page.locator(f"figure[data-chart-key='{key}']")
        expect(figure).to_have_attribute("data-drawn", "true")
        expect(figure.locator(".annotation-intervention")).to_have_count(1)
        expect(figure.locator(".annotation-restart")).to_have_count(1)
    expect(page.locator("figure[data-chart-kind='mixture']")).to_have_attribute(
        "data-drawn", "true"
    )
    expect(page.locator(".effect-text")).to_have_text("21.0% → 27.0%")
    loss = page.locator("figure[data-chart-key='train/loss']")
    expect(loss).to_have_attribute("data-points", "220")
    expect(page.locator("#progress-step")).to_have_text("219")

    feed(running, token, range(220, 320), telemetry(1.0))  # the attempt reports on

    expect(loss).to_have_attribute("data-points", "320", timeout=20_000)
    expect(page.locator("#progress-step")).to_have_text("319")
    expect(page.locator("#progress-tokens-text")).to_contain_text("319k")
    assert page.evaluate("() => window.__sameDocument") == "still here"
    # The labels move with the scale: the intervention at 150k tokens of 0-319k.
    where = loss.locator(".annotation-intervention").evaluate(
        "(tag) => parseFloat(tag.style.left) / tag.closest('.u-over').clientWidth"
    )
    assert where == pytest.approx(150 / 319, abs=0.03)
    page.screenshot(path=str(artifact_path("campaign-live.png")), full_page=True)
