"""Following a proposal: the button, the mail once per follower per event (a retried task
mails nobody twice), unsubscribe signed out, and alerts on its runs reaching the issue once."""

from __future__ import annotations

from typing import Any

import pytest
from django.core import mail
from django.test import Client

from proposals import follows, services
from proposals.follows import notice_send
from proposals.github.fake import FakeGitHub
from proposals.models import Follow, GitHubOutbox, Notice, NoticeDelivery, Proposal
from runs.alerts import rules
from runs.alerts.services import alerts_not_finite
from runs.models import Run, RunState
from runs.services import dispatch
from runs.services import runs as run_writes
from runs.signals import alert_changed
from tests.factories import ProposalFactory, UserFactory
from tests.proposals.github_support import drain, fake_github, github_on

pytestmark = pytest.mark.django_db
__all__ = ["fake_github", "github_on"]


@pytest.fixture(autouse=True)
def _fresh_rules() -> None:
    rules.rules_forget()


def approved(contributor: Any, maintainer: Any, recipe: Any) -> Proposal:
    proposal = ProposalFactory.create(author=contributor, recipe=recipe)
    services.proposal_transition(proposal_id=proposal.pk, action="submit", actor=contributor)
    services.proposal_transition(proposal_id=proposal.pk, action="approve", actor=maintainer)
    proposal.refresh_from_db()
    return proposal


def running_run(proposal: Proposal) -> Run:
    assert proposal.plan_id is not None
    dispatch.plan_expand(plan_id=proposal.plan_id)
    run = Run.objects.filter(plan_id=proposal.plan_id).order_by("pk").first()
    assert run is not None
    return run_writes.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door="worker")


def test_follow_needs_a_signed_in_post_with_csrf(proposal: Proposal, contributor: Any) -> None:
    url = f"/proposals/{proposal.pk}/follow/"
    signed_out = Client()
    assert signed_out.post(url)["Location"].startswith("/accounts/login/")
    assert b"Sign in to follow" in signed_out.get(f"/proposals/{proposal.pk}/").content
    assert not Follow.objects.exists()
    client = Client(enforce_csrf_checks=True)
    client.force_login(contributor)
    assert client.post(url).status_code == 403  # no CSRF token
    page = client.get(f"/proposals/{proposal.pk}/")
    assert b">Follow</button>" in page.content
    token = client.cookies["csrftoken"].value
    assert client.post(url, HTTP_X_CSRFTOKEN=token).status_code == 302
    assert Follow.objects.filter(user=contributor, proposal=proposal).count() == 1
    assert b">Unfollow</button>" in client.get(f"/proposals/{proposal.pk}/").content
    client.post(f"/proposals/{proposal.pk}/unfollow/", HTTP_X_CSRFTOKEN=token)
    assert not Follow.objects.exists()


def test_a_state_change_mails_each_follower_once_even_when_the_task_runs_again(
    contributor: Any, recipe: Any, django_capture_on_commit_callbacks: Any, settings: Any
) -> None:
    settings.SITE_URL = "http://site.test"
    proposal = ProposalFactory.create(author=contributor, recipe=recipe)
    fans = [UserFactory.create(username=f"fan{i}", email=f"fan{i}@example.org") for i in range(3)]
    silent = UserFactory.create(username="nomail", email="")
    for user in [*fans, silent]:
        follows.follow_set(user=user, proposal_id=proposal.pk, follow=True)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        services.proposal_transition(proposal_id=proposal.pk, action="submit", actor=contributor)
    notice = Notice.objects.get()
    assert notice_send(notice_id=notice.pk) == 3
    assert notice_send(notice_id=notice.pk) == 0  # the task again: nobody twice
    Notice.objects.filter(pk=notice.pk).update(sent_at=None)  # even if it did not finish
    assert notice_send(notice_id=notice.pk) == 0
    assert callbacks  # the task is sent after commit, not in the request
    assert sorted(m.to[0] for m in mail.outbox) == [f"fan{i}@example.org" for i in range(3)]
    message = mail.outbox[0]
    assert message.subject.startswith(f"[marin-site] {proposal.title}: submitted")
    assert "draft -> submitted" in message.body
    unsubscribe = message.extra_headers["List-Unsubscribe"]
    assert unsubscribe.startswith("<http://site.test/unsubscribe/") and unsubscribe.endswith("/>")
    assert message.extra_headers["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert unsubscribe[1:-1] in message.body
    assert NoticeDelivery.objects.count() == 3


def test_a_failed_mail_gives_its_claim_back_for_the_retry(
    contributor: Any, recipe: Any, monkeypatch: Any
) -> None:
    proposal = ProposalFactory.create(author=contributor, recipe=recipe)
    fan = UserFactory.create(username="fan", email="fan@example.org")
    follows.follow_set(user=fan, proposal_id=proposal.pk, follow=True)
    services.proposal_transition(proposal_id=proposal.pk, action="submit", actor=contributor)
    notice = Notice.objects.get()

    def refuse(*args: Any, **kwargs: Any) -> int:
        raise OSError("mail server down")

    monkeypatch.setattr("django.core.mail.EmailMessage.send", refuse)
    with pytest.raises(OSError, match="mail server down"):
        notice_send(notice_id=notice.pk)
    assert not NoticeDelivery.objects.exists()
    monkeypatch.undo()
    assert notice_send(notice_id=notice.pk) == 1
    assert len(mail.outbox) == 1


def test_unsubscribe_works_signed_out_and_refuses_a_forged_token(
    proposal: Proposal, contributor: Any
) -> None:
    follows.follow_set(user=contributor, proposal_id=proposal.pk, follow=True)
    other = UserFactory.create(username="other")
    follows.follow_set(user=other, proposal_id=proposal.pk, follow=True)
    token = follows.unsubscribe_token(user_id=contributor.pk, proposal_id=proposal.pk)
    client = Client(enforce_csrf_checks=True)  # signed out, no CSRF cookie: a mail program

    page = client.get(f"/unsubscribe/{token}/")  # a GET (a link scanner) changes nothing
    assert page.status_code == 200 and proposal.title.encode() in page.content
    assert Follow.objects.filter(user=contributor).exists()

    forged = follows.unsubscribe_token(user_id=other.pk, proposal_id=proposal.pk)[:-2] + "xx"
    for bad in (forged, token.replace(":", ";"), "nonsense"):
        assert client.post(f"/unsubscribe/{bad}/").status_code == 400
    assert Follow.objects.count() == 2

    response = client.post(f"/unsubscribe/{token}/", {"List-Unsubscribe": "One-Click"})
    assert response.status_code == 200
    assert list(Follow.objects.values_list("user_id", flat=True)) == [other.pk]


def test_an_alert_on_a_run_reaches_the_issue_once_and_the_followers(
    github_on: FakeGitHub,
    contributor: Any,
    maintainer: Any,
    recipe: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    fan = UserFactory.create(username="fan", email="fan@example.org")
    proposal = approved(contributor, maintainer, recipe)
    follows.follow_set(user=fan, proposal_id=proposal.pk, follow=True)
    drain()
    proposal.refresh_from_db()
    assert proposal.github_issue_number is not None
    run = running_run(proposal)
    with django_capture_on_commit_callbacks(execute=True):
        alerts_not_finite(run=run, first_steps={"train/loss": 42})
    alert = run.alerts.get()
    # The signal again (a retried receiver): still one outbox row, one notice.
    for _ in range(2):
        with django_capture_on_commit_callbacks(execute=True):
            alert_changed.send(
                sender=None, alert_id=alert.pk, run_id=run.pk, plan_id=run.plan_id, opened=True
            )
    rows = GitHubOutbox.objects.filter(idempotency_key=f"comment:alert:{alert.pk}:opened")
    assert rows.count() == 1
    drain()
    bodies = [c["body"] for c in github_on.issue_comments(proposal.github_issue_number)]
    posted = [b for b in bodies if b.startswith("**Alert on")]
    assert len(posted) == 1
    assert "train/loss was not finite (NaN or infinite) at step 42" in posted[0]
    notice = Notice.objects.get(key=f"alert:{alert.pk}:opened")
    notice_send(notice_id=notice.pk)
    alert_mails = [m for m in mail.outbox if "alert opened" in m.subject]
    assert [m.to for m in alert_mails] == [["fan@example.org"]]
