"""The demo's board (``seed_demo``): two tracks over the demo's finished tiny-moe runs, so a
newcomer sees the board filled: the lowest final eval loss, and the effective speedup over
the demo baseline (Agent MoE gate 1's law, with the baseline's own (budget, loss) pinned).
Both are ranked at once. Running it again changes nothing but the ranking.
"""

from __future__ import annotations

from typing import Any

from runs.board.models import BoardTrack, TrackRule
from runs.board.parameters import parameters_clean
from runs.board.rank import RankReport, boards_rank_for
from runs.models import Run, RunState
from runs.verdicts.gates import MARIN_ALPHA

DEMO_RECIPE = "tiny-moe"
DEMO_METRIC = "eval/loss"
DEMO_ASYMPTOTE = 1.6


def _baseline() -> tuple[float, float] | None:
    """(budget, final eval loss) of the demo's first finished baseline run of tiny-moe."""
    run = (
        Run.objects.filter(
            recipe_name=DEMO_RECIPE, state=RunState.FINISHED, entry__is_baseline=True
        )
        .select_related("entry")
        .order_by("pk")
        .first()
    )
    if run is None or not run.entry.flops:
        return None
    loss = (run.final_metrics or {}).get(DEMO_METRIC)
    if not isinstance(loss, int | float):
        from runs.models import MetricSummary

        loss = (
            MetricSummary.objects.filter(run=run, key=DEMO_METRIC)
            .values_list("last", flat=True)
            .first()
        )
    if not isinstance(loss, int | float) or loss <= DEMO_ASYMPTOTE:
        return None
    return float(run.entry.flops), float(loss)


def demo_board_seed() -> list[RankReport]:
    tracks: list[dict[str, Any]] = [
        {
            "slug": "demo-tiny-moe-eval-loss",
            "title": "tiny-moe: lowest eval loss",
            "description": "The demo's finished tiny-moe runs by their final eval/loss.",
            "recipe_name": DEMO_RECIPE,
            "metric": DEMO_METRIC,
            "rule": TrackRule.LOWEST,
            "parameters": {},
            "position": 1,
        }
    ]
    baseline = _baseline()
    if baseline is not None:
        tracks.append(
            {
                "slug": "demo-tiny-moe-speedup",
                "title": "tiny-moe: effective speedup over the demo baseline",
                "description": "Agent MoE gate 1's law (asymptote 1.6, exponent 0.0941) with "
                "the demo baseline's own budget and final eval loss pinned: the compute the "
                "baseline would need for each run's loss, over the run's own FLOPs.",
                "recipe_name": DEMO_RECIPE,
                "metric": DEMO_METRIC,
                "rule": TrackRule.EFFECTIVE_SPEEDUP,
                "parameters": {
                    "asymptote": DEMO_ASYMPTOTE,
                    "alpha": MARIN_ALPHA,
                    "baseline_budget": baseline[0],
                    "baseline_loss": baseline[1],
                },
                "position": 2,
            }
        )
    for fields in tracks:
        if not BoardTrack.objects.filter(slug=fields["slug"]).exists():
            fields["parameters"] = parameters_clean(fields["rule"], fields["parameters"])
            BoardTrack.objects.create(**fields)
    return boards_rank_for(None)
