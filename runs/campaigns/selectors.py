"""Reads of campaigns: lists, progress, the stitched chart data, before/after effects.

``campaign_open_alerts`` is where the alerts (``runs/alerts/``) plug in: the campaign page
and its chart data show whatever it returns.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
from django.core.cache import cache
from django.db.models import QuerySet

from runs.alerts.models import Alert
from runs.campaigns import stitching
from runs.campaigns.models import Campaign, Intervention
from runs.campaigns.stitching import MIXTURE_PREFIX, Member
from runs.metrics import declarations as metric_declarations
from runs.metrics.declarations import MetricDeclaration
from runs.metrics.display import MetricDisplay
from runs.models import TERMINAL_RUN_STATES, MetricSummary, RunState
from runs.series import charts as series_charts

THROUGHPUT_KEY = "throughput/tokens_per_second"
MFU_KEY = "throughput/mfu"
DROP_KEY = "moe/drop_fraction"
STANDARD_KEYS = ("eval/loss", THROUGHPUT_KEY, MFU_KEY, DROP_KEY)
RECENT_BUCKETS = 20  # the tokens/s of the ETA: the mean of the last buckets of the chart
MIN_POINTS_FOR_EFFECT = 5
EFFECT_CACHE_SECONDS = 600
EFFECT_FORMAT = b"display-1"  # bumped when the kept effects' words change

MAX_OPEN_ALERTS = 50  # a page lists at most this many (the run pages have the rest)


# The version (``marin_site.fragments``) of the list of campaigns on the home page, replaced
# after any write to a campaign (``runs.receivers``).
CAMPAIGN_LIST_VERSION = ("campaign-list", 0)


def campaign_list(*, active_only: bool = False) -> QuerySet[Campaign]:
    campaigns = Campaign.objects.all()
    return campaigns.filter(is_active=True) if active_only else campaigns


def campaign_get(*, slug: str) -> Campaign | None:
    return Campaign.objects.filter(slug=slug).select_related("ladder_plan").first()


def campaign_open_alerts(*, campaign: Campaign) -> list[dict[str, Any]]:
    """The open alerts on the campaign's runs (``runs.alerts``), newest first: a title, when
    it opened and the run page that shows it. One query."""
    alerts = (
        Alert.objects.filter(run__campaign_members__campaign=campaign, closed_at__isnull=True)
        .order_by("-opened_at", "-id")
        .distinct()[:MAX_OPEN_ALERTS]
    )
    return [
        {
            "title": f"run {alert.run_id}, {alert.kind}: {alert.message}",
            "opened_at": alert.opened_at,
            "url": alert.get_absolute_url(),
        }
        for alert in alerts
    ]


def campaign_summaries(
    *, members: Sequence[Member]
) -> list[tuple[int, str, int, float, int, bool]]:
    """(run, key, step, last, count, stale) of every key of the attempts; one query."""
    return [
        (run_id, key, step, last, count, stale is not None)
        for run_id, key, step, last, count, stale in MetricSummary.objects.filter(
            run_id__in={m.source_id for m in members}
        ).values_list("run_id", "key", "step", "last", "count", "stale_from")
    ]


def chart_keys(*, campaign: Campaign, present: set[str]) -> list[str]:
    wanted = [campaign.loss_key, *STANDARD_KEYS, *campaign.telemetry_keys]
    return [key for key in dict.fromkeys(wanted) if key in present]


def _latest_value(
    summaries: Sequence[tuple[int, str, int, float, int, bool]], key: str
) -> tuple[int, float] | None:
    """The value at the highest step any attempt logged for ``key``."""
    found = [(step, last) for _, k, step, last, _, _ in summaries if k == key]
    return max(found) if found else None


def campaign_progress(
    *,
    campaign: Campaign,
    members: Sequence[Member],
    summaries: Sequence[tuple[int, str, int, float, int, bool]],
    throughput: dict[str, Any] | None,
) -> dict[str, Any]:
    """Tokens and FLOPs so far against the target, the ETA from the recent tokens/s, and the
    current phase (the latest attempt that started)."""
    latest = _latest_value(summaries, campaign.tokens_key)
    tokens = latest[1] if latest else None
    step = max((s for _, _, s, _, _, _ in summaries), default=None)
    per_token = campaign.flops_per_token
    flops = tokens * per_token if tokens is not None and per_token else None
    rate = None
    if throughput is not None and len(throughput["value"]):
        recent = np.asarray(throughput["value"][-RECENT_BUCKETS:])
        rate = float(np.mean(recent)) if len(recent) else None
    remaining = campaign.target_tokens - tokens if tokens is not None else None
    eta = None
    if remaining is not None and rate and rate > 0 and math.isfinite(rate):
        eta = max(0.0, remaining / rate)
    started = [m for m in members if m.state != RunState.QUEUED]
    current = started[-1] if started else (members[0] if members else None)
    return {
        "step": step,
        "tokens": tokens,
        "target_tokens": campaign.target_tokens,
        "tokens_fraction": min(1.0, tokens / campaign.target_tokens) if tokens else 0.0,
        "flops": flops,
        "target_flops": campaign.target_flops,
        "flops_fraction": min(1.0, flops / campaign.target_flops) if flops else 0.0,
        "tokens_per_second": rate,
        "eta_seconds": eta,
        "phase": current.phase if current else None,
        "running": any(m.state not in TERMINAL_RUN_STATES for m in members),
    }


def campaign_displays(
    *, members: Sequence[Member], keys: Sequence[str]
) -> dict[str, MetricDisplay]:
    """How each key is shown (``runs.metrics.display``): as the recipe of the campaign's
    latest attempt declares it (its attempts are restarts of one recipe)."""
    declarations = (
        metric_declarations.declarations_for_run(run_id=members[-1].source_id) if members else {}
    )
    return {key: MetricDisplay.of(key, declarations.get(key)) for key in keys}


def campaign_chart_data(*, campaign: Campaign, points: int) -> bytes:
    """The page's chart data as JSON bytes: the stitched series of the chart keys and the
    mixture weights (logged, or else the phases' data mix), the attempts' boundaries, the
    interventions and the progress.
    Four queries whatever the number of attempts and keys."""
    members = stitching.campaign_members(campaign_id=campaign.pk)
    summaries = campaign_summaries(members=members)
    present = {key for _, key, _, _, _, _ in summaries}
    keys = chart_keys(campaign=campaign, present=present)
    mixture = sorted(key for key in present if key.startswith(MIXTURE_PREFIX))
    found, origins = stitching.stitched_series(
        campaign=campaign, members=members, keys=[*keys, *mixture], points=points
    )
    if not mixture:  # the runs log no weights: the phases' configs say what the mix was
        from_phases = stitching.phase_mixture(
            members=members,
            origins=origins,
            loss=found.get(campaign.loss_key),
            loss_key=campaign.loss_key,
        )
        found |= from_phases
        mixture = sorted(from_phases)
    tokens_of = _tokens_at(found)
    shown = campaign_displays(members=members, keys=[k for k in keys if k in found])
    for key, display in shown.items():  # chart data is in the unit the page shows
        if display.factor != 1.0:
            for part in ("value", "min", "max"):
                found[key][part] = found[key][part] * display.factor
    interventions = [
        {
            "id": i.pk,
            "step": i.step,
            "tokens": tokens_of(i.step),
            "title": i.title,
            "kind": i.kind,
            "from": i.from_value,
            "to": i.to_value,
        }
        for i in campaign.interventions.order_by("step", "pk")
    ]
    first_steps = {run: step for (run, key), step in origins.items() if key == campaign.loss_key}
    restarts = [
        {
            "run": m.run_id,
            "order": m.order,
            "phase": m.phase,
            "step": first_steps.get(m.source_id),
            "tokens": tokens_of(first_steps[m.source_id]) if m.source_id in first_steps else None,
            "state": m.state,  # the page's attempts table follows it
        }
        for m in members
    ]
    progress = campaign_progress(
        campaign=campaign,
        members=members,
        summaries=summaries,
        throughput=found.get(THROUGHPUT_KEY),
    )
    stale = any(s[5] for s in summaries)
    payload = {
        "campaign": campaign.slug,
        "loss_key": campaign.loss_key,
        "active": progress["running"] or stale,
        "x": "tokens" if any("tokens" in s for s in found.values()) else "step",
        "keys": [k for k in keys if k in found],
        "metrics": {key: display.chart_meta() for key, display in shown.items()},
        "mixture": [k for k in mixture if k in found],
        "series": found,
        "interventions": interventions,
        "restarts": restarts,
        "progress": progress,
        "flops_per_token": campaign.flops_per_token,
        # The page's open alerts follow the same poll (titles and links; opened_at as ISO).
        "alerts": [
            {"title": a["title"], "url": a["url"], "opened_at": a["opened_at"].isoformat()}
            for a in campaign_open_alerts(campaign=campaign)
        ],
    }
    return orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)


def _tokens_at(found: dict[str, dict[str, Any]]) -> Any:
    reference = next((s for s in found.values() if "tokens" in s and len(s["step"])), None)

    def tokens_of(step: int | None) -> float | None:
        if reference is None or step is None:
            return None
        steps = np.asarray([step], dtype=np.float64)
        return float(stitching.tokens_at(steps, reference["step"], reference["tokens"])[0])

    return tokens_of


# --- interventions: before and after -----------------------------------------------------


def _stats(values: np.ndarray) -> dict[str, float | int]:
    p25, median, p75 = np.percentile(values, [25, 50, 75])
    return {"median": float(median), "p25": float(p25), "p75": float(p75), "n": len(values)}


def intervention_effect(
    *,
    intervention: Intervention,
    members: Sequence[Member],
    key: str,
    declaration: MetricDeclaration | None = None,
) -> dict[str, Any]:
    """Median (and interquartile range) of ``key`` over the ``window_steps`` before the
    intervention's step against the same number after, from the stitched points; the text
    writes them in the unit the recipe declares (``declaration``)."""
    window = int(intervention.window_steps)
    steps, values = stitching.window_points(
        members=members,
        key=key,
        start=intervention.step - window,
        stop=intervention.step + window,
    )
    finite = np.isfinite(values)
    before = values[(steps < intervention.step) & finite]
    after = values[(steps >= intervention.step) & finite]
    effect: dict[str, Any] = {"key": key, "window_steps": window, "before": None, "after": None}
    if len(before) >= MIN_POINTS_FOR_EFFECT:
        effect["before"] = _stats(before)
    if len(after) >= MIN_POINTS_FOR_EFFECT:
        effect["after"] = _stats(after)
    display = MetricDisplay.of(key, declaration)
    effect["label"] = display.label
    if effect["before"] and effect["after"]:
        b, a = effect["before"]["median"], effect["after"]["median"]
        effect["change"] = (a - b) / abs(b) if b else None
        effect["text"] = f"{display.text(b)} → {display.text(a)}"
        for side in ("before", "after"):
            stats = effect[side]
            stats["range"] = display.range_text(stats["p25"], stats["p75"])
    else:
        effect["text"] = f"not enough points yet (at least {MIN_POINTS_FOR_EFFECT} each side)"
    return effect


def interventions_with_effects(
    *, campaign: Campaign, members: Sequence[Member], version: str
) -> list[tuple[Intervention, list[dict[str, Any]]]]:
    """Each intervention with the before/after of each key it concerns. Cached by the
    attempts' data version (their keys' last steps and counts), so a page read that brings
    nothing new costs one cache read."""
    out = []
    declarations: dict[str, MetricDeclaration] | None = None
    for intervention in campaign.interventions.order_by("step", "pk"):
        spec = orjson.dumps(
            [intervention.pk, intervention.step, intervention.window_steps, intervention.keys]
        )
        digest = hashlib.sha256(spec + version.encode() + EFFECT_FORMAT).hexdigest()[:32]
        cache_key = f"campaigns:effect:{digest}"
        effects = cache.get(cache_key)
        if effects is None:
            if declarations is None:
                declarations = (
                    metric_declarations.declarations_for_run(run_id=members[-1].source_id)
                    if members
                    else {}
                )
            effects = [
                intervention_effect(
                    intervention=intervention,
                    members=members,
                    key=key,
                    declaration=declarations.get(key),
                )
                for key in intervention.keys
            ]
            cache.set(cache_key, effects, EFFECT_CACHE_SECONDS)
        out.append((intervention, effects))
    return out


def data_version(summaries: Sequence[tuple[int, str, int, float, int, bool]]) -> str:
    parts = sorted(f"{run}:{key}:{step}:{count}" for run, key, step, _, count, _ in summaries)
    return hashlib.sha256("|".join(parts).encode()).hexdigest()


def chart_points_default() -> int:
    return series_charts.DEFAULT_POINTS
