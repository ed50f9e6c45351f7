"""Production's static files: hashed names from the collected manifest, and pages that
still answer, saying what to run, when the files were never collected."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from marin_site import staticfiles

pytestmark = pytest.mark.django_db


@pytest.fixture
def production_static(settings: Any, tmp_path: Path) -> Path:
    settings.DEBUG = False
    settings.PAGE_CACHE_SECONDS = 0
    settings.STATIC_ROOT = tmp_path
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "marin_site.staticfiles.StaticFilesStorage"},
    }
    staticfiles._reported.clear()
    return tmp_path


def test_without_collected_files_pages_answer_and_the_log_says_what_to_run(
    production_static: Path, caplog: Any
) -> None:
    with caplog.at_level(logging.ERROR, logger="marin_site.staticfiles"):
        response = Client().get("/")
    assert response.status_code == 200
    assert 'href="/static/css/site.css"' in response.content.decode()
    assert "collectstatic --noinput" in caplog.text
    assert "'css/site.css'" in caplog.text


def test_collected_files_are_linked_by_their_hashed_names(production_static: Path) -> None:
    manifest = {
        "version": "1.1",
        "hash": "0",
        "paths": {"css/site.css": "css/site.0123abcd.css", "img/favicon.svg": "img/f.9.svg"},
    }
    (production_static / "staticfiles.json").write_text(json.dumps(manifest))
    page = Client().get("/").content.decode()
    assert 'href="/static/css/site.0123abcd.css"' in page
    assert 'href="/static/img/f.9.svg"' in page
