"""Following a proposal: who follows it, what they are told, and the mail that tells them.

A change that followers hear about (a state change, results, an outcome, an alert on one of
the proposal's runs) adds a ``Notice`` in the transaction of the change, keyed by its cause;
after commit a task mails it to each follower, one ``NoticeDelivery`` claimed per follower
before the mail is sent, so a retried or repeated task mails nobody twice. A lost task is
made good by the periodic ``notices_reconcile``.

Every mail carries a one-click unsubscribe link (a signed token of the user and the proposal:
it works signed out, and a forged or altered one is refused) and the List-Unsubscribe and
List-Unsubscribe-Post headers (RFC 8058), so a mail program can unsubscribe with one click.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core import signing
from django.core.mail import EmailMessage
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone

from proposals.models import Follow, Notice, NoticeDelivery, Proposal

logger = logging.getLogger(__name__)

UNSUBSCRIBE_SALT = "proposals.follows.unsubscribe"


def follow_set(*, user: Any, proposal_id: int, follow: bool) -> bool:
    """Follow or unfollow; returns whether the user follows the proposal now."""
    if not getattr(user, "is_authenticated", False):
        from marin_site.errors import ActionForbidden

        raise ActionForbidden("Sign in to follow a proposal.")
    proposal = Proposal.objects.only("pk").get(pk=proposal_id)
    if follow:
        Follow.objects.get_or_create(user=user, proposal=proposal)
    else:
        Follow.objects.filter(user=user, proposal=proposal).delete()
    return follow


def is_following(*, user: Any, proposal_id: int) -> bool:
    if not getattr(user, "is_authenticated", False):
        return False
    return Follow.objects.filter(user=user, proposal_id=proposal_id).exists()


def unsubscribe_token(*, user_id: int, proposal_id: int) -> str:
    return signing.dumps({"u": user_id, "p": proposal_id}, salt=UNSUBSCRIBE_SALT, compress=True)


def unsubscribe_url(*, user_id: int, proposal_id: int) -> str:
    token = unsubscribe_token(user_id=user_id, proposal_id=proposal_id)
    return settings.SITE_URL + reverse("proposals:unsubscribe", kwargs={"token": token})


def unsubscribe_read(token: str) -> tuple[int, int] | None:
    """The (user id, proposal id) a token was signed for, or None for a bad token."""
    try:
        data = signing.loads(token, salt=UNSUBSCRIBE_SALT)
    except signing.BadSignature:
        return None
    if not isinstance(data, dict):
        return None
    user_id, proposal_id = data.get("u"), data.get("p")
    if type(user_id) is not int or type(proposal_id) is not int:
        return None
    return user_id, proposal_id


def unsubscribe(*, token: str) -> Proposal | None:
    """Unfollow by a mail's token; None when the token is not one the site signed."""
    pair = unsubscribe_read(token)
    if pair is None:
        return None
    user_id, proposal_id = pair
    Follow.objects.filter(user_id=user_id, proposal_id=proposal_id).delete()
    return Proposal.objects.filter(pk=proposal_id).only("pk", "title").first()


# --- notices ------------------------------------------------------------------------------


def notice_add(*, proposal: Proposal, key: str, subject: str, body: str) -> Notice | None:
    """Tell the proposal's followers, once per ``key``, after the caller's transaction
    commits. Nothing is stored when nobody follows it."""
    if not Follow.objects.filter(proposal=proposal).exists():
        return None
    link = settings.SITE_URL + proposal.get_absolute_url()
    notice, created = Notice.objects.get_or_create(
        key=key[:200],
        defaults={
            "proposal": proposal,
            "subject": f"[marin-site] {proposal.title}: {subject}"[:300],
            "body": f"{body}\n\n{link}"[:20_000],
        },
    )
    if created:
        notice_id = notice.pk
        transaction.on_commit(lambda: _send_later(notice_id), robust=True)
    return notice


def _send_later(notice_id: int) -> None:
    from proposals.tasks import notice_send_task

    try:
        notice_send_task.apply_async(kwargs={"notice_id": notice_id}, retry=False)
    except Exception:  # the broker is down: notices_reconcile sends it
        logger.warning("could not enqueue mailing notice %s; the reconciler will", notice_id)


def _mail(notice: Notice, user: User) -> EmailMessage:
    url = unsubscribe_url(user_id=user.pk, proposal_id=notice.proposal_id)
    body = (
        f"{notice.body}\n\n--\nYou follow this proposal on marin-site. "
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
        User.objects.filter(follows__proposal_id=notice.proposal_id, is_active=True)
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
