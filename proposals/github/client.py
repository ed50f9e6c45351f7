"""The configured GitHub connection: is sync on, and a PyGithub client for the repository.

Sync is on when both ``GITHUB_TOKEN`` and ``GITHUB_REPOSITORY`` are set. ``GITHUB_API_URL``
points PyGithub at github.com, a GitHub Enterprise ``https://host/api/v3``, or the fake
server (proposals/github/fake.py). PyGithub's own retries are off: the outbox retries, by
rescheduling, never by sleeping inside a task.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from github import Auth, Github


def sync_enabled() -> bool:
    return bool(settings.GITHUB_TOKEN and settings.GITHUB_REPOSITORY)


def sync_facts(issue_number: int | None) -> tuple[bool, str]:
    """What a proposal's GitHub panel shows besides the proposal's own fields: whether sync
    is on, and its issue's address (both from the site's settings)."""
    return sync_enabled(), issue_html_url(issue_number) if issue_number else ""


def github_client() -> Github:
    return Github(
        base_url=settings.GITHUB_API_URL,
        auth=Auth.Token(settings.GITHUB_TOKEN),
        timeout=settings.GITHUB_TIMEOUT_SECONDS,
        retry=0,
        seconds_between_requests=0,
        seconds_between_writes=settings.GITHUB_SECONDS_BETWEEN_WRITES,
        lazy=True,
    )


def github_repo(client: Github | None = None) -> Any:
    return (client or github_client()).get_repo(settings.GITHUB_REPOSITORY)


def issue_html_url(number: int) -> str:
    """The issue's page; for the API host of github.com or an Enterprise ``/api/v3``."""
    api = settings.GITHUB_API_URL
    if api.rstrip("/") == "https://api.github.com":
        host = "https://github.com"
    elif api.endswith("/api/v3"):
        host = api[: -len("/api/v3")]
    else:
        host = api
    return f"{host}/{settings.GITHUB_REPOSITORY}/issues/{number}"
