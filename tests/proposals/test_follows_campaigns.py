"""Following a campaign: the button on its page, a mail once per follower for each alert on
its runs and each intervention recorded on it, and the one-click unsubscribe of that mail."""

from __future__ import annotations

from typing import Any

import pytest
from django.core import mail
from django.test import Client

from proposals import follows
from proposals.follows import notice_send
from proposals.models import Follow, Notice
from runs.alerts import rules
from runs.alerts.services import alerts_not_finite
from runs.campaigns import services as campaign_writes
from runs.campaigns.models import Campaign
from runs.models import Run
from tests.factories import UserFactory
from tests.runs.campaigns.campaign_helpers import start
from tests.runs.runs_helpers import launched_plan

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_rules() -> None:
    rules.rules_forget()


@pytest.fixture
def campaign(maintainer: Any, recipe: Any) -> Campaign:
    campaign = campaign_writes.campaign_create(
        actor=maintainer,
        data={
            "slug": "big-run",
            "name": "Big run",
            "target_tokens": 1e9,
            "target_flops": 6e18,
        },
    )
    run = Run.objects.filter(plan=launched_plan(recipe)).order_by("pk").first()
    assert run is not None
    campaign_writes.campaign_run_add(campaign=campaign, run=run, actor=maintainer)
    return campaign


def test_follow_a_campaign_from_its_page_signed_in_with_csrf(
    campaign: Campaign, contributor: Any
) -> None:
    url = "/campaigns/big-run/follow/"
    signed_out = Client()
    assert b"Sign in to follow" in signed_out.get("/campaigns/big-run/").content
    assert signed_out.post(url)["Location"].startswith("/accounts/login/")
    client = Client(enforce_csrf_checks=True)
    client.force_login(contributor)
    assert client.post(url).status_code == 403  # no CSRF token
    assert b">Follow</button>" in client.get("/campaigns/big-run/").content
    token = client.cookies["csrftoken"].value
    response = client.post(url, HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 302 and response["Location"] == "/campaigns/big-run/"
    client.post(url, HTTP_X_CSRFTOKEN=token)  # twice is still one follow
    assert Follow.objects.filter(user=contributor, campaign=campaign).count() == 1
    assert b">Unfollow</button>" in client.get("/campaigns/big-run/").content
    assert client.post("/campaigns/no-such/follow/", HTTP_X_CSRFTOKEN=token).status_code == 404
    client.post("/campaigns/big-run/unfollow/", HTTP_X_CSRFTOKEN=token)
    assert not Follow.objects.exists()


def test_an_intervention_mails_each_follower_once_with_its_unsubscribe_link(
    campaign: Campaign, maintainer: Any, django_capture_on_commit_callbacks: Any, settings: Any
) -> None:
    settings.SITE_URL = "http://site.test"
    fans = [UserFactory.create(username=f"fan{i}", email=f"fan{i}@example.org") for i in range(2)]
    for fan in fans:
        follows.follow_set(user=fan, campaign_id=campaign.pk, follow=True)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        campaign_writes.intervention_record(
            campaign=campaign,
            actor=maintainer,
            step=1200,
            kind="hyperparameter",
            title="Weight decay down",
            from_value="0.1",
            to_value="0.05",
            note="Loss had **plateaued**.",
        )
    notice = Notice.objects.get()
    assert notice.campaign_id == campaign.pk and notice.proposal_id is None
    assert callbacks  # the signal and the notice's task go after commit
    assert notice_send(notice_id=notice.pk) == 2
    assert notice_send(notice_id=notice.pk) == 0  # the task again: nobody twice
    assert sorted(m.to[0] for m in mail.outbox) == ["fan0@example.org", "fan1@example.org"]
    message = mail.outbox[0]
    assert message.subject == ("[marin-site] Big run: intervention at step 1200: Weight decay down")
    assert "Weight decay down (0.1 → 0.05), at step 1200" in message.body
    assert "http://site.test/campaigns/big-run/" in message.body
    assert "You follow this campaign" in message.body
    link = message.extra_headers["List-Unsubscribe"][1:-1]
    assert link.startswith("http://site.test/unsubscribe/")

    client = Client(enforce_csrf_checks=True)  # a mail program: signed out, no cookie
    path = link.removeprefix("http://site.test")
    page = client.get(path)
    assert page.status_code == 200 and b"Big run" in page.content
    assert Follow.objects.filter(campaign=campaign).count() == 2  # a GET changes nothing
    assert client.post(path).status_code == 200
    remaining = Follow.objects.filter(campaign=campaign).values_list("user__email", flat=True)
    assert list(remaining) == [next(u.email for u in fans if u.email != message.to[0])]


def test_an_alert_on_a_campaign_run_reaches_its_followers_and_nobody_else(
    campaign: Campaign, recipe: Any, django_capture_on_commit_callbacks: Any
) -> None:
    fan = UserFactory.create(username="fan", email="fan@example.org")
    follows.follow_set(user=fan, campaign_id=campaign.pk, follow=True)
    other = campaign_writes.campaign_create(
        actor=UserFactory.create(username="boss", roles=["maintainer"]),
        data={"slug": "other", "name": "Other", "target_tokens": 1.0, "target_flops": 1.0},
    )
    stranger = UserFactory.create(username="stranger", email="stranger@example.org")
    follows.follow_set(user=stranger, campaign_id=other.pk, follow=True)
    run = campaign.members.get().run
    start(run)
    with django_capture_on_commit_callbacks(execute=True):
        alerts_not_finite(run=run, first_steps={"train/loss": 42})
    alert = run.alerts.get()
    notice = Notice.objects.get(key=f"alert:{alert.pk}:opened:campaign:{campaign.pk}")
    notice_send(notice_id=notice.pk)
    assert [m.to for m in mail.outbox] == [["fan@example.org"]]
    assert "train/loss was not finite" in mail.outbox[0].body
    assert mail.outbox[0].subject.startswith("[marin-site] Big run: alert opened on run")


def test_tokens_name_one_thing_and_old_proposal_tokens_still_read(
    campaign: Campaign, proposal: Any
) -> None:
    token = follows.unsubscribe_token(user_id=7, campaign_id=campaign.pk)
    assert follows.unsubscribe_read(token) == follows.Subscription(7, None, campaign.pk)
    token = follows.unsubscribe_token(user_id=7, proposal_id=proposal.pk)
    assert follows.unsubscribe_read(token) == follows.Subscription(7, proposal.pk, None)
    both = follows.signing.dumps(
        {"u": 7, "p": proposal.pk, "c": campaign.pk}, salt=follows.UNSUBSCRIBE_SALT
    )
    assert follows.unsubscribe_read(both) is None
    with pytest.raises(ValueError, match="not both or neither"):
        follows.unsubscribe_token(user_id=7)
