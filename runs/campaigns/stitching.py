"""One continuous series per key across a campaign's runs, read from the rollups.

A restart resumes from a checkpoint, so its steps overlap the end of the attempt before
it: for each key, an attempt keeps only its steps below the first step of every later
attempt (the later attempt wins the overlap). Steps are the trainer's own, so they run on
across restarts; the x axis is the tokens seen (``Campaign.tokens_key``, itself stitched
and interpolated at each point's step), or the step when the runs do not log tokens.

Charts read ``runs.series``' rollups (``MetricSeries``), never points: a campaign of 3
attempts x 60 keys x 1.2M steps is a few hundred kilobytes of buckets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from runs.campaigns.models import Campaign
from runs.models import MetricPoint, MetricSeries, Run
from runs.series.charts import chart_series

MIXTURE_PREFIX = "mixture/weight/"


@dataclass(frozen=True, slots=True)
class Member:
    """An attempt of the campaign, as plain values."""

    run_id: int
    source_id: int  # whose points it shows: itself, or the run a cached run reuses
    order: int
    phase: str
    state: str
    data_mix: dict[str, float] = field(default_factory=dict)  # its phase config's


def campaign_members(*, campaign_id: int) -> list[Member]:
    rows = (
        Run.objects.filter(campaign_members__campaign_id=campaign_id)
        .order_by("campaign_members__order")
        .values_list(
            "pk",
            "cached_from_id",
            "campaign_members__order",
            "campaign_members__phase",
            "state",
            "campaign_members__data_mix",
        )
    )
    return [
        Member(pk, cached or pk, order, phase, state, mix or {})
        for pk, cached, order, phase, state, mix in rows
    ]


def cutoffs(members: Sequence[Member], first_step: dict[int, int]) -> dict[int, float]:
    """Each attempt's first superseded step: the lowest first step of any later attempt."""
    out: dict[int, float] = {}
    lowest = float("inf")
    for member in reversed(members):
        out[member.source_id] = min(out.get(member.source_id, float("inf")), lowest)
        if member.source_id in first_step:
            lowest = min(lowest, first_step[member.source_id])
    return out


def _stitch(
    members: Sequence[Member],
    arrays: dict[tuple[int, str], dict[str, np.ndarray]],
    origins: dict[tuple[int, str], int],
    key: str,
) -> dict[str, np.ndarray] | None:
    first = {
        m.source_id: origins[(m.source_id, key)] for m in members if (m.source_id, key) in origins
    }
    limit = cutoffs(members, first)
    parts = []
    for member in members:
        found = arrays.get((member.source_id, key))
        if found is None or not len(found["step"]):
            continue
        keep = found["step"] < limit[member.source_id]
        parts.append({name: values[keep] for name, values in found.items()})
    if not parts:
        return None
    return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}


def stitched_series(
    *, campaign: Campaign, members: Sequence[Member], keys: Sequence[str], points: int
) -> tuple[dict[str, dict[str, Any]], dict[tuple[int, str], int]]:
    """Each key's stitched chart arrays (step, tokens, value, min, max; absent keys left
    out), and each (run, key)'s first step. Two queries whatever the number of attempts."""
    sources = {m.source_id for m in members}
    wanted = list(dict.fromkeys([*keys, campaign.tokens_key]))
    arrays = chart_series(source_ids=sources, keys=wanted, points=points)
    origins = {
        (run_id, key): origin
        for run_id, key, origin in MetricSeries.objects.filter(
            run_id__in=sources, key__in=wanted
        ).values_list("run_id", "key", "origin")
    }
    tokens = _stitch(members, arrays, origins, campaign.tokens_key)
    out: dict[str, dict[str, Any]] = {}
    for key in keys:
        found = _stitch(members, arrays, origins, key)
        if found is None:
            continue
        if tokens is not None and len(tokens["step"]):
            found["tokens"] = tokens_at(found["step"], tokens["step"], tokens["value"])
        out[key] = found
    return out, origins


def tokens_at(steps: np.ndarray, token_steps: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """The tokens seen at each of ``steps``, read off the stitched tokens series: interpolated
    inside it, and extended at its slope outside it (a key logged before the first or after
    the last tokens point), never held flat: points held at one x would draw a vertical
    segment at the edge of the chart."""
    out = np.interp(steps, token_steps, tokens)
    if len(token_steps) < 2 or token_steps[-1] == token_steps[0]:
        per_step = tokens[-1] / token_steps[-1] if len(token_steps) and token_steps[-1] else 0.0
        return np.maximum(out + (steps - token_steps[-1]) * per_step, 0.0)
    slope = (tokens[-1] - tokens[0]) / (token_steps[-1] - token_steps[0])
    before = steps < token_steps[0]
    after = steps > token_steps[-1]
    out[before] = tokens[0] + (steps[before] - token_steps[0]) * slope
    out[after] = tokens[-1] + (steps[after] - token_steps[-1]) * slope
    return np.maximum(out, 0.0)


def phase_mixture(
    *,
    members: Sequence[Member],
    origins: dict[tuple[int, str], int],
    loss: dict[str, Any] | None,
    loss_key: str,
) -> dict[str, dict[str, np.ndarray]]:
    """The data mix of each attempt's phase config as ``mixture/weight/<source>`` series, for
    campaigns whose runs log no weights: each attempt's weights, as fractions of their sum,
    from its first step to the last step it keeps in the stitched ``loss`` (a later attempt
    takes over from its own first step). Attempts without a mix leave a gap."""
    if loss is None or not len(loss["step"]):
        return {}
    first = {
        m.source_id: origins[(m.source_id, loss_key)]
        for m in members
        if (m.source_id, loss_key) in origins
    }
    limit = cutoffs(members, first)
    last_step = int(loss["step"][-1])
    spans: list[tuple[int, int, dict[str, float]]] = []
    for member in members:
        total = sum(member.data_mix.values())
        if member.source_id not in first or not total > 0:
            continue
        start = first[member.source_id]
        stop = int(min(limit[member.source_id] - 1, last_step))
        if stop >= start:
            mix = {name: weight / total for name, weight in member.data_mix.items()}
            spans.append((start, stop, mix))
    if not spans:
        return {}
    spans.sort(key=lambda span: span[0])
    steps = np.array([step for start, stop, _ in spans for step in (start, stop)], dtype=np.int64)
    tokens = tokens_at(steps, loss["step"], loss["tokens"]) if "tokens" in loss else None
    out: dict[str, dict[str, np.ndarray]] = {}
    for name in sorted({name for _, _, mix in spans for name in mix}):
        values = np.array(
            [mix.get(name, 0.0) for _, _, mix in spans for _ in (0, 1)], dtype=np.float64
        )
        series = {"step": steps, "value": values, "min": values, "max": values}
        if tokens is not None:
            series["tokens"] = tokens
        out[f"{MIXTURE_PREFIX}{name}"] = series
    return out


def window_points(
    *, members: Sequence[Member], key: str, start: int, stop: int
) -> tuple[np.ndarray, np.ndarray]:
    """The stitched raw points of ``key`` with ``start <= step < stop`` (one query): each
    attempt keeps its steps below the lowest step a later attempt has in the window."""
    by_run: dict[int, list[tuple[int, float]]] = {}
    rows = (
        MetricPoint.objects.filter(
            run_id__in={m.source_id for m in members}, key=key, step__gte=start, step__lt=stop
        )
        .order_by("run_id", "step")
        .values_list("run_id", "step", "value")
    )
    for run_id, step, value in rows:
        by_run.setdefault(run_id, []).append((step, value))
    first = {run_id: pairs[0][0] for run_id, pairs in by_run.items()}
    limit = cutoffs(members, first)
    steps: list[int] = []
    values: list[float] = []
    seen: set[int] = set()
    for member in members:
        if member.source_id in seen:
            continue
        seen.add(member.source_id)
        for step, value in by_run.get(member.source_id, []):
            if step < limit[member.source_id]:
                steps.append(step)
                values.append(value)
    order = np.argsort(np.array(steps, dtype=np.int64), kind="stable")
    return np.array(steps, dtype=np.int64)[order], np.array(values, dtype=np.float64)[order]
