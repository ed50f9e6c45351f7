"""Accounts: local sign-up and sign-in, and GitHub sign-in up to the redirect to GitHub."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

pytestmark = pytest.mark.django_db

GITHUB = {
    "github": {
        "SCOPE": ["read:user"],
        "APPS": [{"client_id": "abc123", "secret": "s3cret", "key": ""}],
    }
}


def test_local_signup_and_login(client: Client) -> None:
    response = client.post(
        "/accounts/signup/",
        {
            "username": "newbie",
            "email": "newbie@example.org",
            "password1": "a-long-enough-passphrase",
            "password2": "a-long-enough-passphrase",
        },
    )
    assert response.status_code == 302
    assert get_user_model().objects.filter(username="newbie").exists()
    client.logout()
    response = client.post(
        "/accounts/login/", {"login": "newbie", "password": "a-long-enough-passphrase"}
    )
    assert response.status_code == 302
    assert client.session.get("_auth_user_id")


def test_wrong_password_is_refused(client: Client, contributor: Any) -> None:
    response = client.post("/accounts/login/", {"login": "carla", "password": "nope"})
    assert response.status_code == 200
    assert not client.session.get("_auth_user_id")


def test_github_login_redirects_to_github(client: Client, settings: Any) -> None:
    settings.SOCIALACCOUNT_PROVIDERS = GITHUB
    response = client.post("/accounts/github/login/")
    assert response.status_code == 302
    target = urlparse(response["Location"])
    assert (target.scheme, target.netloc, target.path) == (
        "https",
        "github.com",
        "/login/oauth/authorize",
    )
    query = parse_qs(target.query)
    assert query["client_id"] == ["abc123"]
    assert query["scope"] == ["read:user"]
    assert "state" in query


def test_login_page_offers_github_only_when_configured(client: Client, settings: Any) -> None:
    assert b"/accounts/github/login/" not in client.get("/accounts/login/").content
    settings.SOCIALACCOUNT_PROVIDERS = GITHUB
    assert b"/accounts/github/login/" in client.get("/accounts/login/").content


@pytest.mark.parametrize("path", ["/accounts/github/login/", "/accounts/github/login/callback/"])
def test_github_sign_in_without_an_oauth_app_says_so(client: Client, path: str) -> None:
    for response in (client.get(path), client.post(path)):
        assert response.status_code == 404
        assert b"Signing in with GitHub is not set up on this site" in response.content
