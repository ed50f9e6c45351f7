"""The API docs render in a real browser under the site's Content-Security-Policy."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_api_docs_render_their_operations_under_the_policy(page: Page) -> None:
    response = page.goto("/api/docs/")
    assert response is not None and response.ok
    assert "script-src 'self'" in (response.headers.get("content-security-policy") or "")
    page.wait_for_selector(".opblock", timeout=20_000)
    assert page.locator(".opblock").count() >= 10  # every operation of the schema, listed
