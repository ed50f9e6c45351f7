"""Response headers: a Content-Security-Policy on every answer, HSTS over HTTPS in
production, and no server version; pages carry no inline script for the policy to refuse."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from csp.utils import build_policy
from django.conf import settings as django_settings
from django.test import Client

from proposals.markdown import render_markdown
from tests.factories import ProposalFactory

pytestmark = pytest.mark.django_db

ROOT = Path(django_settings.BASE_DIR)


def _directives(header: str) -> dict[str, list[str]]:
    parsed: dict[str, list[str]] = {}
    for part in header.split(";"):
        words = part.split()
        if words:
            parsed[words[0]] = words[1:]
    return parsed


@pytest.mark.parametrize("path", ["/", "/api/v1/proposals/", "/api/docs/", "/healthz", "/nope/"])
def test_every_answer_carries_a_policy_that_allows_scripts_and_styles_from_self_only(
    client: Client, path: str
) -> None:
    response = client.get(path)
    policy = _directives(response["Content-Security-Policy"])
    assert policy["script-src"] == ["'self'"]
    assert policy["style-src"] == ["'self'"]
    assert policy["object-src"] == ["'none'"]
    assert policy["frame-ancestors"] == ["'none'"]
    assert not any("unsafe" in value for values in policy.values() for value in values)


def test_a_page_from_the_page_cache_carries_the_policy_too(client: Client, settings: Any) -> None:
    settings.PAGE_CACHE_SECONDS = 30
    ProposalFactory.create(title="Cached")
    first = client.get("/")
    second = client.get("/")
    assert second.status_code == 200
    assert first["Content-Security-Policy"] == second["Content-Security-Policy"]


def test_the_policy_built_once_is_django_csp_s_and_follows_the_settings(
    client: Client, settings: Any
) -> None:
    first = client.get("/healthz")["Content-Security-Policy"]
    assert first == build_policy()  # what django-csp's own middleware would send
    directives = settings.CONTENT_SECURITY_POLICY["DIRECTIVES"]
    settings.CONTENT_SECURITY_POLICY = {"DIRECTIVES": {**directives, "img-src": ["'self'"]}}

    second = client.get("/healthz")["Content-Security-Policy"]

    assert _directives(second)["img-src"] == ["'self'"]
    assert second == build_policy() != first


INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)(?![^>]*application/json)[^>]*>", re.I)
INLINE_STYLE = re.compile(r"<style\b|\sstyle=\"", re.I)


def test_pages_have_no_inline_script_or_style_the_policy_would_refuse(
    client: Client, proposal: Any
) -> None:
    pages = ["/", f"/proposals/{proposal.pk}/", "/search/?q=moe", "/archive/", "/recipes/"]
    pages += ["/api/docs/", "/accounts/login/"]
    for path in pages:
        response = client.get(path, follow=True)
        assert response.status_code == 200, path
        html = response.content.decode()
        assert INLINE_SCRIPT.findall(html) == [], path
        assert INLINE_STYLE.findall(html) == [], path


def test_the_api_docs_script_is_served_as_a_file(client: Client) -> None:
    html = client.get("/api/docs/").content.decode()
    scripts = re.findall(r'<script[^>]*src="([^"]+)"', html)
    assert any("script" in src for src in scripts), scripts
    for src in scripts:
        assert not src.startswith(("http:", "https:", "//")), src


def test_images_in_markdown_load_only_from_the_allowed_hosts(settings: Any) -> None:
    settings.MARKDOWN_IMAGE_HOSTS = ["images.marin.example"]
    html = str(
        render_markdown(
            "![plot](https://tracker.example/pixel.png) "
            "![ok](https://images.marin.example/a.png) "
            '<img src="https://tracker.example/raw.png" alt="raw"> '
            "![plain](http://images.marin.example/b.png) "
            "![protocol-relative](//tracker.example/c.png) ![local](/static/d.png)"
        )
    )
    assert '<a href="https://tracker.example/pixel.png"' in html
    assert '<img alt="ok" src="https://images.marin.example/a.png">' in html
    assert "tracker.example/raw.png" not in html  # a raw tag loses its src
    assert '<a href="http://images.marin.example/b.png"' in html  # plain http is a link
    assert '<a href="//tracker.example/c.png"' in html
    assert 'src="/static/d.png"' in html
    assert not re.search(r'<img[^>]*src="(https?:)?//tracker', html)


def test_the_policy_names_the_allowed_image_hosts() -> None:
    env = {**os.environ, "MARKDOWN_IMAGE_HOSTS": "images.marin.example"}
    code = "from marin_site import settings as s; print(s.CONTENT_SECURITY_POLICY['DIRECTIVES']['img-src'])"
    out = subprocess.run(  # noqa: S603 (our own interpreter and code)
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert "https://images.marin.example" in out.stdout


def test_production_settings_turn_on_hsts() -> None:
    env = {**os.environ, "DEBUG": "0", "SECRET_KEY": "x" * 50}
    code = "from marin_site import settings as s; print(s.SECURE_HSTS_SECONDS)"
    out = subprocess.run(  # noqa: S603 (our own interpreter and code)
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert int(out.stdout) >= 180 * 24 * 3600


def test_hsts_is_sent_over_https_only(client: Client, settings: Any) -> None:
    settings.SECURE_HSTS_SECONDS = 31536000
    assert "Strict-Transport-Security" not in client.get("/healthz")
    secure = client.get("/healthz", secure=True)
    assert secure["Strict-Transport-Security"].startswith("max-age=31536000")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_production_server_names_no_version(tmp_path: Path) -> None:
    """gunicorn, as the README's production command runs it, answers without a version."""
    port = _free_port()
    env = {**os.environ, "MARIN_VAR_DIR": str(tmp_path), "DEBUG": "0", "SECRET_KEY": "x" * 50}
    server = subprocess.Popen(  # noqa: S603 (our own gunicorn)
        [
            str(Path(sys.executable).parent / "gunicorn"),
            "marin_site.wsgi",
            "-b",
            f"127.0.0.1:{port}",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/healthz", timeout=2
                ) as response:
                    headers = response.headers
                break
            except urllib.error.HTTPError as error:
                headers = error.headers
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        server.terminate()
        server.wait(timeout=10)
    server_header = headers.get("Server", "")
    assert not re.search(r"\d", server_header), server_header
    assert "Content-Security-Policy" in headers
