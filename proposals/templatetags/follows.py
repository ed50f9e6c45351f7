"""The follow button of a campaign's page: `{% campaign_follow_box campaign %}`.

A tag, so the campaign's view (in ``runs``, which never imports ``proposals``) need not ask
who follows what; a signed-out visitor costs no query."""

from __future__ import annotations

from typing import Any

from django import template

from proposals import follows

register = template.Library()


@register.inclusion_tag("proposals/_campaign_follow.html", takes_context=True)
def campaign_follow_box(context: template.Context, campaign: Any) -> dict[str, Any]:
    request = context.get("request")
    user = getattr(request, "user", None)
    signed_in = bool(getattr(user, "is_authenticated", False))
    return {
        "campaign": campaign,
        "request": request,
        "signed_in": signed_in,
        "following": signed_in and follows.is_following(user=user, campaign_id=campaign.pk),
        "csrf_token": context.get("csrf_token"),
    }
