"""The follow button of a campaign's page: `{% campaign_follow_box campaign %}`.

A tag, so the campaign's view (in ``runs``, which never imports ``proposals``) need not ask
who follows what; a signed-out visitor costs no query."""

from __future__ import annotations

from typing import Any

from django import template
from django.urls import reverse

from proposals import follows

register = template.Library()


@register.inclusion_tag("proposals/_follow_box.html", takes_context=True)
def campaign_follow_box(context: template.Context, campaign: Any) -> dict[str, Any]:
    request = context.get("request")
    user = getattr(request, "user", None)
    signed_in = bool(getattr(user, "is_authenticated", False))
    return {
        "user": user,
        "request": request,
        "following": signed_in and follows.is_following(user=user, campaign_id=campaign.pk),
        "follow_url": reverse("proposals:campaign-follow", args=[campaign.slug]),
        "unfollow_url": reverse("proposals:campaign-unfollow", args=[campaign.slug]),
        "mailed_on": "an alert opens or closes on its runs, or an intervention is recorded",
        "csrf_token": context.get("csrf_token"),
    }
