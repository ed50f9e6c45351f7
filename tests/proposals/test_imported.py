"""Imported old issues on the site: quiet until adopted, and their outcomes recorded as found
(no plan, no approval), concluded like any other in the archive, search, feeds and exports."""

from __future__ import annotations

import json
from typing import Any

import pytest

from marin_site.events import Verb
from proposals import services
from proposals.actions import allowed_actions
from proposals.models import GitHubOutbox, OutboxOperation, Proposal, State
from tests.factories import ProposalFactory
from tests.proposals.github_support import drain, fake_github, github_on

pytestmark = pytest.mark.django_db
__all__ = ["fake_github", "github_on"]


@pytest.fixture
def imported(github_on: Any, contributor: Any, recipe: Any) -> Proposal:
    issue = github_on.add_issue(
        title="Old MoE run", body="## Description\n\nold", labels=["experiment"]
    )
    return ProposalFactory.create(
        author=contributor,
        recipe=recipe,
        title="Old MoE run: sigmoid routing",
        state=State.IMPORTED,
        github_issue_number=issue["number"],
    )


def test_an_imported_proposal_offers_adopt_and_outcome_not_review(
    imported: Proposal, maintainer: Any, contributor: Any
) -> None:
    names = [a.name for a in allowed_actions(imported, maintainer)]
    assert "adopt" in names and "record_outcome" in names
    assert not {"approve", "submit", "reject", "review"} & set(names)
    assert "adopt" not in [a.name for a in allowed_actions(imported, contributor)]


def test_nothing_is_written_to_github_until_a_maintainer_adopts(
    imported: Proposal, github_on: Any, maintainer: Any, api_as: Any, client: Any
) -> None:
    services.comment_create(proposal_id=imported.pk, author=maintainer, body="A site comment")
    services.proposal_hold(proposal_id=imported.pk, actor=maintainer, hold=True)
    assert not GitHubOutbox.objects.exists()
    client.force_login(maintainer)
    page = client.get(imported.get_absolute_url()).content.decode()
    assert f'action="/proposals/{imported.pk}/transition/adopt/"' in page
    response = api_as(maintainer).post(f"/api/v1/proposals/{imported.pk}/adopt/", {}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["state"] == State.DRAFT
    adopted = imported.events.get(verb=Verb.ADOPTED)
    assert adopted.actor == maintainer and (adopted.from_state, adopted.to_state) == (
        State.IMPORTED,
        State.DRAFT,
    )
    operations = sorted(GitHubOutbox.objects.values_list("operation", flat=True))
    assert operations == sorted(
        [OutboxOperation.BODY_SYNC, OutboxOperation.STATUS_SYNC, OutboxOperation.LABELS_SYNC]
    )
    drain()
    assert github_on.writes()  # synced like any other, from now on
    again = api_as(maintainer).post(f"/api/v1/proposals/{imported.pk}/adopt/", {}, format="json")
    assert again.status_code in {200, 409}
    assert GitHubOutbox.objects.count() == 3  # once


def test_a_contributor_cannot_adopt(imported: Proposal, contributor: Any, api_as: Any) -> None:
    response = api_as(contributor).post(
        f"/api/v1/proposals/{imported.pk}/adopt/", {}, format="json"
    )
    assert response.status_code == 403
    imported.refresh_from_db()
    assert imported.state == State.IMPORTED


def test_an_old_result_is_recorded_without_plan_or_approval(
    imported: Proposal, github_on: Any, maintainer: Any, api_as: Any, client: Any
) -> None:
    response = api_as(maintainer).post(
        f"/api/v1/proposals/{imported.pk}/outcome/",
        {
            "outcome": "did_not_work",
            "confidence": "replicated",
            "conclusion": "Sigmoid routing diverged at 1e19.",
            "results": "| loss | 3.31 vs 3.25 |",
            "wandb_url": "https://wandb.ai/marin/moe/reports/sigmoid",
        },
        format="json",
    )
    assert response.status_code == 200, response.content
    imported.refresh_from_db()
    assert (imported.outcome, imported.confidence, imported.state) == (
        "did_not_work",
        "replicated",
        State.IMPORTED,
    )
    assert imported.results == "| loss | 3.31 vs 3.25 |"
    assert imported.wandb_url == "https://wandb.ai/marin/moe/reports/sigmoid"
    assert imported.concluded_at is not None and imported.plan_id is None
    event = imported.events.get(verb=Verb.OUTCOME_RECORDED)
    assert event.actor == maintainer
    assert not GitHubOutbox.objects.exists()  # no outcome comment on the old issue
    # Concluded like any other: the archive (failed ones first-class), search, feeds, exports.
    assert "Old MoE run: sigmoid routing" in client.get("/archive/").content.decode()
    found = client.get("/search/", {"q": "outcome:did_not_work"}).content.decode()
    assert "Old MoE run: sigmoid routing" in found
    assert "Old MoE run: sigmoid routing" in client.get("/feeds/outcomes/").content.decode()
    exported: Any = client.get("/export/proposals.json", {"q": "state:imported"})
    rows = json.loads(b"".join(exported.streaming_content))
    assert [row["outcome"] for row in rows["results"]] == ["did_not_work"]


def test_the_page_form_records_key_figures_and_links(
    imported: Proposal, maintainer: Any, client: Any
) -> None:
    client.force_login(maintainer)
    page = client.get(imported.get_absolute_url()).content.decode()
    assert 'id="outcome-imported"' in page and 'name="results"' in page
    response = client.post(
        f"/proposals/{imported.pk}/outcome/",
        {
            "outcome": "worked",
            "confidence": "exploratory",
            "conclusion": "1.2x faster",
            "results": "wall clock 1.2x",
            "wandb_url": "not a url",
            "data_browser_url": "",
        },
    )
    assert response.status_code in {400, 200}
    imported.refresh_from_db()
    assert imported.outcome == ""  # refused: the W&B link is not a URL
    client.post(
        f"/proposals/{imported.pk}/outcome/",
        {
            "outcome": "worked",
            "confidence": "exploratory",
            "conclusion": "1.2x faster",
            "results": "wall clock 1.2x",
            "wandb_url": "",
            "data_browser_url": "",
        },
    )
    imported.refresh_from_db()
    assert (imported.outcome, imported.results) == ("worked", "wall clock 1.2x")


def test_recording_an_outcome_elsewhere_keeps_the_links(
    maintainer: Any, contributor: Any, recipe: Any
) -> None:
    proposal = ProposalFactory.create(
        author=contributor,
        recipe=recipe,
        state=State.CANCELED,
        wandb_url="https://wandb.ai/x",
        results="kept",
    )
    services.proposal_record_outcome(
        proposal_id=proposal.pk,
        actor=maintainer,
        outcome="inconclusive",
        conclusion="",
        confidence="exploratory",
    )
    proposal.refresh_from_db()
    assert (proposal.wandb_url, proposal.results) == ("https://wandb.ai/x", "kept")
