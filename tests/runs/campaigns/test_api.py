"""A campaign fed through the API: restarts stitched, an intervention's before/after read
off the data, and the refusals of bad input and of non-maintainers."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.cache import cache
from django.utils.timezone import now
from rest_framework.test import APIClient

from runs.alerts.models import Alert, AlertKind
from runs.campaigns import selectors, services, stitching
from runs.campaigns.models import Campaign, Intervention
from runs.metrics.declarations import declarations_parse
from runs.models import Run
from runs.recipes.demo import TINY_MOE
from tests.factories import UserFactory
from tests.runs.campaigns.campaign_helpers import (
    THREE_POINT_SPEC,
    campaign_body,
    feed,
    start,
    tokens,
)
from tests.runs.runs_helpers import eager_tasks, launched_plan  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("eager_tasks")]

MFU_BEFORE = (20.0, 21.0, 22.0)  # in percent, as Levanter logs it and the recipe declares it
MFU_AFTER = (26.0, 27.0, 28.0)
INTERVENTION_STEP = 1100


def attempt_a(step: int) -> dict[str, Any]:
    return {"train/loss": lambda s: 100.0, "throughput/total_tokens": tokens}


def mfu_of_b(step: int) -> float:
    # B's steps from 1000 on are superseded by C: a value no stitched figure may show.
    return 90.0 if step >= 1000 else MFU_BEFORE[step % 3]


def mfu_of_c(step: int) -> float:
    return (MFU_BEFORE if step < INTERVENTION_STEP else MFU_AFTER)[step % 3]


@pytest.fixture
def campaign(api_as: Any, maintainer: Any, recipe: Any) -> Campaign:
    """Three attempts: A steps 0-599, B restarts at 400 (to 1199), C restarts at 1000."""
    client = api_as(maintainer)
    response = client.post("/api/v1/campaigns/", campaign_body(), format="json")
    assert response.status_code == 201, response.content
    runs = list(Run.objects.filter(plan=launched_plan(recipe, THREE_POINT_SPEC)).order_by("pk"))
    assert len(runs) == 3
    for run in runs:
        answer = client.post(
            "/api/v1/campaigns/big-run/runs/",
            {"run": run.pk, "phase": "pre-training"},
            format="json",
        )
        assert answer.status_code == 201, answer.content
    a, b, c = runs
    common = {"throughput/total_tokens": tokens, "throughput/tokens_per_second": lambda s: 5e4}
    feed(a, start(a), range(600), {"train/loss": lambda s: 100.0, **common})
    feed(
        b,
        start(b),
        range(400, 1200),
        {"train/loss": lambda s: 200.0, "throughput/mfu": mfu_of_b, **common},
    )
    feed(
        c,
        start(c),
        range(1000, 2000),
        {"train/loss": lambda s: 300.0, "throughput/mfu": mfu_of_c, **common},
    )
    return Campaign.objects.get(slug="big-run")


def chart(api: APIClient, slug: str = "big-run", points: int = 2000) -> dict[str, Any]:
    response = api.get(f"/api/v1/campaigns/{slug}/series/?points={points}")
    assert response.status_code == 200, response.content
    return json.loads(response.content)


def test_restarts_are_stitched_in_favour_of_the_later_attempt(
    api: APIClient, campaign: Campaign
) -> None:
    data = chart(api)
    loss = data["series"]["train/loss"]
    steps, values = loss["step"], loss["value"]
    assert steps == sorted(set(steps)), "one value per step, in order"
    assert steps[0] == 0 and steps[-1] == 1999 and len(steps) == 2000
    by_step = dict(zip(steps, values, strict=True))
    assert {by_step[s] for s in range(400)} == {100.0}
    assert {by_step[s] for s in range(400, 1000)} == {200.0}
    assert {by_step[s] for s in range(1000, 2000)} == {300.0}
    assert data["x"] == "tokens"
    assert loss["tokens"][:3] == [0.0, 1000.0, 2000.0] and loss["tokens"][-1] == 1_999_000.0
    assert [(r["order"], r["step"]) for r in data["restarts"]] == [(0, 0), (1, 400), (2, 1000)]
    progress = data["progress"]
    assert progress["tokens"] == 1_999_000.0
    assert progress["tokens_fraction"] == pytest.approx(1_999_000 / 4_000_000)
    assert progress["eta_seconds"] == pytest.approx((4_000_000 - 1_999_000) / 5e4)
    assert progress["phase"] == "pre-training"
    assert data["active"] is True  # the attempts are still running


def test_chart_data_is_a_few_queries_whatever_the_attempts(
    api: APIClient, campaign: Campaign, django_assert_max_num_queries: Any
) -> None:
    # The open alerts too (the page's list follows), and the stale series the read rolls up
    # first (runs.series.charts.series_refresh_on_read: one query when none is stale).
    with django_assert_max_num_queries(8):
        chart(api)


def test_intervention_before_and_after_is_read_off_the_stitched_data(
    api_as: Any, maintainer: Any, campaign: Campaign, client: Any
) -> None:
    response = api_as(maintainer).post(
        "/api/v1/campaigns/big-run/interventions/",
        {
            "step": INTERVENTION_STEP,
            "kind": "kernel",
            "title": "FlashAttention-4 kernels",
            "from_value": "FA3",
            "to_value": "FA4",
            "keys": ["throughput/mfu"],
            "window_steps": 200,
            "note": "Kernels **landed**.<script>alert(1)</script>",
            "links": [{"label": "PR", "url": "https://github.com/marin-community/marin/pull/1"}],
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    members = stitching.campaign_members(campaign_id=campaign.pk)
    intervention = Intervention.objects.get(campaign=campaign)
    effect = selectors.intervention_effect(
        intervention=intervention,
        members=members,
        key="throughput/mfu",
        declaration=declarations_parse(TINY_MOE["metrics"])["throughput/mfu"],
    )
    # Before: steps 900-1099, B up to 999 and C from 1000 (B's 90 from 1000 on is replaced).
    assert effect["before"]["n"] == 200 and effect["after"]["n"] == 200
    assert effect["before"]["median"] == pytest.approx(21.0)
    assert (effect["before"]["p25"], effect["before"]["p75"]) == pytest.approx((20.0, 22.0))
    assert effect["after"]["median"] == pytest.approx(27.0)
    assert effect["text"] == "21.0% → 27.0%"
    assert (effect["before"]["range"], effect["after"]["range"]) == ("20.0%–22.0%", "26.0%–28.0%")
    page = client.get("/campaigns/big-run/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "21.0% → 27.0%" in html
    assert 'interquartile <span class="effect-range" data-side="before">20.0%–22.0%</span>' in html
    assert "<strong>landed</strong>" in html and "<script>alert(1)" not in html
    annotated = chart(api_as(maintainer))["interventions"]
    assert [(i["step"], i["tokens"]) for i in annotated] == [(1100, 1_100_000.0)]


def test_effect_follows_new_data(api_as: Any, maintainer: Any, campaign: Campaign) -> None:
    intervention = Intervention.objects.create(
        campaign=campaign,
        step=1990,
        happened_at="2026-12-01T00:00Z",
        kind="other",
        title="late",
        keys=["throughput/mfu"],
        window_steps=50,
    )
    members = stitching.campaign_members(campaign_id=campaign.pk)
    effect = selectors.intervention_effect(
        intervention=intervention, members=members, key="throughput/mfu"
    )
    assert effect["after"]["n"] == 10 and effect["before"]["n"] == 50


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "nope"}, "kind"),
        ({"step": -1}, "step"),
        ({"step": "soon"}, "step"),
        ({"keys": ["not a key!"]}, "keys"),
        ({"keys": "throughput/mfu"}, "keys"),
        ({"links": [{"url": "javascript:alert(1)"}]}, "links"),
        ({"title": ""}, "title"),
        ({"window_steps": 0}, "window_steps"),
    ],
)
def test_bad_intervention_is_a_400_naming_the_field(
    api_as: Any, maintainer: Any, campaign: Campaign, body: dict[str, Any], field: str
) -> None:
    good = {"step": 10, "kind": "other", "title": "t", "keys": ["throughput/mfu"]}
    response = api_as(maintainer).post(
        "/api/v1/campaigns/big-run/interventions/", {**good, **body}, format="json"
    )
    assert response.status_code == 400, response.content
    assert field in response.json()
    assert not Intervention.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"target_tokens": "lots"}, "target_tokens"),
        ({"target_flops": -1}, "target_flops"),
        ({"slug": "Not A Slug"}, "slug"),
        ({"telemetry_keys": ["bad key"]}, "telemetry_keys"),
        ({"links": [{"url": "//evil.example/"}]}, "links"),
        ({"ladder_plan": 999999}, "ladder_plan"),
    ],
)
def test_bad_campaign_is_a_400_naming_the_field(
    api_as: Any, maintainer: Any, body: dict[str, Any], field: str
) -> None:
    response = api_as(maintainer).post("/api/v1/campaigns/", campaign_body(**body), format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()
    assert not Campaign.objects.exists()


def test_non_maintainers_are_refused(api_as: Any, api: APIClient, campaign: Campaign) -> None:
    contributor = api_as(UserFactory.create(username="cora"))
    body = {"step": 10, "kind": "other", "title": "t"}
    assert (
        contributor.post(
            "/api/v1/campaigns/big-run/interventions/", body, format="json"
        ).status_code
        == 403
    )
    assert (
        contributor.post(
            "/api/v1/campaigns/", campaign_body(slug="other"), format="json"
        ).status_code
        == 403
    )
    run = Run.objects.order_by("pk").first()
    assert run is not None
    assert (
        contributor.post(
            "/api/v1/campaigns/big-run/runs/", {"run": run.pk}, format="json"
        ).status_code
        == 403
    )
    assert api.post(
        "/api/v1/campaigns/big-run/interventions/", body, format="json"
    ).status_code in {401, 403}
    assert not Intervention.objects.exists()
    # reads are public
    assert api.get("/api/v1/campaigns/big-run/").json()["name"] == "Big run"
    assert api.get("/api/v1/campaigns/big-run/interventions/").json() == []


def test_campaign_pages_and_the_home_page_link(client: Any, campaign: Campaign) -> None:
    cache.clear()
    assert client.get("/campaigns/").status_code == 200
    assert 'href="/campaigns/big-run/"' in client.get("/").content.decode()
    Campaign.objects.filter(pk=campaign.pk).update(is_active=False)
    cache.clear()
    assert 'href="/campaigns/big-run/"' not in client.get("/").content.decode()
    assert client.get("/campaigns/nope/").status_code == 404
    assert client.get("/api/v1/campaigns/nope/series/").status_code == 404
    assert client.get("/api/v1/campaigns/big-run/series/?points=zero").status_code == 400


def test_the_page_lists_the_open_alerts_of_its_runs(
    client: Any, campaign: Campaign, recipe: Any
) -> None:
    a, b, c = (member.run for member in campaign.members.order_by("order", "pk"))
    Alert.objects.create(run=c, kind=AlertKind.SPIKE, key="train/loss", message="loss 9.1 at 1500")
    Alert.objects.create(
        run=b, kind=AlertKind.DROP, key="throughput/mfu", message="mfu fell", closed_at=now()
    )
    outsider = Run.objects.filter(plan=launched_plan(recipe, THREE_POINT_SPEC)).first()
    assert outsider is not None and outsider.pk not in {a.pk, b.pk, c.pk}
    Alert.objects.create(run=outsider, kind=AlertKind.NAN, key="train/loss", message="elsewhere")
    cache.clear()

    page = client.get("/campaigns/big-run/").content.decode()
    section = page.split('id="campaign-alerts"', 1)[1].split("</section>", 1)[0]

    assert 'data-open-alerts="1"' in section
    assert f"run {c.pk}, spike: loss 9.1 at 1500" in section
    assert f'href="/runs/{c.pk}/' in section
    assert "mfu fell" not in section  # closed
    assert "elsewhere" not in section  # another run's


def test_without_logged_weights_the_phases_data_mix_is_the_mixture(
    api: APIClient, client: Any, campaign: Campaign, maintainer: Any
) -> None:
    """Runs that log no mixture/weight/ keys: each attempt's phase config's mix, as fractions,
    over the steps the stitched curve keeps of it."""
    assert chart(api)["mixture"] == []
    mixes: list[dict[str, float]] = [
        {"web": 3, "code": 1},
        {"web": 3, "code": 1},
        {"web": 1, "code": 1, "math": 0},
    ]
    for member, mix in zip(campaign.members.order_by("order"), mixes, strict=True):
        services.campaign_run_add(
            campaign=campaign, run=member.run, actor=maintainer, order=member.order, data_mix=mix
        )
    cache.clear()
    found = chart(api)
    assert found["mixture"] == [
        "mixture/weight/code",
        "mixture/weight/math",
        "mixture/weight/web",
    ]
    web = found["series"]["mixture/weight/web"]
    assert web["step"] == [0, 399, 400, 999, 1000, 1999]  # A until B restarts, B until C
    assert web["value"] == [0.75, 0.75, 0.75, 0.75, 0.5, 0.5]
    assert web["tokens"] == [tokens(step) for step in web["step"]]
    assert found["series"]["mixture/weight/math"]["value"] == [0.0] * 6
    assert 'data-chart-kind="mixture"' in client.get("/campaigns/big-run/").content.decode()
