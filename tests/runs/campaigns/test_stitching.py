"""A campaign's stitched curves carry no artefact at the attempts' boundaries: a point is
never drawn at an x held from another step (a vertical segment), and the demo's attempts are
its own runs, not a cached copy of another plan's run."""

from __future__ import annotations

from io import StringIO
from typing import Any

import numpy as np
import orjson
import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from runs.campaigns import stitching
from runs.campaigns.models import Campaign
from tests.runs.runs_helpers import eager_tasks  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("eager_tasks")]


def test_tokens_outside_the_tokens_series_are_extended_at_its_slope() -> None:
    token_steps = np.array([10, 20, 30], dtype=np.int64)
    tokens = np.array([1000.0, 2000.0, 3000.0])
    steps = np.array([0, 5, 10, 25, 30, 40], dtype=np.int64)
    found = stitching.tokens_at(steps, token_steps, tokens)
    assert found.tolist() == [0.0, 500.0, 1000.0, 2500.0, 3000.0, 4000.0]


def test_one_tokens_point_extends_by_its_tokens_per_step() -> None:
    found = stitching.tokens_at(
        np.array([0, 5, 10], dtype=np.int64), np.array([10], dtype=np.int64), np.array([1000.0])
    )
    assert found.tolist() == [0.0, 500.0, 1000.0]


def test_the_demo_campaigns_curves_rise_by_tokens_without_a_vertical_segment(
    settings: Any,
) -> None:
    settings.DEBUG = True
    call_command("seed_demo", stdout=StringIO())
    campaign = Campaign.objects.get(slug="moe-535b-demo")
    members = stitching.campaign_members(campaign_id=campaign.pk)
    assert all(m.source_id == m.run_id for m in members)  # no attempt is a cached run
    body = APIClient().get(f"/api/v1/campaigns/{campaign.slug}/series/?points=500")
    data = orjson.loads(body.content)
    for key in ("train/loss", "eval/loss", "throughput/mfu"):
        x = np.asarray(data["series"][key]["tokens"])
        assert np.all(np.diff(x) > 0), f"{key}: two points at one x (a vertical segment)"
        assert x[0] < 0.01 * x[-1]  # from the first attempt's start, not the second's
    assert data["metrics"]["throughput/mfu"]["title"] == "MFU (%)"
    assert 15 < np.median(data["series"]["throughput/mfu"]["value"]) < 35  # percent, once
