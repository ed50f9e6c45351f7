"""Template context shared by every page."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest


def site(request: HttpRequest) -> dict[str, object]:
    providers = settings.SOCIALACCOUNT_PROVIDERS.get("github", {})
    return {
        "SITE_NAME": "marin-site",
        "GITHUB_LOGIN_ENABLED": bool(providers.get("APPS") or providers.get("APP")),
    }
