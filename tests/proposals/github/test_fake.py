"""The fake GitHub speaks what PyGithub uses, and fails the ways GitHub fails."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests
from github import Auth, Github, GithubException, RateLimitExceededException

from proposals.github.body import END, START, block_split, body_with_block, human_text
from proposals.github.fake import FakeGitHub


@pytest.fixture
def fake() -> Iterator[FakeGitHub]:
    server = FakeGitHub(repository="o/r", token="t0ken", timeout_sleep=1.5).start()
    yield server
    server.stop()


def _github(fake: FakeGitHub, token: str = "t0ken") -> Github:  # noqa: S107
    return Github(
        base_url=fake.url,
        auth=Auth.Token(token),
        retry=0,
        timeout=1,
        seconds_between_requests=0,
        seconds_between_writes=0,
    )


def test_issues_comments_and_labels_through_pygithub(fake: FakeGitHub) -> None:
    repo = _github(fake).get_repo("o/r")
    assert repo.full_name == "o/r"
    issue = repo.create_issue(title="T", body="B", labels=["experiment"])
    assert issue.url == f"{fake.url}/repos/o/r/issues/1"
    issue.edit(body="B2", title="T2")
    issue.add_to_labels("status:submitted")
    issue.remove_from_labels("experiment")
    comment = issue.create_comment("first")
    comment.edit("first, edited")
    for n in range(40):
        issue.create_comment(f"c{n}")
    again = repo.get_issue(1)
    assert (again.title, again.body) == ("T2", "B2")
    assert [label.name for label in again.labels] == ["status:submitted"]
    bodies = [c.body for c in again.get_comments()]  # paginated by Link headers
    assert len(bodies) == 41
    assert bodies[0] == "first, edited"
    assert again.get_comment(comment.id).body == "first, edited"
    comment.delete()
    assert len(fake.issue_comments(1)) == 40
    assert [i.number for i in repo.get_issues(state="all", labels=["status:submitted"])] == [1]
    remaining, limit = _github(fake).rate_limiting
    assert (remaining, limit) == (5000, 5000)


def test_a_wrong_token_is_refused(fake: FakeGitHub) -> None:
    with pytest.raises(GithubException) as raised:
        _github(fake, token="wrong").get_repo("o/r")
    assert raised.value.status == 401


def test_failures_look_like_githubs(fake: FakeGitHub) -> None:
    repo = _github(fake).get_repo("o/r")
    issue = repo.create_issue(title="T", body="B")
    fake.fail("5xx", times=1)
    with pytest.raises(GithubException) as server_error:
        issue.create_comment("x")
    assert server_error.value.status == 502
    fake.fail("secondary", times=1, retry_after=7)
    with pytest.raises(RateLimitExceededException) as secondary:
        issue.create_comment("x")
    assert secondary.value.status == 403
    assert (secondary.value.headers or {})["retry-after"] == "7"
    fake.fail("429", times=1, retry_after=3)
    with pytest.raises(GithubException) as too_many:
        issue.create_comment("x")
    assert too_many.value.status == 429
    fake.fail("primary", times=1, retry_after=60)
    with pytest.raises(RateLimitExceededException) as primary:
        issue.create_comment("x")
    assert (primary.value.headers or {})["x-ratelimit-remaining"] == "0"
    fake.fail("timeout", times=1)
    with pytest.raises(requests.exceptions.Timeout):
        issue.create_comment("x")
    fake.fail("lost", times=1)
    with pytest.raises(requests.exceptions.ConnectionError):
        issue.create_comment("written but unanswered")
    assert [c["body"] for c in fake.issue_comments(1)] == ["written but unanswered"]
    fake.fail("5xx")
    fake.recover()
    assert issue.create_comment("fine").body == "fine"


def test_the_managed_block_replaces_only_its_inside() -> None:
    outside = "Intro\r\n\r\n  trailing spaces  \n"
    body = body_with_block(outside, "one")
    assert body == f"{outside}\n\n{START}\none\n{END}"
    updated = body_with_block(body + "\nafter ✓", "two")
    assert updated == f"{outside}\n\n{START}\ntwo\n{END}\nafter ✓"
    assert human_text(updated) == f"{outside}\n\n\nafter ✓"
    assert block_split("no block") == ("no block", None, "")
    assert body_with_block("", "x") == f"{START}\nx\n{END}"
