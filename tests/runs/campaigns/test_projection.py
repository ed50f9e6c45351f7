"""The ladder's projection to a campaign's FLOPs: a synthetic ladder with a known law, alone
and as a ladder plan's finished runs named by a campaign."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from runs.campaigns import services as campaign_writes
from runs.campaigns.projection import projection_compute
from runs.models import MetricSummary, Run, RunState
from runs.services import runs as run_writes
from tests.runs.runs_helpers import launched_plan

FLOPS = [10.0**e for e in np.arange(17, 22.01, 0.5)]  # five decades, eleven scales
E, A, B = 2.0, 100.0, -0.1
TARGET = 1e24


def law(flops: float) -> float:
    return E + A * flops**B


def ladder(noise: float) -> list[tuple[float, float]]:
    rng = np.random.default_rng(3)
    return [(x, law(x) * float(np.exp(rng.normal(0, noise)))) for x in FLOPS]


def test_projection_recovers_the_exponent_and_brackets_the_truth() -> None:
    found = projection_compute(points=ladder(0.001), target_flops=TARGET, metric="eval/loss")
    assert found["refusals"] == []
    assert found["fit"]["exponent"] == pytest.approx(B, abs=0.01)
    assert found["fit"]["irreducible"] == pytest.approx(E, abs=0.1)
    at = found["at_target"]
    assert at["low"] < at["loss"] < at["high"]
    assert at["low"] <= law(TARGET) <= at["high"]
    assert at["loss"] == pytest.approx(law(TARGET), rel=0.01)
    curve = found["curve"]
    assert curve["flops"][0] == pytest.approx(FLOPS[0]) and curve["flops"][-1] == pytest.approx(
        TARGET
    )
    assert all(
        lo <= mid <= hi
        for lo, mid, hi in zip(curve["low"], curve["loss"], curve["high"], strict=True)
    )


def test_band_widens_with_noisier_ladders() -> None:
    def width(noise: float) -> float:
        at = projection_compute(points=ladder(noise), target_flops=TARGET)["at_target"]
        return at["high"] - at["low"]

    assert width(0.01) > 2 * width(0.001)


def test_two_scales_are_refused_in_words() -> None:
    found = projection_compute(points=ladder(0.0)[:2], target_flops=TARGET)
    assert found["curve"] is None
    assert any("scales" in reason for reason in found["refusals"])


def test_a_flat_ladder_is_refused() -> None:
    flat = [(x, 3.0 + 0.01 * (-1) ** i) for i, x in enumerate(FLOPS)]
    found = projection_compute(points=flat, target_flops=TARGET)
    assert found["curve"] is None and found["refusals"]


LADDER_SPEC = """axes:
  capacity_factor: [2.0]
scales: [small, medium, large]
"""


@pytest.mark.django_db
def test_a_campaign_page_projects_its_ladder_plans_fit(
    client: Any, recipe: Any, maintainer: Any
) -> None:
    """End to end: a ladder plan whose finished runs follow a known law, named by a
    campaign; its page states the exponent and the loss at the campaign's FLOPs."""
    plan = launched_plan(recipe, LADDER_SPEC)
    runs = list(Run.objects.filter(plan=plan).select_related("entry"))
    assert len({run.entry.flops for run in runs}) == 3  # three scales' computes

    def plain_law(flops: float) -> float:
        return 4.0 * (flops / 1e15) ** -0.07

    for run in runs:
        loss = plain_law(run.entry.flops) * (1.0 if run.entry.is_baseline else 0.98)
        run_writes.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door="worker")
        MetricSummary.objects.create(
            run=run, key="eval/loss", last=loss, min=loss, max=loss, step=10
        )
        run_writes.run_transition(run_id=run.pk, to_state=RunState.FINISHED, door="worker")
    target = 100 * max(run.entry.flops for run in runs)
    campaign_writes.campaign_create(
        actor=maintainer,
        data={
            "slug": "big",
            "name": "Big",
            "target_tokens": 1e12,
            "target_flops": target,
            "ladder_plan": plan,
        },
    )
    page = client.get("/campaigns/big/")
    assert page.status_code == 200
    html = page.content.decode()
    found = json.loads(html.split('id="projection-data" type="application/json">')[1].split("<")[0])
    assert found["metric"] == "eval/loss" and found["refusals"] == []
    assert found["fit"]["exponent"] == pytest.approx(-0.07, abs=1e-6)  # the baseline's law
    assert found["at_target"]["loss"] == pytest.approx(plain_law(target), rel=1e-6)
    assert found["at_target"]["low"] <= found["at_target"]["loss"] <= found["at_target"]["high"]
    assert found["curve"]["flops"][-1] == pytest.approx(target)
    assert 'id="projection-at-target"' in html and 'data-chart-kind="projection"' in html
