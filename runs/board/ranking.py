"""A track's ranking computed from the runs: finished runs only, each with its provenance.

Nothing here writes; ``runs.board.rank`` stores what ``track_ranking`` answers.

A run is **verified** when the site launched it itself at a pinned commit: ``origin ==
"launched"``, a ``git_sha``, a checkout not known to be dirty, and no config reported other
than the plan's. A claimed run (executed by hand elsewhere), an imported one, or a launched
one without those is **unverified** and labelled so. Failed, killed and crashed runs are
never entries: they stay on their proposal's page.

The rules (``TrackRule``):

- ``speedrun_threshold`` (``runs.verdicts.speedrun``): runs whose final value of the metric
  is at most ``threshold``, ranked by training FLOPs, fewest first, then by the value.
- ``lowest``: every finished run by its final value, lowest first.
- ``effective_speedup`` (``runs.verdicts.gates``' law): the compute a pinned baseline would
  need to reach the run's loss, ``baseline_budget * ((baseline_loss - L_inf) / (loss -
  L_inf)) ** (1 / alpha)``, over the run's own FLOPs; highest first. At the baseline's own
  budget it is the gate's stepwise speedup.
- ``projected_loss``: one entry per plan with finished runs at two or more budgets: the law
  with the asymptote pinned refitted on them (``pinned_fit``) and projected to ``budget``;
  lowest first. The entry is the plan's run at its largest budget, verified only when every
  run of the fit is.

A run's FLOPs are its ``model_flops`` as Marin's speedrun reports them when it has them,
else its plan entry's estimate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from runs.board.models import BoardTrack, TrackRule
from runs.board.parameters import parameters_clean
from runs.models import MetricSummary, Run, RunOrigin, RunState
from runs.pools.models import Lease
from runs.verdicts.gates import pinned_fit

FLOPS_KEY = "model_flops"
HARDWARE_FLOPS_KEY = "training_hardware_flops"
TIME_KEY = "training_time"
SIZE_KEY = "model_size"


@dataclass
class Ranked:
    """One run's place on one track, with where its figures come from."""

    rank: int
    run_id: int
    plan_id: int
    score: float
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
    recipe: str
    run_name: str
    description: str
    author_affiliation: str
    author_url: str
    results_filepath: str
    finished_at: Any
    wandb_url: str
    imported_from: str
    model_size: float | None
    training_time: float | None
    training_hardware_flops: float | None
    note: str = ""

    @property
    def label(self) -> str:
        return "verified" if self.verified else "unverified"


def number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        found = float(value)
    except OverflowError:
        return None
    return found if math.isfinite(found) else None


def verified(run: Run) -> bool:
    """Launched by the site at a pinned commit, from a checkout not known to be dirty, with no
    config reported other than the plan's."""
    return (
        run.origin == RunOrigin.LAUNCHED
        and bool(run.git_sha)
        and run.git_clean is not False
        and (not run.reported_config_hash or run.reported_config_hash == run.config_hash)
    )


def _tags(run: Run) -> dict[str, Any]:
    return run.tracker_tags if isinstance(run.tracker_tags, dict) else {}


def ran_by(run: Run) -> str:
    """Who ran it, as the run says: the claimant of a claimed run, the author tag of an
    imported one; a launched run was run by the site (the pages show its proposal's author
    beside it)."""
    if run.origin == RunOrigin.CLAIMED:
        return run.claimed_by.get_username() if run.claimed_by else "a claimant (account removed)"
    if run.origin == RunOrigin.IMPORTED:
        author = _tags(run).get("author")
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
            "entry_id",
            "recipe_name",
            "recipe_version",
            "origin",
            "git_sha",
            "git_clean",
            "config_hash",
            "reported_config_hash",
            "executor",
            "claim_where",
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


def _values(metric: str, runs: list[Run]) -> dict[int, float]:
    """Each run's final value of ``metric``: the run's own final metrics (a tracker's summary,
    an import), else the last value logged."""
    values: dict[int, float] = {}
    missing = []
    for run in runs:
        metrics = run.final_metrics if isinstance(run.final_metrics, dict) else {}
        value = number(metrics.get(metric))
        if value is None:
            missing.append(run.pk)
        else:
            values[run.pk] = value
    for start in range(0, len(missing), 5000):
        for run_id, last in MetricSummary.objects.filter(
            run_id__in=missing[start : start + 5000], key=metric
        ).values_list("run_id", "last"):
            value = number(last)
            if value is not None:
                values[run_id] = value
    return values


def _where(run_ids: Iterable[int]) -> dict[int, tuple[str, str]]:
    """The pool and agent of each run's last lease (runs on a pool only)."""
    found: dict[int, tuple[str, str]] = {}
    ids = list(run_ids)
    for start in range(0, len(ids), 5000):
        for run_id, agent, pool in (
            Lease.objects.filter(run_id__in=ids[start : start + 5000])
            .order_by("run_id", "-pk")
            .values_list("run_id", "agent__name", "agent__pool__name")
        ):
            found.setdefault(run_id, (pool, agent))
    return found


def _flops(run: Run) -> float | None:
    metrics = run.final_metrics if isinstance(run.final_metrics, dict) else {}
    found = number(metrics.get(FLOPS_KEY))
    if found is None and run.entry_id:
        found = number(run.entry.flops)
    return found if found is not None and found > 0 else None


Scored = tuple[tuple[Any, ...], Run, float, float, float | None, str, bool]


def _scored(
    track: BoardTrack, params: dict[str, Any], runs: list[Run], values: dict[int, float]
) -> list[Scored]:
    """(sort key, run, score, value, flops, note, verified) of each run the rule ranks."""
    rows: list[Scored] = []
    if track.rule == TrackRule.PROJECTED_LOSS:
        return _projected(params, runs, values)
    for run in runs:
        value = values.get(run.pk)
        if value is None:
            continue
        flops = _flops(run)
        note = ""
        if track.rule == TrackRule.SPEEDRUN_THRESHOLD:
            if value > params["threshold"] or flops is None:
                continue
            score = flops
            key: tuple[Any, ...] = (flops, value, run.pk)
        elif track.rule == TrackRule.EFFECTIVE_SPEEDUP:
            floor, alpha = params["asymptote"], params["alpha"]
            if flops is None or value <= floor:
                continue
            try:
                needed = params["baseline_budget"] * (
                    (params["baseline_loss"] - floor) / (value - floor)
                ) ** (1.0 / alpha)
            except OverflowError:
                continue
            score = needed / flops
            if not math.isfinite(score):
                continue
            note = (
                f"the baseline needs {needed:.4g} FLOPs for {value:.4g}; the run used {flops:.4g}"
            )
            key = (-score, run.pk)
        else:
            score = value
            key = (value, run.pk)
        rows.append((key, run, score, value, flops, note, verified(run)))
    return rows


def _projected(params: dict[str, Any], runs: list[Run], values: dict[int, float]) -> list[Scored]:
    """One row per plan with finished runs at two or more budgets (mean loss per budget)."""
    by_plan: dict[int, list[tuple[float, float, Run]]] = {}
    for run in runs:
        value, flops = values.get(run.pk), _flops(run)
        if value is not None and flops is not None and value > params["asymptote"]:
            by_plan.setdefault(run.plan_id, []).append((flops, value, run))
    rows: list[Scored] = []
    for plan_id, points in by_plan.items():
        budgets: dict[float, list[float]] = {}
        for flops, value, _ in points:
            budgets.setdefault(flops, []).append(value)
        if len(budgets) < 2:
            continue
        xs = np.array(sorted(budgets))
        ys = np.array([sum(budgets[b]) / len(budgets[b]) for b in sorted(budgets)])
        with np.errstate(all="ignore"):
            coefficient, alpha, _r2 = pinned_fit(xs, ys, params["asymptote"])
            projected = params["asymptote"] + coefficient * params["budget"] ** (-alpha)
        if not math.isfinite(projected):
            continue
        top = max(points, key=lambda p: (p[0], p[2].pk))
        note = (
            f"loss = {params['asymptote']:g} + {coefficient:.4g} * C^-{alpha:.4g} on "
            f"{len(xs)} budgets; at {params['budget']:.3g} FLOPs: {projected:.4f}"
        )
        everyone = all(verified(run) for _, _, run in points)
        rows.append(((projected, plan_id), top[2], projected, top[1], top[0], note, everyone))
    return rows


def track_ranking(track: BoardTrack) -> list[Ranked]:
    """The track's ranked entries, best first, computed from the runs."""
    params = parameters_clean(track.rule, track.parameters)
    runs = _candidates(track)
    values = _values(track.metric, runs)
    scored = _scored(track, params, runs, values)
    scored.sort(key=lambda row: row[0])
    where = _where(row[1].pk for row in scored)
    ranked = []
    for rank, (_key, run, score, value, flops, note, is_verified) in enumerate(scored, start=1):
        pool, agent = where.get(run.pk, ("", ""))
        metrics = run.final_metrics if isinstance(run.final_metrics, dict) else {}
        tags = _tags(run)
        executor = run.executor or (
            f"by hand: {run.claim_where}"
            if run.origin == RunOrigin.CLAIMED and run.claim_where
            else ""
        )
        ranked.append(
            Ranked(
                rank=rank,
                run_id=run.pk,
                plan_id=run.plan_id,
                score=score,
                value=value,
                flops=flops,
                verified=is_verified,
                origin=run.origin,
                ran_by=ran_by(run),
                executor=executor[:200],
                pool=pool or "",
                agent=agent or "",
                git_sha=run.git_sha,
                config_hash=run.config_hash,
                recipe=f"{run.recipe_name} {run.recipe_version}",
                run_name=str(tags.get("speedrun.name") or f"run-{run.pk}")[:300],
                description=str(tags.get("description") or "")[:2000],
                author_affiliation=str(tags.get("author.affiliation") or "")[:200],
                author_url=str(tags.get("author.url") or "")[:500],
                results_filepath=str(tags.get("results_filepath") or "")[:500],
                finished_at=run.finished_at,
                wandb_url=run.wandb_url,
                imported_from=run.imported_from,
                model_size=number(metrics.get(SIZE_KEY)),
                training_time=number(metrics.get(TIME_KEY)),
                training_hardware_flops=number(metrics.get(HARDWARE_FLOPS_KEY)),
                note=note[:300],
            )
        )
    return ranked
