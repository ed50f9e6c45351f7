"""Site-wide views: the favicon every page links, and the address browsers ask for it at."""

from __future__ import annotations

import pytest
from django.contrib.staticfiles import finders
from django.test import Client

pytestmark = pytest.mark.django_db


def test_every_page_links_the_favicon_and_the_file_exists(client: Client) -> None:
    for url in ("/", "/archive/", "/search/", "/recipes/", "/accounts/login/"):
        page = client.get(url).content.decode()
        assert '<link rel="icon" href="/static/img/favicon.svg" type="image/svg+xml">' in page, url
    path = finders.find("img/favicon.svg")
    assert path is not None
    with open(path, encoding="utf-8") as icon:
        assert icon.read().startswith("<svg ")


def test_favicon_ico_leads_to_the_icon(client: Client) -> None:
    response = client.get("/favicon.ico")
    assert response.status_code == 301
    assert response["Location"] == "/static/img/favicon.svg"


def test_the_api_s_own_path_leads_to_its_documentation(client: Client) -> None:
    response = client.get("/api/")
    assert response.status_code == 302 and response["Location"] == "/api/docs/"
