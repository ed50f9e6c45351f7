"""The ladder's projection to a campaign's FLOPs: a synthetic ladder with a known law, alone
and as a ladder plan's finished runs named by a campaign."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from runs.campaigns import services as campaign_writes
from runs.campaigns.projection import band_compute, projection_compute
from runs.models import MetricSummary, Run, RunState
from runs.results import ladder as ladders
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


def test_band_is_the_ols_interval_for_a_plain_power_law() -> None:
    """A known case: three noisy scales fit a plain power law, a straight line in log space,
    for which the delta method is exact: half-width t(0.95, n - 2) · s · sqrt(1/n +
    (x0 - x̄)² / Sxx) in log loss, with t(0.95, 1) = 6.314."""
    flops = [1e17, 1e18, 1e19]
    losses = [4.0, 3.4, 3.05]
    found = projection_compute(points=list(zip(flops, losses, strict=True)), target_flops=1e21)
    assert found["refusals"] == []
    assert found["fit"]["law"] == "plain power law"
    x = np.log(flops)
    y = np.log(losses)
    slope, intercept = np.polyfit(x, y, 1)
    s = math.sqrt(float(np.sum((y - intercept - slope * x) ** 2)) / (3 - 2))
    x0 = math.log(1e21)
    half = 6.314 * s * math.sqrt(1 / 3 + (x0 - x.mean()) ** 2 / float(np.sum((x - x.mean()) ** 2)))
    centre = intercept + slope * x0
    at = found["at_target"]
    assert at["low"] == pytest.approx(math.exp(centre - half), rel=1e-6)
    assert at["high"] == pytest.approx(math.exp(centre + half), rel=1e-6)
    assert at["low"] < at["loss"] < at["high"]  # centred on the line, never clamped to it
    assert found["band"]["level"] == "5–95%" and "covariance" in found["band"]["method"]


def test_no_band_without_degrees_of_freedom() -> None:
    """An exact law leaves a band of zero width (no scatter, no uncertainty); a fit with no
    degrees of freedom left (two points, two parameters) gets no band at all."""
    exact = projection_compute(points=[(x, law(x)) for x in FLOPS[::3]], target_flops=TARGET)
    at = exact["at_target"]
    assert at["low"] == pytest.approx(at["loss"]) and at["high"] == pytest.approx(at["loss"])
    two = np.array([1e17, 1e19]), np.array([4.0, 3.0])
    fit = ladders.power_law_fit(two[0].tolist(), two[1].tolist())
    assert fit is not None
    assert band_compute(fit=fit, flops=two[0], losses=two[1], grid=np.array([1e21])) is None


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
