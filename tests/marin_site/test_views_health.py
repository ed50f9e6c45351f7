"""GET /healthz: 200 when the database and the broker answer, 503 naming what does not."""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest
from django.test import Client

from marin_site.celery import app as celery_app

pytestmark = pytest.mark.django_db


@pytest.fixture
def broker(request: Any) -> Any:
    """Point the Celery app at another broker for one test, then put it back."""
    original = celery_app.conf.broker_url

    def use(url: str) -> None:
        celery_app.conf.broker_url = url
        celery_app.pool.force_close_all()

    yield use
    use(original)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_healthy_with_the_embedded_broker(client: Client) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok", "broker": "ok"}


def test_healthy_with_redis(client: Client, broker: Any) -> None:
    broker(os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15"))
    response = client.get("/healthz")
    assert response.status_code == 200, response.json()
    assert response.json()["broker"] == "ok"


def test_unreachable_broker_is_503_naming_it(client: Client, broker: Any) -> None:
    broker(f"redis://127.0.0.1:{_closed_port()}/0")
    response = client.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["database"] == "ok"
    assert body["broker"].startswith("unreachable")


def test_unreachable_database_is_503_naming_it(client: Client, monkeypatch: Any) -> None:
    from marin_site import views

    def broken() -> str:
        return "unreachable: OperationalError: connection refused"

    monkeypatch.setattr(views, "_database", broken)
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["database"].startswith("unreachable")
