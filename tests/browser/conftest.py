"""Real-browser tests: Debian's Chromium driven by Playwright against pytest-django's live server.

The browser is the one ``bin/setup-browser`` installs at /usr/bin/chromium; Playwright never
downloads one. Every request the page makes outside the live server is refused, so a page
that needs a CDN (or an injected iframe that would load one) shows up here. The site's
Celery nudges go to a Redis database of their own (``TEST_REDIS_URL``), never to the
development broker under var/, and tests that approve a proposal get a real worker in this
process plus a stand-in for beat, so runs of the tiny recipe really train and report back.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from celery.contrib.testing.worker import start_worker
from django.conf import settings as django_settings
from playwright.sync_api import Browser, ConsoleMessage, Dialog, Error, Page, sync_playwright

from marin_site.celery import app
from runs import tasks
from tests.runs.runs_helpers import broker

CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
ARTIFACTS = Path(django_settings.BASE_DIR) / "var" / "artifacts"
PASSWORD = "correct-horse-battery"  # tests.factories.UserFactory's password
BEAT_SECONDS = 1.0  # how often the stand-in for beat sends the reconciler


@pytest.fixture(scope="package")
def chromium() -> Iterator[Browser]:
    """One headless Chromium for the package; Playwright's loop lives no longer than that.

    Playwright's synchronous API keeps an asyncio loop running on the main thread, which
    Django's async-safety check reads as "called from async code"; the tests call the ORM
    from the main thread only between browser calls, so the check is lifted while (and only
    while) the browser package runs.
    """
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run bin/setup-browser (bin/test runs it).")
    saved = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=str(CHROMIUM),
                headless=True,
                args=["--disable-dev-shm-usage", "--disable-gpu"],
            )
            try:
                yield browser
            finally:
                browser.close()
    finally:
        if saved is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = saved


@dataclass
class PageProblems:
    """What a page did that no page of the site should: dialogs, uncaught errors, requests
    leaving the live server."""

    dialogs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    outside_requests: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)


@dataclass
class BrowserSession:
    """A signed-out browser context on the live server; ``new_page`` opens watched tabs."""

    browser: Browser
    base_url: str
    problems: PageProblems = field(default_factory=PageProblems)
    _contexts: list[Any] = field(default_factory=list)

    def new_page(self) -> Page:
        context = self.browser.new_context(
            base_url=self.base_url, viewport={"width": 1280, "height": 900}
        )
        context.set_default_timeout(15_000)
        self._contexts.append(context)

        def only_live_server(route: Any) -> None:
            if route.request.url.startswith(f"{self.base_url}/"):
                route.continue_()
            else:
                self.problems.outside_requests.append(route.request.url)
                route.abort()

        context.route("**/*", only_live_server)
        page = context.new_page()

        def on_dialog(dialog: Dialog) -> None:
            self.problems.dialogs.append(f"{dialog.type}: {dialog.message} on {page.url}")
            dialog.dismiss()

        def on_console(message: ConsoleMessage) -> None:
            if message.type == "error":
                self.problems.console_errors.append(f"{message.text} on {page.url}")

        page.on("dialog", on_dialog)
        page.on("pageerror", lambda exc: self.problems.errors.append(f"{exc} on {page.url}"))
        page.on("console", on_console)
        return page

    def close(self) -> None:
        for context in self._contexts:
            with contextlib.suppress(Error):
                context.close()


@pytest.fixture
def browser_session(chromium: Browser, live_server: Any) -> Iterator[BrowserSession]:
    session = BrowserSession(browser=chromium, base_url=live_server.url)
    try:
        yield session
        problems = session.problems
        assert problems.dialogs == [], f"a page opened dialogs: {problems.dialogs}"
        assert problems.errors == [], (
            f"uncaught JavaScript errors: {problems.errors}; console: {problems.console_errors}"
        )
        assert problems.outside_requests == [], (
            f"pages asked for something outside the site: {problems.outside_requests}"
        )
        refused = [text for text in problems.console_errors if "Content Security Policy" in text]
        assert refused == [], f"the Content-Security-Policy refused what a page needs: {refused}"
    finally:
        session.close()


@pytest.fixture
def page(browser_session: BrowserSession) -> Page:
    return browser_session.new_page()


def sign_in(page: Page, username: str, password: str = PASSWORD) -> None:
    """Sign in through the login page, as a person would."""
    response = page.goto("/accounts/login/")
    assert response is not None and response.ok, (
        f"the login page answered {response and response.status}"
    )
    page.fill("input[name=login]", username)
    page.fill("input[name=password]", password)
    page.press("input[name=password]", "Enter")
    page.wait_for_selector(f".account-nav .who:text-is('{username}')")


@pytest.fixture(autouse=True)
def _site_for_the_browser(live_server: Any, settings: Any, tmp_path: Path) -> Iterator[None]:
    """Runs report to the live server, work in tmp_path, and nudges go to the test Redis."""
    settings.RUNS_API_URL = f"{live_server.url}/api/v1/"
    settings.RUNS_WORK_DIR = tmp_path / "runs"
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    try:
        with broker(REDIS_URL):
            yield
    finally:
        _stop_runs(settings.RUNS_WORK_DIR)
        client.flushdb()
        client.close()


def _stop_runs(work_dir: Path) -> None:
    """End the training subprocesses a failed test left behind (each leads its own group)."""
    for supervisor in work_dir.glob("*/supervisor.json"):
        with contextlib.suppress(ValueError, OSError, KeyError, TypeError):
            pid = int(json.loads(supervisor.read_text())["pid"])
            if str(supervisor.parent) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(
                errors="replace"
            ):
                os.killpg(pid, signal.SIGTERM)


@pytest.fixture
def runs_worker(_site_for_the_browser: None) -> Iterator[None]:
    """A Celery worker in this process and beat's reconciler every second, as in production."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(BEAT_SECONDS):
            with contextlib.suppress(Exception):
                tasks.reconcile_task.delay()

    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        thread = threading.Thread(target=beat, name="browser-test-beat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=5)


def artifact_path(name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS / name
