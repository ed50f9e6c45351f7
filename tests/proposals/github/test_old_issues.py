"""Webhooks on old issues are quiet: real payloads (tests/fixtures/github) and variants of
them (a closed old issue labelled, a bot sender) update the mirror and write nothing back."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from proposals.github.fake import FakeGitHub
from proposals.models import Comment, GitHubOutbox, Proposal, State, WebhookDelivery
from tests.factories import ProposalFactory
from tests.proposals.github_support import (
    WEBHOOKS,
    drain,
    fake_github,
    github_on,
    post_delivery,
    process_deliveries,
)

pytestmark = pytest.mark.django_db
__all__ = ["fake_github", "github_on"]


def real(event: str, name: str) -> dict[str, Any]:
    """A real payload, sent as if from the configured repository."""
    payload = json.loads((WEBHOOKS / event / name).read_bytes())
    payload["repository"]["full_name"] = "marin-community/marin"
    return payload


def experiment(payload: dict[str, Any]) -> dict[str, Any]:
    payload["issue"]["labels"] = [*payload["issue"]["labels"], {"name": "experiment"}]
    return payload


def deliver(client: Any, event: str, payload: dict[str, Any]) -> tuple[str, str]:
    post_delivery(client, event, payload)
    process_deliveries()
    delivery = WebhookDelivery.objects.order_by("-id").first()
    assert delivery is not None
    return delivery.outcome, delivery.detail


def now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_closed_old_issue_labelled_experiment_is_mirrored_not_drafted(
    github_on: FakeGitHub, client: Any, recipe: Any
) -> None:
    payload = experiment(real("issues", "labeled.json"))  # 2019's issue, labelled today
    payload["issue"].update(state="closed", closed_at="2020-01-01T00:00:00Z")
    payload["label"] = {"name": "experiment"}
    outcome, detail = deliver(client, "issues", payload)
    assert outcome == "applied", detail
    proposal = Proposal.objects.get(github_issue_number=payload["issue"]["number"])
    assert proposal.state == State.IMPORTED
    assert proposal.github_closed_at is not None
    assert not GitHubOutbox.objects.exists()
    drain()
    assert github_on.writes() == []


@pytest.mark.parametrize("name", ["edited.with-organization.json", "labeled.json"])
def test_an_old_open_issue_edited_or_labelled_is_mirrored(
    github_on: FakeGitHub, client: Any, recipe: Any, name: str
) -> None:
    payload = experiment(real("issues", name))
    outcome, detail = deliver(client, "issues", payload)
    assert outcome == "applied", detail
    assert Proposal.objects.get().state == State.IMPORTED
    assert not GitHubOutbox.objects.exists()


def test_a_bot_sender_never_starts_a_draft(github_on: FakeGitHub, client: Any, recipe: Any) -> None:
    payload = experiment(real("issues", "labeled.json"))
    payload["issue"]["created_at"] = now_text()  # even a new issue
    payload["sender"] = {**payload["sender"], "login": "github-actions[bot]", "type": "Bot"}
    outcome, detail = deliver(client, "issues", payload)
    assert outcome == "ignored"
    assert "bot" in detail
    assert not Proposal.objects.exists() and not GitHubOutbox.objects.exists()


def test_an_issue_opened_after_the_backfill_still_becomes_a_proposal(
    github_on: FakeGitHub, client: Any, recipe: Any
) -> None:
    outcome, _ = deliver(client, "issues", experiment(real("issues", "opened.json")))
    assert outcome == "applied"
    assert Proposal.objects.get().state in {State.DRAFT, State.SUBMITTED}
    assert GitHubOutbox.objects.exists()  # as today: the site answers on the issue


def test_a_new_open_issue_labelled_after_opening_becomes_a_proposal(
    github_on: FakeGitHub, client: Any, recipe: Any
) -> None:
    payload = experiment(real("issues", "labeled.json"))
    payload["issue"]["created_at"] = now_text()
    outcome, _ = deliver(client, "issues", payload)
    assert outcome == "applied"
    assert Proposal.objects.get().state in {State.DRAFT, State.SUBMITTED}


def test_events_on_an_imported_issue_update_its_mirror_only(
    github_on: FakeGitHub, client: Any, recipe: Any, contributor: Any
) -> None:
    payload = experiment(real("issue_comment", "created.json"))
    number = payload["issue"]["number"]
    proposal = ProposalFactory.create(
        author=contributor, recipe=recipe, state=State.IMPORTED, github_issue_number=number
    )
    payload["comment"]["body"] = "/approve\n\nLooks good to me."
    outcome, detail = deliver(client, "issue_comment", payload)
    assert outcome == "applied", detail
    stored = Comment.objects.get(github_comment_id=payload["comment"]["id"])
    assert stored.proposal == proposal and stored.body.startswith("/approve")
    closed = experiment(real("issues", "closed.zulip.json"))
    closed["issue"]["number"] = number
    outcome, detail = deliver(client, "issues", closed)
    assert outcome == "applied", detail
    proposal.refresh_from_db()
    assert proposal.state == State.IMPORTED  # the command was not run, the state not moved
    assert proposal.github_closed_at is not None
    deleted = experiment(real("issue_comment", "created.json"))
    deleted["action"] = "deleted"
    outcome, _ = deliver(client, "issue_comment", deleted)
    assert not Comment.objects.filter(github_comment_id=payload["comment"]["id"]).exists()
    assert not GitHubOutbox.objects.exists()
    drain()
    assert github_on.writes() == []


def test_a_bot_comment_on_a_linked_proposal_runs_no_command(
    github_on: FakeGitHub, client: Any, recipe: Any, contributor: Any
) -> None:
    payload = real("issue_comment", "created.json")
    ProposalFactory.create(
        author=contributor,
        recipe=recipe,
        state=State.SUBMITTED,
        github_issue_number=payload["issue"]["number"],
    )
    payload["comment"]["body"] = "/hold stale"
    payload["comment"]["user"] = {"login": "stale[bot]", "id": 99, "type": "Bot"}
    payload["sender"] = payload["comment"]["user"]
    outcome, detail = deliver(client, "issue_comment", payload)
    assert outcome == "applied" and "not run" in detail
    assert not GitHubOutbox.objects.filter(operation="comment_create").exists()
    assert not Proposal.objects.get().on_hold


@pytest.mark.parametrize("name", ["closed.zulip.json", "unlabeled.with-organization.json"])
def test_an_unlinked_old_experiment_issue_closed_or_unlabelled_is_mirrored(
    github_on: FakeGitHub, client: Any, recipe: Any, name: str
) -> None:
    payload = experiment(real("issues", name))
    payload["issue"]["created_at"] = now_text()  # even a new one: closing starts no draft
    outcome, detail = deliver(client, "issues", payload)
    assert outcome == "applied", detail
    assert Proposal.objects.get().state == State.IMPORTED
    assert not GitHubOutbox.objects.exists()
