"""The site's own ladder rule as a plug-in: a law fitted per variant on three or more scales
(a free exponent; an irreducible loss from four), the compute multiplier at the loss the
variant's fit reaches at the largest budget, times the throughput ratio
(``runs.results.ladder``, whose arithmetic and refusals it reuses unchanged).

Unlike the other rule families it writes its refusals with the site's presentation rule, so
it is the one module of this package that reaches ``runs.results``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runs.results import ladder as ladders
from runs.verdicts.base import Refusal, Rule, Verdict, g, list_at, name_at, number_at

LADDER = "ladder"


def _ladder(params: dict[str, Any], data: Mapping[str, Any]) -> Verdict:
    variants = []
    baselines = 0
    for i, item in enumerate(list_at(data, "variants", rule=LADDER, minimum=1)):
        where = f"variants[{i}]"
        label = name_at(
            {"name": item.get("label", f"variant {i + 1}")}, rule=LADDER, where=where, fallback=""
        )
        is_baseline = item.get("baseline") is True
        baselines += is_baseline
        points = []
        for j, point in enumerate(list_at(item, "points", rule=LADDER, minimum=1)):
            at = f"{where}.points[{j}]"
            speed = point.get("tokens_per_second")
            points.append(
                ladders.LadderPoint(
                    flops=number_at(point, "flops", rule=LADDER, where=at, positive=True),
                    loss=number_at(point, "loss", rule=LADDER, where=at, positive=True),
                    tokens_per_second=(
                        number_at(point, "tokens_per_second", rule=LADDER, where=at, positive=True)
                        if speed is not None
                        else None
                    ),
                )
            )
        variants.append(
            ladders.LadderVariant(key=label, label=label, is_baseline=is_baseline, points=points)
        )
    if baselines != 1:
        raise Refusal(
            rule=LADDER,
            field="variants",
            problem=f'must have exactly one baseline ("baseline": true); {baselines} given',
        )
    summary = ladders.ladder_build(metric=str(data.get("metric") or "loss"), variants=variants)
    result = summary.as_summary()
    steps = []
    for row in result["variants"]:
        if row["multiplier"] is None:
            steps.append(f"{row['label']}: no multiplier, because " + "; ".join(row["refusals"]))
        else:
            steps.append(
                f"{row['label']}: {row['law']} over {row['scales']} scales, exponent "
                f"{g(row['exponent'])}, R² {g(row['r_squared'], 4)}; multiplier "
                f"{g(row['multiplier'])}"
                + (
                    f" × throughput ratio {g(row['throughput_ratio'])} = effective speedup "
                    f"{g(row['effective_speedup'])}"
                    if row["effective_speedup"] is not None
                    else ""
                )
            )
    return Verdict(rule=LADDER, version=1, parameters=params, result=result, steps=steps)


LADDER_RULE = Rule(
    name=LADDER,
    version=1,
    title="The site's scaling ladder: a free exponent fitted on three or more scales",
    params=(),
    inputs=(
        "each variant's (training FLOPs, final loss) points, one per scale and seed",
        "steady-state tokens/s for the throughput ratio",
    ),
    compute=_ladder,
)
