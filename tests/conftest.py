"""Shared fixtures: users in each role, the tiny recipe, API clients."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from tests.factories import ProposalFactory, RecipeFactory, UserFactory


@pytest.fixture
def recipe() -> Any:
    return RecipeFactory.create()


@pytest.fixture
def contributor() -> Any:
    return UserFactory.create(username="carla", roles=["contributor"])


@pytest.fixture
def reviewer() -> Any:
    return UserFactory.create(username="rita", roles=["reviewer"])


@pytest.fixture
def maintainer() -> Any:
    return UserFactory.create(username="max", roles=["maintainer"])


@pytest.fixture
def proposal(contributor: Any, recipe: Any) -> Any:
    return ProposalFactory.create(author=contributor, recipe=recipe)


@pytest.fixture
def api() -> APIClient:
    return APIClient()


@pytest.fixture
def api_as(api: APIClient) -> Any:
    def login(user: Any) -> APIClient:
        api.force_authenticate(user)
        return api

    return login


@pytest.fixture(autouse=True, scope="session")
def _fast_password_hashing() -> None:
    """Real hashers cost ~0.3 s a user by design; tests need many users, not security."""
    from django.conf import settings
    from django.contrib.auth.hashers import get_hashers

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    get_hashers.cache_clear()  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    """Throttles and caches start empty in every test (and what a process remembers of them)."""
    from django.core.cache import cache

    from proposals.github.deliveries import nudge_memo_forget

    cache.clear()
    nudge_memo_forget()
