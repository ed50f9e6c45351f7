"""``manage.py github_backfill``: old experiment issues in as imported proposals, against the
fake GitHub speaking the REST protocol (pagination, rate limits, 502s, secondary limits)."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from allauth.socialaccount.models import SocialAccount
from django.core.management import call_command
from django.test import Client
from django.utils.dateparse import parse_datetime

from marin_site.events import Verb
from proposals.github import backfill as backfill_module
from proposals.github.accounts import github_roles_sync
from proposals.github.backfill import Backfill
from proposals.github.fake import FakeGitHub
from proposals.github.rest import RestReader
from proposals.models import Comment, Event, GitHubBackfill, GitHubOutbox, Proposal, State
from tests.proposals.github_support import fake_github, github_on

pytestmark = pytest.mark.django_db
__all__ = ["fake_github", "github_on"]

REPO = "marin-community/marin"
BODY = """## Description

Swap the router's softmax for a sigmoid.

## Hypothesis or Goal

Sigmoid routing lowers the Paloma macro loss at 1e19 FLOPs.

## Results

Loss 3.21 against 3.25 for the baseline.
"""


def seed(fake: FakeGitHub) -> dict[str, Any]:
    """A small Marin: a tracker, a sub-issue (closed), a non-experiment issue, a pull
    request carrying the label, an issue under two experiment labels; comments on each."""
    tracker = fake.add_issue(
        title="Agent MoE tracker",
        body=BODY,
        login="dlwh",
        labels=["experiment", "moe"],
        created_at="2024-05-01T10:00:00Z",
    )
    sub = fake.add_issue(
        title="MoE: sigmoid routing",
        body=BODY,
        login="ahmed",
        labels=["experiments"],
        created_at="2024-06-01T10:00:00Z",
        closed_at="2024-07-01T10:00:00Z",
        parent=tracker["number"],
    )
    other = fake.add_issue(title="Docs typo", body="fix it", labels=["documentation"])
    pull = fake.add_issue(title="A PR", body=BODY, labels=["experiment"], pull_request=True)
    both = fake.add_issue(
        title="Community run",
        body=BODY,
        login="carol",
        labels=["experiment", "community-experiment-submission"],
        created_at="2025-01-01T00:00:00Z",
    )
    c1 = fake.add_comment(
        number=tracker["number"], body="first", login="percy", created_at="2024-05-02T00:00:00Z"
    )
    c2 = fake.add_comment(number=tracker["number"], body="second", login="dlwh")
    c3 = fake.add_comment(number=sub["number"], body="Stale: closing.", login="github-actions[bot]")
    fake.add_comment(number=other["number"], body="not an experiment")
    return {
        "tracker": tracker,
        "sub": sub,
        "other": other,
        "pull": pull,
        "both": both,
        "comments": (c1, c2, c3),
    }


def backfill(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("github_backfill", REPO, "--no-progress", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def snapshot() -> list[Any]:
    return [
        list(
            Proposal.objects.order_by("pk").values_list(
                "pk", "title", "state", "github_updated_at", "github_mirror", "updated_at"
            )
        ),
        list(Comment.objects.order_by("pk").values_list("pk", "body", "updated_at")),
        Event.objects.count(),
    ]


def test_every_experiment_issue_and_comment_comes_in_quietly(
    github_on: FakeGitHub, recipe: Any
) -> None:
    seeded = seed(github_on)
    out, err = backfill()
    assert "finished" in out, out + err
    numbers = set(Proposal.objects.values_list("github_issue_number", flat=True))
    assert numbers == {
        seeded["tracker"]["number"],
        seeded["sub"]["number"],
        seeded["both"]["number"],
    }
    sub = Proposal.objects.get(github_issue_number=seeded["sub"]["number"])
    assert sub.state == State.IMPORTED
    assert sub.title == "MoE: sigmoid routing"
    assert sub.hypothesis.startswith("Sigmoid routing lowers")
    assert sub.results.startswith("Loss 3.21")
    assert sub.github_parent_number == seeded["tracker"]["number"]
    assert sub.created_at == parse_datetime("2024-06-01T10:00:00Z")
    assert sub.github_closed_at == parse_datetime("2024-07-01T10:00:00Z")
    assert sub.github_mirror["labels"] == ["experiments"]
    # The author is the account of their GitHub id: signing in with GitHub meets it.
    social = SocialAccount.objects.get(user=sub.author)
    assert social.uid == str(github_on.issue(seeded["sub"]["number"])["user"]["id"])
    tracker = Proposal.objects.get(github_issue_number=seeded["tracker"]["number"])
    assert sorted(tracker.labels.values_list("name", flat=True)) == ["experiment", "moe"]
    mirrored = list(
        tracker.comments.order_by("created_at").values_list("body", "github_comment_id")
    )
    assert mirrored == [
        ("first", seeded["comments"][0]["id"]),
        ("second", seeded["comments"][1]["id"]),
    ]
    first = Comment.objects.get(github_comment_id=seeded["comments"][0]["id"])
    assert first.created_at == parse_datetime("2024-05-02T00:00:00Z")
    assert first.author_label == "@percy on GitHub"
    assert sub.comments.get().body == "Stale: closing."
    assert Event.objects.filter(verb=Verb.IMPORTED).count() == 3
    page = Client().get(sub.get_absolute_url()).content.decode()
    assert "a sub-issue of #1" in page and 'id="github-imported"' in page
    assert 'datetime="2024-07-01T10:00:00+00:00"' in page  # closed on GitHub
    # Nothing written to GitHub, nothing queued to write.
    assert github_on.writes() == []
    assert not GitHubOutbox.objects.exists()
    assert "pull requests: 1" in out
    assert "issues seen: 3" in out


def test_a_second_run_changes_nothing_then_follows_edits_and_deletions(
    github_on: FakeGitHub, recipe: Any
) -> None:
    seeded = seed(github_on)
    backfill()
    before = snapshot()
    out, _ = backfill()
    assert snapshot() == before
    assert "created: 0, updated: 0" in out and "comments created: 0" in out
    c1, c2, _c3 = seeded["comments"]
    github_on.edit_comment_by_hand(comment_id=c1["id"], body="first, edited")
    github_on.delete_comment_by_hand(comment_id=c2["id"])
    added = github_on.add_comment(number=seeded["tracker"]["number"], body="third")
    github_on.edit_issue_by_hand(
        number=seeded["tracker"]["number"], title="Agent MoE tracker (2025)"
    )
    out, _ = backfill()
    tracker = Proposal.objects.get(github_issue_number=seeded["tracker"]["number"])
    assert tracker.title == "Agent MoE tracker (2025)"
    assert tracker.state == State.IMPORTED
    bodies = sorted(tracker.comments.values_list("body", flat=True))
    assert bodies == ["first, edited", "third"]
    assert Comment.objects.filter(github_comment_id=added["id"]).exists()
    assert "comments deleted: 1" in out
    assert github_on.writes() == []


def test_an_interrupted_run_continues_where_it_stopped(
    github_on: FakeGitHub, recipe: Any, monkeypatch: Any
) -> None:
    monkeypatch.setattr(backfill_module, "PER_PAGE", 2)
    for n in range(5):
        github_on.add_issue(title=f"Run {n}", body=BODY, labels=["experiment"])
    out, _ = backfill("--label", "experiment", "--limit", "2")
    assert "stopped (resumable)" in out
    assert Proposal.objects.count() == 2
    state = GitHubBackfill.objects.get(repository=REPO)
    assert (state.phase, state.page, state.finished_at) == ("issues", 2, None)
    before = len(github_on.reads())
    out, _ = backfill("--label", "experiment")
    assert "finished" in out and "issues seen: 3" in out  # the first page was not read again
    assert Proposal.objects.count() == 5
    issue_pages = [r for r in github_on.reads()[before:] if r[1].endswith("/issues")]
    assert len(issue_pages) == 2  # pages 2 and 3 only
    assert GitHubBackfill.objects.get(repository=REPO).finished_at is not None


def test_rate_limit_is_waited_for_never_sent_past(
    github_on: FakeGitHub, recipe: Any, monkeypatch: Any
) -> None:
    monkeypatch.setattr(backfill_module, "PER_PAGE", 2)
    for n in range(6):
        github_on.add_issue(title=f"Run {n}", body=BODY, labels=["experiment"])
    github_on.rate_limit(limit=3, window=1.0)
    reader = RestReader(base_url=github_on.url, token="test-token", backoff=0.01)
    report = Backfill(reader=reader, repository=REPO, labels=["experiment"]).run()
    assert report.finished, report.problems
    assert Proposal.objects.count() == 6
    assert github_on.state.limit_violations == 0
    assert reader.waited > 0  # it waited for a reset rather than send past the limit


def test_502s_and_secondary_limits_are_retried(github_on: FakeGitHub, recipe: Any) -> None:
    github_on.add_issue(title="Run", body=BODY, labels=["experiment"])
    github_roles_sync()  # the roles' own lookups, before the failures meant for the backfill
    github_on.fail("5xx", times=2)
    github_on.fail("secondary", times=1, retry_after=1)
    slept: list[float] = []
    reader = RestReader(
        base_url=github_on.url, token="test-token", backoff=0.01, sleep=slept.append
    )
    report = Backfill(reader=reader, repository=REPO, labels=["experiment"]).run()
    assert report.finished, report.problems
    assert Proposal.objects.count() == 1
    # Two 502s backed off (growing), the secondary limit's Retry-After waited out.
    assert slept == [0.01, 0.02, 1.0]
    assert reader.requests_sent == 3 + 2  # the failures, then one page of issues, one of comments


def test_github_failing_for_good_stops_resumably(github_on: FakeGitHub, recipe: Any) -> None:
    github_on.add_issue(title="Run", body=BODY, labels=["experiment"])
    github_roles_sync()
    github_on.fail("5xx")
    reader = RestReader(base_url=github_on.url, retries=2, backoff=0.01)
    report = Backfill(reader=reader, repository=REPO, labels=["experiment"]).run()
    assert not report.finished
    assert any("502" in p for p in report.problems)
    assert GitHubBackfill.objects.get(repository=REPO).finished_at is None


def test_bad_input_is_reported_with_its_place_and_skipped(
    github_on: FakeGitHub, recipe: Any
) -> None:
    good = github_on.add_issue(title="Good", body=BODY, labels=["experiment", "Needs Review!"])
    odd = github_on.add_issue(title="Odd body", body=["not", "text"], labels=["experiment"])
    gone = github_on.add_issue(title="Gone author", body=BODY, login=None, labels=["experiment"])
    big = github_on.add_comment(number=good["number"], body="x" * 70_000)
    ghost = github_on.add_comment(number=good["number"], body="who?", login=None)
    github_on.add_comment(number=good["number"], body="kept")
    _, err = backfill("--label", "experiment", "--label", "bug")
    assert "--label bug: not an experiment label" in err
    assert f"issue #{odd['number']}: its body is not text" in err
    assert f"issue #{gone['number']}: its author's account was deleted; skipped" in err
    assert f"comment {big['id']} on issue #{good['number']}: 70000 characters, over the cap" in err
    assert (
        f"comment {ghost['id']} on issue #{good['number']}: its author's account was deleted" in err
    )
    assert f"issue #{good['number']}: label 'needs review!' is not a label name" in err
    assert list(Proposal.objects.values_list("github_issue_number", flat=True)) == [good["number"]]
    assert list(Comment.objects.values_list("body", flat=True)) == ["kept"]
    # A second run refuses the same comments again but does not refetch the issue for them.
    reads = len(github_on.reads())
    backfill("--label", "experiment")
    assert not any(
        r[1].endswith(f"/issues/{good['number']}/comments") for r in github_on.reads()[reads:]
    )
    assert github_on.writes() == []


def test_an_issue_transferred_away_is_reported(github_on: FakeGitHub, recipe: Any) -> None:
    issue = github_on.add_issue(title="Moved", body=BODY, labels=["experiment"])
    comment = github_on.add_comment(number=issue["number"], body="hello")
    backfill()
    github_on.delete_comment_by_hand(comment_id=comment["id"])  # the count no longer adds up
    github_on.transfer(number=issue["number"])
    _, err = backfill()
    assert f"issue #{issue['number']}: was transferred away; its mirror is kept" in err
    assert Comment.objects.filter(github_comment_id=comment["id"]).exists()


def test_dry_run_stores_nothing(github_on: FakeGitHub, recipe: Any) -> None:
    seed(github_on)
    out, _ = backfill("--dry-run")
    assert out.startswith("dry run, nothing stored")
    assert "created: 3" in out
    assert not Proposal.objects.exists() and not Comment.objects.exists()
    assert not GitHubBackfill.objects.exists()


def test_no_recipe_is_refused_in_words(github_on: FakeGitHub) -> None:
    with pytest.raises(Exception, match="no active recipe"):
        backfill()


def test_since_reads_only_what_changed_after_it(github_on: FakeGitHub, recipe: Any) -> None:
    github_on.add_issue(
        title="Old", body=BODY, labels=["experiment"], created_at="2024-01-01T00:00:00Z"
    )
    new = github_on.add_issue(title="New", body=BODY, labels=["experiment"])  # updated now
    out, _ = backfill("--since", "2025-01-01")
    assert "finished" in out
    assert list(Proposal.objects.values_list("github_issue_number", flat=True)) == [new["number"]]
    with pytest.raises(Exception, match="--since: 'yesterday' is not a date"):
        backfill("--since", "yesterday")


def test_the_progress_bar_counts_each_phase(
    github_on: FakeGitHub, recipe: Any, monkeypatch: Any
) -> None:
    monkeypatch.setattr(backfill_module, "PER_PAGE", 1)  # rel="last": a total, so an ETA
    for n in range(3):
        github_on.add_issue(title=f"Run {n}", body=BODY, labels=["experiment"])
    out, err = StringIO(), StringIO()
    call_command("github_backfill", REPO, "--label", "experiment", stdout=out, stderr=err)
    bars = err.getvalue()
    assert "issues labelled experiment" in bars and "3/3" in bars  # the count of the total
    assert "<00:00" in bars  # the ETA
    assert "comments" in bars
    assert "issues seen: 3" in out.getvalue()
