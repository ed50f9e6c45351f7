"""A maintainer records that an experiment did not work; anyone finds it on the archive of
what did not work and by searching ``outcome:did_not_work``."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Page, expect

from proposals.models import Proposal, State
from tests.browser.conftest import BrowserSession, sign_in
from tests.factories import ProposalFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

FAILED_TITLE = "Eight experts instead of four"
WORKED_TITLE = "Capacity factor 1.25 at the small scale"
CONCLUSION = "No difference beyond seed noise; the router collapsed onto 3 experts."


def proposal_links(page: Page, proposal: Proposal) -> Any:
    return page.locator(f'main a[href="{proposal.get_absolute_url()}"]')


def test_did_not_work_outcome_is_on_the_archive_and_found_by_search(
    browser_session: BrowserSession, page: Page, recipe: Any, contributor: Any, maintainer: Any
) -> None:
    failed = ProposalFactory.create(
        author=contributor, recipe=recipe, title=FAILED_TITLE, state=State.APPROVED
    )
    worked = ProposalFactory.create(
        author=contributor,
        recipe=recipe,
        title=WORKED_TITLE,
        state=State.APPROVED,
        outcome="worked",
        confidence="replicated",
    )

    sign_in(page, "max")
    page.goto(failed.get_absolute_url())
    outcome = page.locator(".outcome-section")
    outcome.locator("select[name=outcome]").select_option("did_not_work")
    outcome.locator("select[name=confidence]").select_option("replicated")
    outcome.locator("textarea[name=conclusion]").fill(CONCLUSION)
    outcome.get_by_role("button", name="Record outcome").click()
    expect(page.locator(".messages")).to_contain_text("Outcome recorded.")
    expect(page.locator(".proposal-head .badge.outcome-did_not_work")).to_have_text("Did not work")
    expect(page.locator(".outcome-section .prose")).to_contain_text(CONCLUSION)
    failed.refresh_from_db()
    assert failed.outcome == "did_not_work"
    assert failed.concluded_at is not None

    # A visitor without an account finds it on the archive ...
    visitor = browser_session.new_page()
    response = visitor.goto("/archive/")
    assert response is not None and response.status == 200, (
        f"/archive/ answered {response and response.status}"
    )
    expect(proposal_links(visitor, failed).first).to_be_visible()
    proposal_links(visitor, failed).first.click()
    expect(visitor.locator("h1")).to_have_text(FAILED_TITLE)

    # ... and by searching for the outcome, which leaves out what worked.
    response = visitor.goto("/search/?q=outcome:did_not_work")
    assert response is not None and response.status == 200, (
        f"/search/ answered {response and response.status}"
    )
    expect(proposal_links(visitor, failed).first).to_be_visible()
    expect(proposal_links(visitor, worked)).to_have_count(0)
