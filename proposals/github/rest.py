"""Reading GitHub's REST API page by page, within its rate limits (``github_backfill``).

PyGithub fits the outbox (one write at a time, retried by rescheduling); a backfill reads
thousands of pages in one process, so it pages here itself: ``Link`` headers, the primary
rate limit read from ``X-RateLimit-Remaining``/``X-RateLimit-Reset`` before every request
(it waits for the reset rather than send past it), secondary limits and 429s waited out by
their ``Retry-After``, and 5xx or a dropped connection retried with a growing back-off.
Only GET is ever sent: the backfill writes nothing to GitHub.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlparse

import requests

LINK = re.compile(r'<([^>]+)>\s*;\s*rel="([a-z]+)"')
MAX_WAIT_SECONDS = 3600.0  # a reset further away than this is GitHub's clock, not ours


class GitHubUnavailable(Exception):
    """GitHub kept failing after every retry; the run stops where its checkpoint is."""


@dataclass
class Page:
    items: list[Any]
    number: int
    next_url: str | None
    last_number: int | None  # from rel="last": how many pages there are, for the ETA


@dataclass
class Answer:
    status: int
    data: Any
    headers: dict[str, str]


def links(header: str | None) -> dict[str, str]:
    return {rel: url for url, rel in LINK.findall(header or "")}


def page_number(url: str | None) -> int | None:
    if not url:
        return None
    values = parse_qs(urlparse(url).query).get("page")
    return int(values[-1]) if values and values[-1].isdecimal() else None


class RestReader:
    """GET requests to one GitHub API host, paced by the rate limit it reports.

    ``sleep`` and ``clock`` are injectable; ``requests_sent`` counts every request sent
    (retries included) and ``waited`` the seconds spent waiting for limits and back-offs.
    """

    def __init__(
        self,
        *,
        base_url: str,
        token: str = "",
        timeout: float = 30.0,
        retries: int = 6,
        backoff: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.sleep = sleep
        self.clock = clock
        self.session = requests.Session()
        self.session.headers.update(
            {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28"}
        )
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"
        self.remaining: int | None = None
        self.reset_at: float | None = None
        self.requests_sent = 0
        self.waited = 0.0

    def _wait(self, seconds: float) -> None:
        seconds = max(0.0, min(seconds, MAX_WAIT_SECONDS))
        if seconds:
            self.waited += seconds
            self.sleep(seconds)

    def _before(self) -> None:
        """Never send with no requests left: wait for the window's reset first."""
        if self.remaining is not None and self.remaining <= 0 and self.reset_at is not None:
            self._wait(self.reset_at - self.clock() + 1)
            self.remaining = None

    def _read_limits(self, headers: Any) -> None:
        remaining, reset = headers.get("X-RateLimit-Remaining"), headers.get("X-RateLimit-Reset")
        if remaining is not None and str(remaining).isdecimal():
            self.remaining = int(remaining)
        if reset is not None and str(reset).isdecimal():
            self.reset_at = float(reset)

    def get(self, path_or_url: str, params: dict[str, Any] | None = None) -> Answer:
        """One GET, retried through limits and failures; 4xx other than limits are answers
        (a 404 or a 301 of an issue transferred away is the caller's to report)."""
        url = path_or_url if "://" in path_or_url else f"{self.base_url}{path_or_url}"
        for attempt in range(self.retries + 1):
            self._before()
            self.requests_sent += 1
            try:
                response = self.session.get(
                    url, params=params, timeout=self.timeout, allow_redirects=False
                )
            except requests.RequestException as exc:
                if attempt == self.retries:
                    raise GitHubUnavailable(f"GET {url}: {exc}") from exc
                self._wait(self.backoff * 2**attempt)
                continue
            self._read_limits(response.headers)
            status = response.status_code
            retry_after = response.headers.get("Retry-After")
            if status in {403, 429} and retry_after and retry_after.isdecimal():
                wait = float(retry_after)  # a secondary limit, or 429
            elif status in {403, 429} and self.remaining == 0:
                wait = (self.reset_at or self.clock()) - self.clock() + 1  # the primary limit
                self.remaining = None
            elif status >= 500:
                wait = self.backoff * 2**attempt
            else:
                try:
                    data = response.json() if response.content else None
                except ValueError:
                    data = None
                return Answer(status, data, dict(response.headers))
            if attempt == self.retries:
                raise GitHubUnavailable(f"GET {url}: {status} after {attempt + 1} attempts")
            self._wait(wait)
        raise GitHubUnavailable(f"GET {url}: no answer")  # pragma: no cover (loop returns)

    def pages(self, path: str, params: dict[str, Any], *, start: int = 1) -> Iterator[Page]:
        """Every page of a list from page ``start``, following ``rel="next"``."""
        url: str | None = f"{self.base_url}{path}"
        query: dict[str, Any] | None = {**params, "page": start}
        number = start
        while url:
            answer = self.get(url, query)
            if answer.status != 200 or not isinstance(answer.data, list):
                raise GitHubUnavailable(f"GET {url}: {answer.status} {str(answer.data)[:200]}")
            rels = links(answer.headers.get("Link"))
            yield Page(answer.data, number, rels.get("next"), page_number(rels.get("last")))
            url, query = rels.get("next"), None
            number = page_number(url) or number + 1
