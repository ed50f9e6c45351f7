"""The door fuzz (tests/system/door_fuzz.py) at the doors outside the API's schema: the
runner's, the agents' and MLflow's doors, GitHub's webhook (signed) and the uploads. No
answer is a 5xx, a refused request stores nothing, and a value the input policy refuses is
refused naming its field. The web forms and the API have their own modules (xdist runs the
three side by side); bench/fuzz.py runs all three longer."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from proposals.github.deliveries import deliveries_drain
from proposals.models import WebhookDelivery
from tests.proposals.github_support import sign
from tests.system import door_fuzz
from tests.system.door_fuzz import Fuzzer
from tests.system.door_fuzz_world import CLASSES, WEBHOOK_SECRET, check, seeded, world

pytestmark = pytest.mark.django_db
__all__ = ["world"]


def _client() -> Client:
    return Client(raise_request_exception=False)


def test_the_runner_agent_and_mlflow_doors(world: dict[str, Any]) -> None:
    fuzzer = Fuzzer(world, seeded())
    door_fuzz.fuzz_runner(fuzzer, _client(), CLASSES)
    door_fuzz.fuzz_agent(fuzzer, _client(), CLASSES)
    door_fuzz.fuzz_mlflow(fuzzer, _client(), CLASSES)
    check(fuzzer, "runner, agent, mlflow")


def test_signed_webhooks_and_uploads(world: dict[str, Any]) -> None:
    fuzzer = Fuzzer(world, seeded())
    door_fuzz.fuzz_webhook(fuzzer, _client(), lambda body: sign(body, WEBHOOK_SECRET), CLASSES)
    admin = _client()
    admin.force_login(world["maintainer"])
    door_fuzz.fuzz_uploads(fuzzer, _client(), admin)
    check(fuzzer, "webhooks, uploads")


def test_stored_hostile_deliveries_are_processed_without_an_error(world: dict[str, Any]) -> None:
    """The webhook answers fast and processes later: what it stored must not break the
    drain either (every delivery ends processed, none raises)."""
    client = _client()
    stored = 0
    for cls, raw in sorted(door_fuzz.JSON_CLASSES.items()):
        body = door_fuzz.with_raw({"action": "created", "repository": {}}, "comment", raw)
        response = client.post(
            "/github/webhook/",
            body,
            "application/json",
            HTTP_X_GITHUB_EVENT="issue_comment",
            HTTP_X_GITHUB_DELIVERY=f"fuzz-{cls}",
            HTTP_X_HUB_SIGNATURE_256=sign(body, WEBHOOK_SECRET),
        )
        assert response.status_code < 500, cls
        stored += response.status_code == 202
    assert stored > len(door_fuzz.JSON_CLASSES) // 2
    deliveries_drain()
    assert not WebhookDelivery.objects.filter(processed_at__isnull=True).exists()
