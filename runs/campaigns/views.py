"""Web doors of campaigns: the public list and page. Declaring campaigns and recording
interventions happens in the admin and through the API (``runs.campaigns.api``)."""

from __future__ import annotations

import json

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from runs.campaigns import projection, selectors, stitching
from runs.campaigns.permissions import RECORD_INTERVENTION


def campaign_list(request: HttpRequest) -> HttpResponse:
    return render(request, "runs/campaigns/list.html", {"campaigns": selectors.campaign_list()})


def campaign_detail(request: HttpRequest, slug: str) -> HttpResponse:
    campaign = selectors.campaign_get(slug=slug)
    if campaign is None:
        raise Http404("No such campaign.")
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
    mixture = any(key.startswith(stitching.MIXTURE_PREFIX) for key in present)
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
            "chart_keys": keys,
            "has_mixture": mixture,
            "recipe_config": json.dumps(campaign.recipe_config, indent=2),
            "can_record": request.user.has_perm(RECORD_INTERVENTION),
            "live": progress["running"] or any(s[5] for s in summaries),
        },
    )
