"""Writes of campaigns: declare and edit one, attach its runs, record an intervention.

Every door (the admin, the API) comes here, and each function checks the named permission
itself, so a door that forgets cannot act.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from marin_site.roles import permission_require
from runs.campaigns.models import Campaign, CampaignRun, Intervention, Phase
from runs.campaigns.permissions import MANAGE_CAMPAIGNS, RECORD_INTERVENTION
from runs.metrics.parse import METRIC_KEY
from runs.models import Run
from runs.signals import intervention_recorded

CAMPAIGN_FIELDS = (
    "slug",
    "name",
    "description",
    "target_tokens",
    "target_flops",
    "hardware",
    "recipe_config",
    "loss_key",
    "tokens_key",
    "telemetry_keys",
    "ladder_plan",
    "links",
    "is_active",
)
MAX_LINKS = 20
MAX_TELEMETRY_KEYS = 20


def links_validate(links: Any, *, field: str = "links") -> list[dict[str, str]]:
    """A list of {label, url}: the url http(s) or a path on this site, nothing else."""
    if not isinstance(links, list) or len(links) > MAX_LINKS:
        raise ValidationError({field: f"a list of at most {MAX_LINKS} {{label, url}} objects"})
    clean = []
    for number, link in enumerate(links):
        if not isinstance(link, dict) or not isinstance(link.get("url"), str):
            raise ValidationError({field: f"link {number}: an object with a url"})
        url, label = link["url"].strip(), link.get("label", "")
        if not isinstance(label, str) or len(label) > 200 or len(url) > 1000:
            raise ValidationError({field: f"link {number}: label or url too long"})
        parts = urlsplit(url)
        local = url.startswith("/") and not url.startswith("//") and not parts.scheme
        if not local and (parts.scheme not in {"http", "https"} or not parts.netloc):
            raise ValidationError({field: f"link {number}: an http(s) URL or a /path"})
        clean.append({"label": label.strip() or url, "url": url})
    return clean


def keys_validate(keys: Any, *, field: str) -> list[str]:
    if not isinstance(keys, list) or len(keys) > MAX_TELEMETRY_KEYS:
        raise ValidationError({field: f"a list of at most {MAX_TELEMETRY_KEYS} metric keys"})
    bad = [k for k in keys if not isinstance(k, str) or not METRIC_KEY.match(k)]
    if bad:
        raise ValidationError({field: f"not a metric key: {str(bad[0])[:200]!r}"})
    return list(dict.fromkeys(keys))


def _campaign_check(campaign: Campaign) -> None:
    campaign.links = links_validate(campaign.links)
    campaign.telemetry_keys = keys_validate(campaign.telemetry_keys, field="telemetry_keys")
    for field in ("target_tokens", "target_flops"):
        value = getattr(campaign, field)
        if not isinstance(value, int | float) or not 0 < value < 1e40:
            raise ValidationError({field: "a positive number"})
    if not isinstance(campaign.recipe_config, dict):
        raise ValidationError({"recipe_config": "a JSON object"})
    campaign.full_clean()


def campaign_create(*, actor: Any, data: dict[str, Any]) -> Campaign:
    permission_require(actor, MANAGE_CAMPAIGNS, None, "declare campaigns")
    campaign = Campaign(**{k: v for k, v in data.items() if k in CAMPAIGN_FIELDS})
    campaign.created_by = actor if getattr(actor, "is_authenticated", False) else None
    _campaign_check(campaign)
    campaign.save()
    return campaign


@transaction.atomic
def campaign_update(*, campaign: Campaign, actor: Any, data: dict[str, Any]) -> Campaign:
    permission_require(actor, MANAGE_CAMPAIGNS, campaign, "edit campaigns")
    for field, value in data.items():
        if field in CAMPAIGN_FIELDS:
            setattr(campaign, field, value)
    _campaign_check(campaign)
    campaign.save()
    return campaign


@transaction.atomic
def campaign_run_add(
    *,
    campaign: Campaign,
    run: Run,
    actor: Any,
    phase: str = Phase.PRETRAINING,
    order: int | None = None,
    data_mix: dict[str, float] | None = None,
) -> CampaignRun:
    """Attach a run (an attempt: a restart or the next phase); by default after the others."""
    permission_require(actor, MANAGE_CAMPAIGNS, campaign, "edit campaigns")
    if phase not in Phase.values:
        raise ValidationError({"phase": f"one of {', '.join(Phase.values)}"})
    mix = data_mix or {}
    if not isinstance(mix, dict) or not all(
        isinstance(k, str) and isinstance(v, int | float) and v >= 0 for k, v in mix.items()
    ):
        raise ValidationError({"data_mix": "an object of source -> non-negative weight"})
    if order is None:
        last = campaign.members.order_by("-order").values_list("order", flat=True).first()
        order = 0 if last is None else last + 1
    member, _ = CampaignRun.objects.update_or_create(
        campaign=campaign, run=run, defaults={"phase": phase, "order": order, "data_mix": mix}
    )
    return member


def intervention_record(
    *,
    campaign: Campaign,
    actor: Any,
    step: int,
    kind: str,
    title: str,
    from_value: str = "",
    to_value: str = "",
    keys: Sequence[str] = (),
    window_steps: int = 2000,
    note: str = "",
    links: list[dict[str, str]] | None = None,
    happened_at: datetime | None = None,
) -> Intervention:
    permission_require(actor, RECORD_INTERVENTION, campaign, "record interventions")
    intervention = Intervention(
        campaign=campaign,
        step=step,
        happened_at=happened_at or timezone.now(),
        kind=kind,
        title=title,
        from_value=from_value,
        to_value=to_value,
        keys=keys_validate(list(keys), field="keys"),
        window_steps=window_steps,
        note=note,
        links=links_validate(links or []),
        created_by=actor if getattr(actor, "is_authenticated", False) else None,
    )
    intervention.full_clean(exclude=["campaign", "created_by"])
    with transaction.atomic():
        intervention.save()
        transaction.on_commit(
            partial(
                intervention_recorded.send_robust,
                sender=Intervention,
                intervention_id=intervention.pk,
                campaign_id=campaign.pk,
            )
        )
    return intervention
