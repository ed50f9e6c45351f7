"""Issues become proposals: Marin-style issue layouts, missing sections, the edit rule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from allauth.socialaccount.models import SocialAccount

from proposals.github.body import body_with_block, issue_fields
from proposals.models import Comment, GitHubOutbox, Proposal, State
from tests.factories import UserFactory
from tests.proposals.github_support import (
    MARIN_ISSUES,
    comment_delivery,
    drain,
    fake_github,
    github_on,
    issue_payload,
    issues_delivery,
    post_delivery,
    process_deliveries,
)

pytestmark = pytest.mark.django_db
__all__ = ["fake_github", "github_on"]

ISSUES = sorted(MARIN_ISSUES.glob("*.json"))


def test_marin_issue_fixtures_exist() -> None:
    assert len(ISSUES) >= 4


@pytest.mark.parametrize("path", ISSUES, ids=lambda p: p.stem)
def test_marin_issue_becomes_the_proposal_a_reader_would_write(
    github_on: Any, client: Any, recipe: Any, path: Path
) -> None:
    source = json.loads(path.read_text())
    expected = source["expected"]
    issue = issue_payload(
        number=source["number"],
        title=source["title"],
        body=source["body"],
        login=source["author_login"],
        labels=source["labels"],
    )
    assert post_delivery(client, "issues", issues_delivery("opened", issue)).status_code == 202
    for index, comment in enumerate(source["comments"]):
        post_delivery(
            client,
            "issue_comment",
            comment_delivery(
                "created",
                number=source["number"],
                comment_id=source["number"] * 100 + index,
                body=comment["body"],
                login=comment["author_login"],
            ),
        )
    outcomes = process_deliveries()
    assert "failed" not in outcomes
    proposal = Proposal.objects.filter(github_issue_number=source["number"]).first()
    if not expected["is_experiment"]:
        assert proposal is None
        return
    assert proposal is not None
    assert proposal.title == expected["title"]
    assert proposal.summary == expected["summary"]
    assert (
        SocialAccount.objects.get(user=proposal.author).extra_data["login"]
        == source["author_login"]
    )
    for key, field in (
        ("description_contains", "description"),
        ("hypothesis_contains", "hypothesis"),
        ("results_contains", "results"),
    ):
        if expected[key] is None:
            assert getattr(proposal, field) == "" or key == "description_contains"
        else:
            assert expected[key] in getattr(proposal, field)
    assert len(proposal.results) >= expected.get("results_min_length", 0)
    links = [
        url
        for url in (proposal.wandb_url, proposal.data_browser_url, proposal.experiment_json_url)
        if url
    ]
    assert links == expected["links"]
    assert (proposal.submitter_name or None) == expected["author_name"]
    assert (proposal.submitter_affiliation or None) == expected["affiliation"]
    assert (proposal.branch or None) == expected["branch"]
    assert proposal.comments.count() == expected["comment_count"]
    # Marin's issues carry no success criteria: a draft, and a comment says what is missing.
    assert proposal.state == State.DRAFT
    missing = GitHubOutbox.objects.get(idempotency_key=f"comment:missing:{proposal.pk}")
    assert "success criteria" in missing.payload["body"]


def test_missing_sections_leave_a_draft_and_a_comment_naming_them(
    github_on: Any, client: Any, recipe: Any
) -> None:
    github_on.add_issue(title="Idea", body="Just an idea.", labels=["experiment"])
    issue = issue_payload(number=1, title="Idea", body="Just an idea.")
    post_delivery(client, "issues", issues_delivery("opened", issue))
    assert process_deliveries() == ["applied"]
    proposal = Proposal.objects.get(github_issue_number=1)
    assert proposal.state == State.DRAFT
    assert proposal.description == ""
    assert proposal.hypothesis == ""
    assert proposal.summary == "Idea"
    drain()
    bodies = [c["body"] for c in github_on.issue_comments(1)]
    missing = next(b for b in bodies if "draft proposal" in b)
    assert "## Description" in missing
    assert "## Hypothesis or Goal" in missing
    # The issue keeps its text and gains the site's block after it.
    assert github_on.issue(1)["body"].startswith("Just an idea.\n\n<!-- marin-site:start -->")


def test_a_labelled_issue_becomes_a_proposal_once(github_on: Any, client: Any, recipe: Any) -> None:
    body = "## Description\n\nX.\n\n## Hypothesis or Goal\n\nY.\n"
    plain = issue_payload(number=3, title="Later", body=body, labels=["question"])
    post_delivery(client, "issues", issues_delivery("opened", plain))
    labelled = issue_payload(number=3, title="Later", body=body, labels=["question", "experiments"])
    post_delivery(client, "issues", issues_delivery("labeled", labelled))
    post_delivery(client, "issues", issues_delivery("labeled", labelled))
    assert process_deliveries() == ["ignored", "applied", "ignored"]
    assert Proposal.objects.filter(github_issue_number=3).count() == 1


def test_issue_edit_rule_changes_only_sections_edited_on_github(
    github_on: Any, client: Any, recipe: Any
) -> None:
    body = "## Description\n\nFirst.\n\n## Hypothesis or Goal\n\nGuess.\n"
    issue = issue_payload(number=4, title="Edit me", body=body, login="author1")
    post_delivery(client, "issues", issues_delivery("opened", issue))
    process_deliveries()
    proposal = Proposal.objects.get(github_issue_number=4)
    # The author edits the hypothesis on the site; then edits only the description on GitHub.
    Proposal.objects.filter(pk=proposal.pk).update(hypothesis="Refined on the site.")
    edited = dict(
        issue,
        body=body_with_block(body.replace("First.", "Second."), "site block"),
        updated_at="2026-02-01T00:00:00Z",
    )
    post_delivery(client, "issues", issues_delivery("edited", edited))
    assert process_deliveries() == ["applied"]
    proposal.refresh_from_db()
    assert proposal.description == "Second."
    assert proposal.hypothesis == "Refined on the site."
    # A removed section never blanks a field; an edit by a stranger is refused.
    UserFactory.create(username="stranger")
    stranger_edit = dict(
        issue,
        body="## Description\n\nVandalised.\n",
        updated_at="2026-02-02T00:00:00Z",
    )
    post_delivery(client, "issues", issues_delivery("edited", stranger_edit, sender="stranger"))
    assert process_deliveries() == ["ignored"]
    proposal.refresh_from_db()
    assert proposal.description == "Second."
    assert proposal.hypothesis == "Refined on the site."


def test_issue_comments_arrive_with_their_github_author(
    github_on: Any, client: Any, recipe: Any
) -> None:
    issue = issue_payload(number=5, title="C", body="## Description\n\nD\n")
    post_delivery(client, "issues", issues_delivery("opened", issue))
    post_delivery(
        client,
        "issue_comment",
        comment_delivery("created", number=5, comment_id=900, body="Looks fun", login="zed"),
    )
    process_deliveries()
    comment = Comment.objects.get(github_comment_id=900)
    assert (comment.body, comment.author_label) == ("Looks fun", "@zed on GitHub")
    assert SocialAccount.objects.get(user=comment.author).extra_data["login"] == "zed"


def test_parsing_ignores_headings_inside_code_blocks_and_the_site_block() -> None:
    body = body_with_block(
        "## Description\n\n```\n## Hypothesis or Goal\nnot a heading\n```\n",
        "### Hypothesis\n\nsite text",
    )
    fields = issue_fields(title="T", body=body)
    assert "not a heading" in fields.data["description"]
    assert "hypothesis" not in fields.data


@pytest.mark.parametrize(
    "line",
    [
        "* WandB Report: https://wandb.ai/marin-community/marin/reports/A--B",
        "- WandB report: [the report](https://wandb.ai/marin-community/marin/reports/A--B)",
        "* [W&B report](https://wandb.ai/marin-community/marin/reports/A--B)",
        "+ Weights & Biases: <https://wandb.ai/marin-community/marin/reports/A--B>",
        "1. https://wandb.ai/marin-community/marin/reports/A--B",
    ],
)
def test_links_are_read_in_the_forms_people_write_them(line: str) -> None:
    body = f"## Description\nd\n\n## Hypothesis or Goal\nh\n\n### Links\n{line}\n* Parent: #12\n"
    fields = issue_fields(title="T", body=body)
    assert fields.data["wandb_url"] == "https://wandb.ai/marin-community/marin/reports/A--B"
    assert "data_browser_url" not in fields.data


def test_heading_variants_fill_the_same_fields() -> None:
    body = (
        "# **1. Summary:**\nWe try a router z-loss.\n\n"
        "#### Hypothesis\nIt stabilises training.\n\n"
        "## Links\n- Data browser: https://marin.community/data-browser/experiment/?path=x\n"
        "- Experiment JSON: [json](https://example.org/exp.json)\n\n"
        "## Findings\nNo change in loss.\n"
    )
    fields = issue_fields(title="T", body=body)
    assert fields.data["description"] == "We try a router z-loss."
    assert fields.data["hypothesis"] == "It stabilises training."
    assert fields.data["results"] == "No change in loss."
    assert fields.data["data_browser_url"].startswith("https://marin.community/data-browser/")
    assert fields.data["experiment_json_url"] == "https://example.org/exp.json"
    assert fields.missing == []


def test_javascript_and_overlong_links_are_not_taken() -> None:
    body = (
        "## Description\nd\n## Hypothesis\nh\n### Links\n"
        "* WandB Report: [x](javascript:alert(1))\n"
        f"* Data Browser: https://marin.community/{'a' * 600}\n"
    )
    fields = issue_fields(title="T", body=body)
    assert "wandb_url" not in fields.data
    assert "data_browser_url" not in fields.data
