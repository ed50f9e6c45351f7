"""GitHub roles follow GitHub user ids, never logins; accounts are made once, whatever the
number of workers; odd logins and overlong sections from an issue never cost a 500."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from allauth.socialaccount.models import SocialAccount
from django.contrib.auth.models import User
from django.db import connection

from marin_site.roles import is_maintainer
from proposals import services
from proposals.github.accounts import github_account, github_roles_sync
from proposals.models import GitHubRoleGrant, Proposal, State
from tests.factories import ProposalFactory
from tests.proposals.github_support import (
    comment_delivery,
    drain,
    fake_github,
    github_on,
    github_user_id,
    issue_payload,
    issues_delivery,
    post_delivery,
    process_deliveries,
)

pytestmark = pytest.mark.django_db
__all__ = ["fake_github", "github_on"]


@pytest.fixture
def linked(github_on: Any, contributor: Any, recipe: Any) -> Proposal:
    proposal = ProposalFactory.create(author=contributor, recipe=recipe)
    services.proposal_transition(proposal_id=proposal.pk, action="submit", actor=contributor)
    drain()
    proposal.refresh_from_db()
    return proposal


def _approve_as(client: Any, proposal: Proposal, login: str, user_id: int, comment_id: int) -> None:
    post_delivery(
        client,
        "issue_comment",
        comment_delivery(
            "created",
            number=proposal.github_issue_number or 0,
            comment_id=comment_id,
            body="/approve",
            login=login,
            user_id=user_id,
        ),
    )
    process_deliveries()
    proposal.refresh_from_db()


def test_the_configured_maintainer_approves_through_her_github_id(
    client: Any, linked: Proposal
) -> None:
    _approve_as(client, linked, "maxine", github_user_id("maxine"), 501)
    assert linked.state == State.APPROVED
    grant = GitHubRoleGrant.objects.get(login="maxine")
    assert grant.github_id == github_user_id("maxine")


@pytest.mark.parametrize("login", ["MAXINE", "Maxine", "maxine"])
def test_another_account_writing_the_maintainer_s_login_gets_no_role(
    client: Any, linked: Proposal, login: str
) -> None:
    """Another letter case, or the same login taken over after a rename: another id."""
    _approve_as(client, linked, login, 424242, 502)
    assert linked.state == State.SUBMITTED
    impostor = SocialAccount.objects.get(provider="github", uid="424242").user
    assert not is_maintainer(impostor)


def test_a_login_github_does_not_know_gives_nobody_the_role(
    client: Any, linked: Proposal, settings: Any
) -> None:
    settings.GITHUB_MAINTAINERS = ["nobody-by-that-name"]
    _approve_as(client, linked, "nobody-by-that-name", 777, 503)
    assert linked.state == State.SUBMITTED
    assert GitHubRoleGrant.objects.get(login="nobody-by-that-name").github_id is None


def test_a_login_leaving_the_setting_takes_the_role_with_it(github_on: Any, settings: Any) -> None:
    maxine = github_account(login="maxine", github_id=github_user_id("maxine"))
    assert is_maintainer(maxine)
    settings.GITHUB_MAINTAINERS = []
    github_roles_sync()
    maxine = User.objects.get(pk=maxine.pk)
    assert not is_maintainer(maxine)
    assert not GitHubRoleGrant.objects.filter(login="maxine").exists()


def test_a_login_is_asked_of_github_once(github_on: Any) -> None:
    github_account(login="maxine", github_id=github_user_id("maxine"))
    github_account(login="rosa", github_id=github_user_id("rosa"))
    github_roles_sync()
    asked = [path for method, path in github_on.state.requests if path.startswith("/users/")]
    assert sorted(asked) == ["/users/maxine", "/users/rosa"]


@pytest.mark.django_db(transaction=True)
def test_two_workers_meeting_a_new_github_user_make_one_account(github_on: Any) -> None:
    barrier = threading.Barrier(2)
    made: list[int] = []

    def worker() -> None:
        try:
            barrier.wait(timeout=5)
            made.append(github_account(login="newcomer", github_id=99_001).pk)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(made) == 2 and made[0] == made[1]
    assert SocialAccount.objects.filter(uid="99001").count() == 1


@pytest.mark.parametrize(
    "login", ["x" * 300, "emoji-🙂-login", "", None, ["a", "list"], "<script>"]
)
def test_odd_logins_in_a_comment_are_stored_trimmed_never_a_500(
    client: Any, linked: Proposal, login: Any
) -> None:
    payload = comment_delivery(
        "created",
        number=linked.github_issue_number or 0,
        comment_id=600,
        body="a comment",
        login="placeholder",
    )
    payload["comment"]["user"]["login"] = login
    payload["sender"]["login"] = login
    post_delivery(client, "issue_comment", payload)
    assert process_deliveries() in (["applied"], ["ignored"])  # never "failed"
    for comment in linked.comments.all():  # stored (odd characters dropped) or refused whole
        assert 0 < len(comment.author_label) <= 100
        assert "<" not in comment.author_label and "🙂" not in comment.author_label


def test_an_issue_with_an_overlong_section_keeps_its_other_fields(
    client: Any, github_on: Any, recipe: Any
) -> None:
    body = (
        "### Your name\n\nAda\n\n"
        "### Link to your profile/site\n\n" + "https://example.org/" + "p" * 5000 + "\n\n"
        "### One-sentence description of your experiment\n\nDoes a tiny change help.\n\n"
        "### Hypothesis / Goal\n\nIt lowers the loss.\n"
    )
    issue = issue_payload(number=71, title="A long profile", body=body, login="ada")
    post_delivery(client, "issues", issues_delivery("opened", issue))
    process_deliveries()
    proposal = Proposal.objects.get(github_issue_number=71)
    assert proposal.hypothesis.startswith("It lowers the loss")
    assert proposal.submitter_name == "Ada"
    assert len(proposal.submitter_link) <= 500


@pytest.mark.django_db(transaction=True)
def test_a_comment_is_never_applied_before_its_issue_in_another_worker(
    client: Any, github_on: Any, recipe: Any, monkeypatch: Any
) -> None:
    """Worker A holds the issue's ``opened`` delivery mid-way; its comment arrives and
    worker B drains. B must leave the comment for after the issue, not drop it as 'issue
    not linked'."""
    from proposals.github import deliveries

    issue = issue_payload(
        number=81,
        title="Parallel",
        body="## Description\n\nA change.\n\n## Hypothesis or Goal\n\nIt helps.\n",
        login="ada",
    )
    post_delivery(client, "issues", issues_delivery("opened", issue))
    inside, release = threading.Event(), threading.Event()
    real = deliveries._delivery_outcome

    def slow(delivery: Any, payload: Any, linked: Any) -> Any:
        if delivery.event == "issues":
            inside.set()
            release.wait(timeout=20)
        return real(delivery, payload, linked)

    monkeypatch.setattr(deliveries, "_delivery_outcome", slow)

    def drain_in_thread() -> None:
        try:
            deliveries._drain_pending(50)
        finally:
            connection.close()

    worker_a = threading.Thread(target=drain_in_thread)
    worker_a.start()
    assert inside.wait(timeout=20)
    post_delivery(
        client,
        "issue_comment",
        comment_delivery("created", number=81, comment_id=901, body="Looks good", login="rosa"),
    )
    worker_b = threading.Thread(target=drain_in_thread)
    worker_b.start()
    worker_b.join(timeout=20)
    release.set()
    worker_a.join(timeout=20)
    process_deliveries()  # the drain comes back for what arrived meanwhile
    proposal = Proposal.objects.get(github_issue_number=81)
    assert list(proposal.comments.values_list("body", flat=True)) == ["Looks good"]
