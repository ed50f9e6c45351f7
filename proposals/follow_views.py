"""The doors of following: the follow and unfollow buttons of a proposal's or a campaign's
page (signed in, POST with CSRF) and a mail's unsubscribe link (a signed token, signed out)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods, require_POST

from proposals import follows
from proposals.models import Proposal
from runs.campaigns.models import Campaign


@login_required
@require_POST
def proposal_follow(request: HttpRequest, pk: int, follow: bool) -> HttpResponse:
    try:
        follows.follow_set(user=request.user, proposal_id=pk, follow=follow)
    except Proposal.DoesNotExist as exc:
        raise Http404("No such proposal.") from exc
    if follow:
        where = getattr(request.user, "email", "") or "your account's address (none is set yet)"
        messages.success(request, f"You follow this proposal: its changes are mailed to {where}.")
    else:
        messages.success(request, "You no longer follow this proposal.")
    return redirect("proposals:detail", pk=pk)


@login_required
@require_POST
def campaign_follow(request: HttpRequest, slug: str, follow: bool) -> HttpResponse:
    campaign = Campaign.objects.filter(slug=slug).only("pk", "slug").first()
    if campaign is None:
        raise Http404("No such campaign.")
    follows.follow_set(user=request.user, campaign_id=campaign.pk, follow=follow)
    if follow:
        where = getattr(request.user, "email", "") or "your account's address (none is set yet)"
        messages.success(
            request,
            f"You follow this campaign: its alerts and interventions are mailed to {where}.",
        )
    else:
        messages.success(request, "You no longer follow this campaign.")
    return redirect(campaign.get_absolute_url())


# A mail program posts RFC 8058's one-click unsubscribe without any cookie or CSRF token: the
# signed token in the address is what authorizes it. A GET only shows the button, so a link
# scanner that opens the address unsubscribes nobody.
@csrf_exempt
@require_http_methods(["GET", "POST"])
def unsubscribe(request: HttpRequest, token: str) -> HttpResponse:
    found = follows.unsubscribe_read(token)
    if found is None:
        return render(request, "proposals/unsubscribe.html", {"invalid": True}, status=400)
    context = {
        "followed": found.followed(),
        "what": "proposal" if found.proposal_id is not None else "campaign",
    }
    if request.method == "POST":
        follows.unsubscribe(token=token)
        return render(request, "proposals/unsubscribe.html", {**context, "done": True})
    return render(request, "proposals/unsubscribe.html", {**context, "token": token})
