"""The kernel's database helpers: the PostgreSQL statement and its portable fallback agree."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from marin_site.db import _row_insert_unless_present_portable, row_insert_unless_present
from proposals.models import WebhookDelivery

pytestmark = pytest.mark.django_db


def _delivery(delivery_id: str, body: str) -> dict[str, Any]:
    return {
        "delivery_id": delivery_id,
        "event": "ping",
        "action": "",
        "body": body,
        "received_at": timezone.now(),
        "outcome": WebhookDelivery.Outcome.PENDING,
        "detail": "",
    }


def _statement(*, model: Any, values: dict[str, Any]) -> bool:
    return row_insert_unless_present(model=model, unique="delivery_id", values=values)


@pytest.mark.parametrize("insert", [_statement, _row_insert_unless_present_portable])
def test_a_row_is_inserted_once_and_a_duplicate_is_refused_quietly(
    insert: Callable[..., bool],
) -> None:
    body = '{"zen": "x\\u00e9", "n": 1.50}'  # stored as given: not re-encoded
    assert insert(model=WebhookDelivery, values=_delivery("d-1", body)) is True
    assert insert(model=WebhookDelivery, values=_delivery("d-1", "{}")) is False
    assert insert(model=WebhookDelivery, values=_delivery("d-2", "{}")) is True
    # the duplicate left the surrounding transaction usable
    assert list(
        WebhookDelivery.objects.order_by("delivery_id").values_list("delivery_id", "body")
    ) == [
        ("d-1", body),
        ("d-2", "{}"),
    ]


def test_on_postgresql_a_duplicate_costs_one_statement_and_no_savepoint(
    django_assert_num_queries: Any,
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the PostgreSQL statement")
    assert _statement(model=WebhookDelivery, values=_delivery("d-1", "{}")) is True
    with django_assert_num_queries(1):
        assert _statement(model=WebhookDelivery, values=_delivery("d-1", "{}")) is False
