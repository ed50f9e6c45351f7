"""Following a proposal or a campaign: who follows it, what they are told, and the mail.

A change that followers hear about (a proposal's state change, results, an outcome, an alert
on one of its runs; a campaign's alert or intervention) adds a ``Notice`` in the transaction
of the change, keyed by its cause; after commit a task mails it to each follower, one
``NoticeDelivery`` claimed per follower before the mail is sent, so a retried or repeated
task mails nobody twice. A lost task is made good by the periodic ``notices_reconcile``.

Every mail carries a one-click unsubscribe link (a signed token of the user and the thing
followed: it works signed out, and a forged or altered one is refused) and the
List-Unsubscribe and List-Unsubscribe-Post headers (RFC 8058), so a mail program can
unsubscribe with one click.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.contrib.auth.models import User
from django.core import signing
from django.core.mail import EmailMessage
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone

from marin_site.nudges import nudge
from proposals.models import Follow, Notice, NoticeDelivery, Proposal
from runs.campaigns.models import Campaign

logger = logging.getLogger(__name__)

UNSUBSCRIBE_SALT = "proposals.follows.unsubscribe"


class Subscription(NamedTuple):
    """What an unsubscribe token names: a user and the proposal or campaign they follow."""

    user_id: int
    proposal_id: int | None
    campaign_id: int | None

    def followed(self) -> Proposal | Campaign | None:
        """The thing followed, or None when it is gone."""
        if self.proposal_id is not None:
            return Proposal.objects.filter(pk=self.proposal_id).only("pk", "title").first()
        if self.campaign_id is not None:
            return Campaign.objects.filter(pk=self.campaign_id).only("pk", "slug", "name").first()
        return None


def _target(proposal_id: int | None, campaign_id: int | None) -> dict[str, Any]:
    """The filter of one followed thing: exactly one of the two ids."""
    if proposal_id is not None and campaign_id is None:
        return {"proposal_id": proposal_id}
    if campaign_id is not None and proposal_id is None:
        return {"campaign_id": campaign_id}
    raise ValueError("name a proposal or a campaign, not both or neither")


def follow_set(
    *,
    user: Any,
    follow: bool,
    proposal_id: int | None = None,
    campaign_id: int | None = None,
) -> bool:
    """Follow or unfollow a proposal or a campaign; returns whether the user follows it now.
    Raises the model's DoesNotExist for an unknown one."""
    target = _target(proposal_id, campaign_id)
    if not getattr(user, "is_authenticated", False):
        from marin_site.errors import ActionForbidden

        raise ActionForbidden("Sign in to follow.")
    if proposal_id is not None:
        Proposal.objects.only("pk").get(pk=proposal_id)
    elif campaign_id is not None:
        Campaign.objects.only("pk").get(pk=campaign_id)
    if follow:
        try:
            with transaction.atomic():
                Follow.objects.get_or_create(user=user, **target)
        except IntegrityError:  # a second click raced the first: it follows either way
            pass
    else:
        Follow.objects.filter(user=user, **target).delete()
    return follow


def is_following(
    *, user: Any, proposal_id: int | None = None, campaign_id: int | None = None
) -> bool:
    target = _target(proposal_id, campaign_id)
    if not getattr(user, "is_authenticated", False):
        return False
    return Follow.objects.filter(user=user, **target).exists()


def unsubscribe_token(
    *, user_id: int, proposal_id: int | None = None, campaign_id: int | None = None
) -> str:
    _target(proposal_id, campaign_id)
    data: dict[str, Any] = (
        {"u": user_id, "p": proposal_id}
        if proposal_id is not None
        else {"u": user_id, "c": campaign_id}
    )
    return signing.dumps(data, salt=UNSUBSCRIBE_SALT, compress=True)


def unsubscribe_url(
    *, user_id: int, proposal_id: int | None = None, campaign_id: int | None = None
) -> str:
    token = unsubscribe_token(user_id=user_id, proposal_id=proposal_id, campaign_id=campaign_id)
    return settings.SITE_URL + reverse("proposals:unsubscribe", kwargs={"token": token})


def unsubscribe_read(token: str) -> Subscription | None:
    """What a token was signed for, or None for a bad token."""
    try:
        data = signing.loads(token, salt=UNSUBSCRIBE_SALT)
    except signing.BadSignature:
        return None
    if not isinstance(data, dict):
        return None
    user_id, proposal_id, campaign_id = data.get("u"), data.get("p"), data.get("c")
    if type(user_id) is not int:
        return None
    if type(proposal_id) is int and campaign_id is None:
        return Subscription(user_id, proposal_id, None)
    if type(campaign_id) is int and proposal_id is None:
        return Subscription(user_id, None, campaign_id)
    return None


def unsubscribe(*, token: str) -> Subscription | None:
    """Unfollow by a mail's token; None when the token is not one the site signed."""
    found = unsubscribe_read(token)
    if found is None:
        return None
    target = _target(found.proposal_id, found.campaign_id)
    Follow.objects.filter(user_id=found.user_id, **target).delete()
    return found


# --- notices ------------------------------------------------------------------------------


def notice_add(
    *,
    key: str,
    subject: str,
    body: str,
    proposal: Proposal | None = None,
    campaign: Campaign | None = None,
) -> Notice | None:
    """Tell the followers of a proposal or of a campaign, once per ``key``, after the
    caller's transaction commits. Nothing is stored when nobody follows it."""
    followed: Proposal | Campaign | None = proposal if proposal is not None else campaign
    if followed is None or (proposal is not None and campaign is not None):
        raise ValueError("name a proposal or a campaign, not both or neither")
    target: dict[str, Any] = (
        {"proposal": proposal} if proposal is not None else {"campaign": campaign}
    )
    if not Follow.objects.filter(**target).exists():
        return None
    title = proposal.title if proposal is not None else followed.name  # type: ignore[union-attr]
    link = settings.SITE_URL + followed.get_absolute_url()
    notice, created = Notice.objects.get_or_create(
        key=key[:200],
        defaults={
            **target,
            "subject": f"[marin-site] {title}: {subject}"[:300],
            "body": f"{body}\n\n{link}"[:20_000],
        },
    )
    if created:
        nudge("proposals.notice_send", notice_id=notice.pk)  # lost: notices_reconcile sends it
    return notice


def _mail(notice: Notice, user: User) -> EmailMessage:
    url = unsubscribe_url(
        user_id=user.pk, proposal_id=notice.proposal_id, campaign_id=notice.campaign_id
    )
    what = "proposal" if notice.proposal_id is not None else "campaign"
    body = (
        f"{notice.body}\n\n--\nYou follow this {what} on marin-site. "
        f"Unsubscribe with one click: {url}\n"
    )
    return EmailMessage(
        subject=notice.subject.replace("\r", " ").replace("\n", " "),
        body=body,
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=[user.email],
        headers={
            "List-Unsubscribe": f"<{url}>",
            "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
        },
    )


def notice_send(*, notice_id: int) -> int:
    """Mail a notice to each follower not yet mailed; returns how many were mailed now.
    A follower is claimed (a delivery row committed) before their mail is sent; a mail that
    fails gives the claim back and raises, for the task to retry."""
    notice = Notice.objects.filter(pk=notice_id).first()
    if notice is None or notice.sent_at is not None:
        return 0
    sent = 0
    followers = (
        User.objects.filter(
            **{
                f"follows__{field}": value
                for field, value in _target(notice.proposal_id, notice.campaign_id).items()
            },
            is_active=True,
        )
        .exclude(email="")
        .exclude(pk__in=NoticeDelivery.objects.filter(notice=notice).values("user_id"))
        .order_by("pk")
    )
    for user in followers:
        try:
            with transaction.atomic():
                delivery = NoticeDelivery.objects.create(notice=notice, user=user)
        except IntegrityError:  # another run of this task claimed them
            continue
        try:
            _mail(notice, user).send()
        except Exception:
            delivery.delete()
            raise
        sent += 1
    Notice.objects.filter(pk=notice.pk, sent_at__isnull=True).update(sent_at=timezone.now())
    return sent


def notices_reconcile(*, older_than_seconds: int = 60) -> int:
    """Send the notices whose task was lost (the broker was down, a worker died)."""
    cutoff = timezone.now() - timedelta(seconds=older_than_seconds)
    sent = 0
    for notice_id in Notice.objects.filter(sent_at__isnull=True, created_at__lt=cutoff).values_list(
        "pk", flat=True
    )[:500]:
        try:
            sent += notice_send(notice_id=notice_id)
        except Exception:
            logger.exception("mailing notice %s failed; next pass retries", notice_id)
    return sent
