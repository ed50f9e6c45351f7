"""Helpers for the GitHub sync tests: the fake server, signed deliveries, draining the outbox.

Test modules import the fixtures from here (``from tests.proposals.github_support import *``
is avoided: each module names what it uses).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from proposals.github.deliveries import deliveries_drain
from proposals.github.fake import FakeGitHub
from proposals.github.outbox.drain import outbox_drain
from proposals.models import GitHubOutbox, OutboxState, WebhookDelivery

SECRET = "webhook-test-secret"
BOT = "marin-site-bot"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"  # tests/fixtures (README.md there)
WEBHOOKS = FIXTURES / "github" / "webhooks"
MARIN_ISSUES = FIXTURES / "marin-issues"


@pytest.fixture
def fake_github() -> Iterator[FakeGitHub]:
    fake = FakeGitHub(repository="marin-community/marin", bot_login=BOT, timeout_sleep=1.5)
    fake.start()
    yield fake
    fake.stop()


@pytest.fixture
def github_on(settings: Any, fake_github: FakeGitHub) -> FakeGitHub:
    """Sync on, pointed at the fake; retries fast so tests do not wait."""
    settings.GITHUB_API_URL = fake_github.url
    settings.GITHUB_TOKEN = "test-token"
    settings.GITHUB_REPOSITORY = fake_github.repository
    settings.GITHUB_WEBHOOK_SECRET = SECRET
    settings.GITHUB_BOT_LOGIN = BOT
    settings.GITHUB_SECONDS_BETWEEN_WRITES = 0
    settings.GITHUB_TIMEOUT_SECONDS = 1
    settings.GITHUB_OUTBOX_BACKOFF_SECONDS = 0.01
    settings.GITHUB_OUTBOX_BACKOFF_MAX_SECONDS = 0.05
    settings.GITHUB_OUTBOX_MAX_ATTEMPTS = 50
    settings.GITHUB_MAINTAINERS = ["maxine"]
    settings.GITHUB_REVIEWERS = ["rosa"]
    for login in ("maxine", "rosa"):  # GitHub knows them, with the ids their payloads carry
        fake_github.add_user(login=login, user_id=github_user_id(login))
    settings.SITE_URL = "http://site.test"
    return fake_github


def github_user_id(login: str) -> int:
    """The id this file's payloads give ``login``'s GitHub account."""
    return sum(map(ord, login)) * 7919


def sign(body: bytes, secret: str = SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def post_delivery(
    client: Client,
    event: str,
    payload: dict[str, Any] | bytes,
    *,
    delivery_id: str | None = None,
    signature: str | None = None,
) -> Any:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    headers: dict[str, Any] = {
        "HTTP_X_GITHUB_EVENT": event,
        "HTTP_X_GITHUB_DELIVERY": delivery_id or str(uuid.uuid4()),
        "HTTP_USER_AGENT": "GitHub-Hookshot/test",
    }
    if signature != "":
        headers["HTTP_X_HUB_SIGNATURE_256"] = signature or sign(body)
    return client.post("/github/webhook/", data=body, content_type="application/json", **headers)


def process_deliveries() -> list[str]:
    """Run what the Celery task runs, for every stored and unprocessed delivery."""
    pending = list(
        WebhookDelivery.objects.filter(processed_at__isnull=True)
        .order_by("received_at", "id")
        .values_list("pk", flat=True)
    )
    deliveries_drain()
    outcomes = dict(WebhookDelivery.objects.filter(pk__in=pending).values_list("pk", "outcome"))
    return [outcomes[pk] for pk in pending]


def drain(timeout: float = 20.0) -> None:
    """Send every pending outbox row, waiting out the (short, test-sized) backoffs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ids = set(
            GitHubOutbox.objects.filter(state=OutboxState.PENDING).values_list(
                "proposal_id", flat=True
            )
        )
        if not ids:
            return
        for proposal_id in sorted(ids):
            outbox_drain(proposal_id=proposal_id)
        time.sleep(0.01)
    rows = list(
        GitHubOutbox.objects.exclude(state=OutboxState.DONE).values(
            "id", "operation", "state", "attempts", "last_error"
        )
    )
    raise AssertionError(f"the outbox did not drain in time: {rows}")


def issue_payload(
    *,
    number: int,
    title: str,
    body: str,
    login: str = "octocat",
    labels: list[str] | None = None,
    updated_at: str = "2026-01-01T00:00:00Z",
    repository: str = "marin-community/marin",
) -> dict[str, Any]:
    return {
        "number": number,
        "id": 10_000 + number,
        "node_id": f"I_{number}",
        "title": title,
        "body": body,
        "state": "open",
        "labels": [{"name": name} for name in labels or ["experiment"]],
        "user": {"login": login, "id": github_user_id(login)},
        "created_at": updated_at,
        "updated_at": updated_at,
        "_repository": repository,
    }


def issues_delivery(
    action: str, issue: dict[str, Any], sender: str | None = None
) -> dict[str, Any]:
    issue = dict(issue)
    repository = issue.pop("_repository", "marin-community/marin")
    login = sender or issue["user"]["login"]
    return {
        "action": action,
        "issue": issue,
        "repository": {"full_name": repository},
        "sender": {"login": login, "id": github_user_id(login)},
    }


def comment_delivery(
    action: str,
    *,
    number: int,
    comment_id: int,
    body: str,
    login: str,
    updated_at: str = "2026-01-01T00:00:00Z",
    pull_request: bool = False,
    user_id: int | None = None,
) -> dict[str, Any]:
    issue: dict[str, Any] = {"number": number, "title": "t", "labels": [], "user": {"login": login}}
    if pull_request:
        issue["pull_request"] = {"url": "https://api.github.com/repos/x/y/pulls/1"}
    user = {"login": login, "id": github_user_id(login) if user_id is None else user_id}
    return {
        "action": action,
        "issue": issue,
        "comment": {
            "id": comment_id,
            "body": body,
            "user": user,
            "created_at": updated_at,
            "updated_at": updated_at,
        },
        "repository": {"full_name": "marin-community/marin"},
        "sender": user,
    }
