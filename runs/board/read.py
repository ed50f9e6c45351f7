"""The board's read model: a track's entries, ranked, from finished runs only, each with its
provenance (who ran it, where, at which commit, with which config, and whether the site
vouches for it). Nothing is stored: the entries are read from the runs when asked.

A run is **verified** when the site launched it itself at a pinned commit (``origin ==
"launched"`` with a ``git_sha``); a claimed or imported run, or one without a commit, is
**unverified** and labelled so. Failed, killed and crashed runs are never entries.

Ranking follows the track's rule: ``speedrun_threshold`` (``runs.verdicts.speedrun``) keeps
the runs whose final value of the metric is at most the threshold and ranks them by training
FLOPs, fewest first, then by the value; ``lowest`` ranks every finished run by its final
value. A run's FLOPs are its ``model_flops`` as Marin's speedrun reports them when it has
them, else its plan entry's estimate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from runs.board.models import BoardTrack, TrackRule
from runs.models import MetricSummary, Run, RunOrigin, RunState
from runs.pools.models import Lease
from runs.verdicts.base import Refusal
from runs.verdicts.rules import rule_get

FLOPS_KEY = "model_flops"
HARDWARE_FLOPS_KEY = "training_hardware_flops"
TIME_KEY = "training_time"
SIZE_KEY = "model_size"


def parameters_clean(rule: str, given: Any) -> dict[str, Any]:
    """The track's parameters checked by its rule (``lowest`` takes none); raises
    ``ValueError`` naming the parameter."""
    if rule == TrackRule.LOWEST:
        if given:
            raise ValueError("the rule lowest takes no parameters")
        return {}
    if not isinstance(given, Mapping):
        raise ValueError("parameters must be a JSON object")
    try:
        return rule_get(rule).parameters_clean(given)
    except Refusal as refusal:
        raise ValueError(str(refusal)) from refusal


@dataclass
class Entry:
    """One run on one track, with where its figures come from."""

    rank: int
    run_id: int
    plan_id: int
    recipe: str
    value: float
    flops: float | None
    verified: bool
    origin: str
    ran_by: str
    executor: str
    pool: str
    agent: str
    git_sha: str
    config_hash: str
    finished_at: Any
    wandb_url: str
    imported_from: str
    model_size: float | None
    training_time: float | None
    training_hardware_flops: float | None

    @property
    def label(self) -> str:
        return "verified" if self.verified else "unverified"

    def as_dict(self) -> dict[str, Any]:
        row = asdict(self)
        row["label"] = self.label
        row["finished_at"] = self.finished_at.isoformat() if self.finished_at else None
        return row


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def verified(run: Run) -> bool:
    return run.origin == RunOrigin.LAUNCHED and bool(run.git_sha)


def ran_by(run: Run) -> str:
    """Who ran it, as the run says: the claimant of a claimed run, the author tag of an
    imported one; a launched run was run by the site (its proposal's author is shown beside
    it by the pages, which may read proposals)."""
    if run.origin == RunOrigin.CLAIMED:
        return run.claimed_by.get_username() if run.claimed_by else "a claimant (account removed)"
    if run.origin == RunOrigin.IMPORTED:
        tags = run.tracker_tags if isinstance(run.tracker_tags, dict) else {}
        author = tags.get("author")
        if isinstance(author, dict):
            author = author.get("name")
        return str(author)[:200] if author else "unknown (imported)"
    return "the site"


def _candidates(track: BoardTrack) -> list[Run]:
    runs = Run.objects.filter(state=RunState.FINISHED)
    if track.recipe_name:
        runs = runs.filter(recipe_name=track.recipe_name)
    return list(
        runs.select_related("entry", "claimed_by")
        .only(
            "pk",
            "plan_id",
            "recipe_name",
            "recipe_version",
            "origin",
            "git_sha",
            "config_hash",
            "executor",
            "finished_at",
            "final_metrics",
            "tracker_tags",
            "wandb_url",
            "imported_from",
            "claimed_by__username",
            "entry__flops",
        )
        .order_by("pk")
    )


def _values(track: BoardTrack, runs: list[Run]) -> dict[int, float]:
    """Each run's final value of the track's metric: the run's own final metrics (a tracker's
    summary, an import), else the last value logged."""
    values: dict[int, float] = {}
    missing = []
    for run in runs:
        metrics = run.final_metrics if isinstance(run.final_metrics, dict) else {}
        value = _number(metrics.get(track.metric))
        if value is None:
            missing.append(run.pk)
        else:
            values[run.pk] = value
    if missing:
        for run_id, last in MetricSummary.objects.filter(
            run_id__in=missing, key=track.metric
        ).values_list("run_id", "last"):
            value = _number(last)
            if value is not None:
                values[run_id] = value
    return values


def _where(run_ids: Iterable[int]) -> dict[int, tuple[str, str]]:
    """The pool and agent of each run's last lease (runs on a pool only)."""
    found: dict[int, tuple[str, str]] = {}
    ids = list(run_ids)
    for start in range(0, len(ids), 2000):
        for run_id, agent, pool in (
            Lease.objects.filter(run_id__in=ids[start : start + 2000])
            .order_by("run_id", "-pk")
            .values_list("run_id", "agent__name", "agent__pool__name")
        ):
            found.setdefault(run_id, (pool, agent))
    return found


def track_entries(track: BoardTrack, *, limit: int | None = None) -> list[Entry]:
    """The track's ranked entries (the first ``limit`` of them when given)."""
    params = parameters_clean(track.rule, track.parameters)
    runs = _candidates(track)
    values = _values(track, runs)
    scored = []
    for run in runs:
        value = values.get(run.pk)
        if value is None:
            continue
        metrics = run.final_metrics if isinstance(run.final_metrics, dict) else {}
        flops = _number(metrics.get(FLOPS_KEY))
        if flops is None:
            flops = _number(run.entry.flops) if run.entry_id else None
        if track.rule == TrackRule.SPEEDRUN_THRESHOLD:
            if value > params["threshold"] or flops is None or flops <= 0:
                continue
            key: tuple[Any, ...] = (flops, value, run.pk)
        else:
            key = (value, run.pk)
        scored.append((key, run, value, flops, metrics))
    scored.sort(key=lambda row: row[0])
    if limit is not None:
        scored = scored[:limit]
    where = _where(row[1].pk for row in scored)
    entries = []
    for rank, (_key, run, value, flops, metrics) in enumerate(scored, start=1):
        pool, agent = where.get(run.pk, ("", ""))
        entries.append(
            Entry(
                rank=rank,
                run_id=run.pk,
                plan_id=run.plan_id,
                recipe=f"{run.recipe_name} {run.recipe_version}",
                value=value,
                flops=flops,
                verified=verified(run),
                origin=run.origin,
                ran_by=ran_by(run),
                executor=run.executor,
                pool=pool,
                agent=agent,
                git_sha=run.git_sha,
                config_hash=run.config_hash,
                finished_at=run.finished_at,
                wandb_url=run.wandb_url,
                imported_from=run.imported_from,
                model_size=_number(metrics.get(SIZE_KEY)),
                training_time=_number(metrics.get(TIME_KEY)),
                training_hardware_flops=_number(metrics.get(HARDWARE_FLOPS_KEY)),
            )
        )
    return entries


def tracks_active() -> list[BoardTrack]:
    return list(BoardTrack.objects.filter(active=True))
