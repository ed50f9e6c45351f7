"""A contributor proposes an experiment through the form, previews its plan, submits it,
and everyone sees it in the list."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from proposals.models import Proposal, State
from tests.browser.conftest import BrowserSession, sign_in
from tests.factories import WALKTHROUGH_SPEC

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

TITLE = "Higher capacity factor lowers the drop fraction"


def fill_proposal_form(page: Page, *, title: str, description: str, hypothesis: str) -> None:
    page.fill("#id_title", title)
    page.fill("#id_summary", "Capacity factor 1.25 vs 1.0, with and without weight decay.")
    page.fill("#id_description", description)
    page.fill("#id_hypothesis", hypothesis)
    page.fill("#id_success_metric", "eval/loss")
    page.select_option("#id_success_direction", "lower")
    page.fill("#id_success_threshold", "0.01")
    page.select_option("#id_recipe", label="tiny-moe v1")
    page.fill("#id_baseline", "steps: 20\nwidth: 32")
    page.fill("#id_ablation_spec", WALKTHROUGH_SPEC)
    page.fill("#id_budget_accelerator_hours", "10")
    page.fill("#id_labels", "moe, capacity")


def test_contributor_submits_a_proposal_and_it_is_listed(
    browser_session: BrowserSession, page: Page, recipe: Any, contributor: Any
) -> None:
    sign_in(page, "carla")
    page.goto("/")
    page.get_by_role("link", name="Propose an experiment").first.click()
    expect(page.get_by_role("heading", name="Propose an experiment")).to_be_visible()
    fill_proposal_form(
        page,
        title=TITLE,
        description="We vary the **capacity factor** of the router.",
        hypothesis="A higher capacity factor lowers the drop fraction without hurting eval loss.",
    )

    page.get_by_role("button", name="Preview").click()
    preview = page.locator("#preview")
    expect(preview).to_be_visible()
    expect(preview.locator(".prose strong")).to_have_text("capacity factor")
    # The walkthrough's plan: 2 x 2 grid at one scale and one seed, 4 runs.
    expect(preview.locator(".plan-summary div", has_text="Runs").locator("dd")).to_have_text("4")
    expect(preview.locator(".plan-table tbody tr")).to_have_count(4)
    assert page.input_value("#id_title") == TITLE  # the form keeps what was typed

    page.get_by_role("button", name="Submit for review").click()
    expect(page).to_have_url(re.compile(r"/proposals/\d+/$"))
    expect(page.locator(".messages")).to_contain_text("Proposal submitted for review.")
    expect(page.locator("h1")).to_have_text(TITLE)
    expect(page.locator(".proposal-head .badge.state-submitted")).to_be_visible()
    proposal = Proposal.objects.get(title=TITLE)
    assert proposal.state == State.SUBMITTED
    assert proposal.author == contributor
    assert proposal.baseline == {"steps": 20, "width": 32}
    assert sorted(label.name for label in proposal.labels.all()) == ["capacity", "moe"]

    # Listed for a visitor without an account, linking to the proposal's page.
    visitor = browser_session.new_page()
    visitor.goto("/")
    link = visitor.get_by_role("link", name=TITLE)
    expect(link).to_have_attribute("href", proposal.get_absolute_url())
    link.click()
    expect(visitor.locator("h1")).to_have_text(TITLE)
