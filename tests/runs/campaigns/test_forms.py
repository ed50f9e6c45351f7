"""Recording an intervention from the campaign page: maintainers only, CSRF, the same checks
as the API, and a refused form comes back with what was typed and why."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from runs.campaigns import services as campaign_writes
from runs.campaigns.models import Campaign, Intervention

pytestmark = pytest.mark.django_db

GOOD = {
    "step": "1800",
    "kind": "kernel",
    "title": "FlashAttention-4 kernels",
    "from_value": "FA3",
    "to_value": "FA4",
    "keys": "throughput/mfu, moe/drop_fraction",
    "window_steps": "500",
    "happened_at": "2026-11-30 14:00",
    "note": "Ragged **all-to-all**.",
}


@pytest.fixture
def campaign(maintainer: Any) -> Campaign:
    return campaign_writes.campaign_create(
        actor=maintainer,
        data={"slug": "big", "name": "Big", "target_tokens": 1e9, "target_flops": 6e18},
    )


def signed_in(user: Any) -> tuple[Client, str]:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    client.get("/campaigns/big/")
    return client, client.cookies["csrftoken"].value


def test_a_maintainer_records_one_from_the_page(campaign: Campaign, maintainer: Any) -> None:
    client, token = signed_in(maintainer)
    assert 'id="intervention-form"' in client.get("/campaigns/big/").content.decode()
    assert client.post("/campaigns/big/interventions/", GOOD).status_code == 403  # no CSRF
    response = client.post("/campaigns/big/interventions/", GOOD, HTTP_X_CSRFTOKEN=token)
    intervention = Intervention.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/campaigns/big/#intervention-{intervention.pk}"
    assert (intervention.step, intervention.kind, intervention.window_steps) == (
        1800,
        "kernel",
        500,
    )
    assert intervention.keys == ["throughput/mfu", "moe/drop_fraction"]
    assert intervention.happened_at.isoformat().startswith("2026-11-30T14:00")
    assert intervention.created_by == maintainer
    page = client.get("/campaigns/big/").content.decode()
    assert "FlashAttention-4 kernels" in page and "<strong>all-to-all</strong>" in page


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"step": "-1"}, "step", "greater than or equal to 0"),
        ({"kind": "magic"}, "kind", "Select a valid choice"),
        ({"title": ""}, "title", "This field is required"),
        ({"keys": "train/loss <script>"}, "keys", "not a metric key"),
        ({"window_steps": "0"}, "window_steps", "greater than or equal to 1"),
        ({"happened_at": "yesterday-ish"}, "happened_at", "Enter a valid date/time"),
        ({"title": "x" * 201}, "title", "at most 200 characters"),
    ],
)
def test_a_refused_form_comes_back_with_what_was_typed_and_why(
    campaign: Campaign, maintainer: Any, change: dict[str, str], field: str, words: str
) -> None:
    client, token = signed_in(maintainer)
    response = client.post(
        "/campaigns/big/interventions/", {**GOOD, **change}, HTTP_X_CSRFTOKEN=token
    )
    assert response.status_code == 400
    html = response.content.decode()
    assert words in html
    assert 'name="title"' in html and ("FlashAttention-4 kernels" in html or field == "title")
    assert "<script>" not in html.split('id="intervention-form"')[1].split("</form>")[0]
    assert not Intervention.objects.exists()


def test_others_cannot_record_one(campaign: Campaign, contributor: Any) -> None:
    assert (
        Client()
        .post("/campaigns/big/interventions/", GOOD)["Location"]
        .startswith("/accounts/login/")
    )
    client, token = signed_in(contributor)
    assert 'id="intervention-form"' not in client.get("/campaigns/big/").content.decode()
    response = client.post("/campaigns/big/interventions/", GOOD, HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 403
    assert (
        client.post("/campaigns/nope/interventions/", GOOD, HTTP_X_CSRFTOKEN=token).status_code
        == 404
    )
    assert not Intervention.objects.exists()
