"""Web doors of campaigns: the public list and page, and the page's form for recording an
intervention (maintainers). Declaring campaigns happens in the admin and through the API
(``runs.campaigns.api``), which records interventions too."""

from __future__ import annotations

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from marin_site.errors import ActionForbidden
from runs.campaigns import projection, selectors, services, stitching
from runs.campaigns.forms import InterventionForm
from runs.campaigns.models import Campaign
from runs.campaigns.permissions import RECORD_INTERVENTION


def campaign_list(request: HttpRequest) -> HttpResponse:
    return render(request, "runs/campaigns/list.html", {"campaigns": selectors.campaign_list()})


def _campaign(slug: str) -> Campaign:
    campaign = selectors.campaign_get(slug=slug)
    if campaign is None:
        raise Http404("No such campaign.")
    return campaign


def campaign_detail(request: HttpRequest, slug: str) -> HttpResponse:
    return _detail(request, _campaign(slug))


def _detail(
    request: HttpRequest, campaign: Campaign, form: InterventionForm | None = None
) -> HttpResponse:
    can_record = request.user.has_perm(RECORD_INTERVENTION)
    if can_record and form is None:
        form = InterventionForm()
    members = stitching.campaign_members(campaign_id=campaign.pk)
    summaries = selectors.campaign_summaries(members=members)
    present = {key for _, key, _, _, _, _ in summaries}
    found, _ = stitching.stitched_series(
        campaign=campaign, members=members, keys=[selectors.THROUGHPUT_KEY], points=200
    )
    progress = selectors.campaign_progress(
        campaign=campaign,
        members=members,
        summaries=summaries,
        throughput=found.get(selectors.THROUGHPUT_KEY),
    )
    interventions = selectors.interventions_with_effects(
        campaign=campaign, members=members, version=selectors.data_version(summaries)
    )
    projected = projection.campaign_projection(
        plan=campaign.ladder_plan, target_flops=campaign.target_flops
    )
    keys = selectors.chart_keys(campaign=campaign, present=present)
    displays = selectors.campaign_displays(members=members, keys=[*keys, campaign.loss_key])
    mixture = any(key.startswith(stitching.MIXTURE_PREFIX) for key in present) or any(
        member.data_mix for member in members
    )
    return render(
        request,
        "runs/campaigns/detail.html",
        {
            "campaign": campaign,
            "members": campaign.members.select_related("run").order_by("order"),
            "progress": progress,
            "interventions": interventions,
            "projection": projected,
            "open_alerts": selectors.campaign_open_alerts(campaign=campaign),
            "chart_keys": [(key, displays[key]) for key in keys],
            "loss_label": displays[campaign.loss_key].label,
            "has_mixture": mixture,
            "recipe_config": json.dumps(campaign.recipe_config, indent=2),
            "can_record": can_record,
            "intervention_form": form if can_record else None,
            "live": progress["running"] or any(s[5] for s in summaries),
        },
        status=400 if form is not None and form.is_bound else 200,
    )


@login_required
@require_POST
def intervention_add(request: HttpRequest, slug: str) -> HttpResponse:
    """Record an intervention from the campaign page; a refused one comes back with what
    was typed and the reasons beside the fields."""
    campaign = _campaign(slug)
    if not request.user.has_perm(RECORD_INTERVENTION):
        raise PermissionDenied("You do not have permission to record interventions.")
    form = InterventionForm(request.POST)
    if form.is_valid():
        try:
            intervention = services.intervention_record(
                campaign=campaign, actor=request.user, **form.record_kwargs()
            )
        except ActionForbidden as exc:
            raise PermissionDenied(exc.message) from exc
        except ValidationError as exc:
            if not hasattr(exc, "error_dict"):
                form.add_error(None, exc)
            for field, problems in getattr(exc, "error_dict", {}).items():
                form.add_error(field if field in form.fields else None, problems)
        else:
            messages.success(request, f"Intervention recorded at step {intervention.step}.")
            return redirect(intervention.get_absolute_url())
    return _detail(request, campaign, form)
