"""A shared cache of the public read pages, for readers who are not signed in.

Everything on marin-site is public, and most readers are anonymous: the list, a proposal
page and the API's list are the same bytes for all of them until something changes. This
middleware keeps those responses in the cache (Redis in production) under a *generation*
number. Any write that can change a page (a proposal, review, comment, event, label, run)
bumps the generation after its transaction commits, so the next reader gets a fresh page;
``PAGE_CACHE_SECONDS`` bounds how long a page can live if a write slipped past the bump
(a bulk ``UPDATE`` sends no signal).

Only a response that is the same for everyone is kept: GET or HEAD, no session or
Authorization on the request, status 200, no cookie set, and no ``Cache-Control: private``
or ``no-store`` from the view (a proposal page with runs in flight says ``private``: its
numbers change every few seconds). The URL names that may be kept are listed in
``PAGE_CACHE_VIEWS``.

The cache is off when ``PAGE_CACHE_SECONDS`` is 0, which is the default without a shared
cache: a per-process memory cache cannot see the worker's writes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models.signals import m2m_changed, post_delete, post_save
from django.http import HttpRequest, HttpResponse
from django.urls import Resolver404, resolve

GENERATION_KEY = "pagecache:generation"
HEADER = "X-Page-Cache"


def generation_bump() -> None:
    """Make every cached page stale, once the current transaction commits."""
    transaction.on_commit(_bump)


def _bump() -> None:
    try:
        cache.incr(GENERATION_KEY)
    except ValueError:  # not there yet (or evicted): any new value invalidates
        cache.set(GENERATION_KEY, 1, timeout=None)


PAGE_SIGNALS = (post_save, post_delete, m2m_changed)  # what an app's page receivers hear


def _cacheable_request(request: HttpRequest) -> bool:
    if request.method not in {"GET", "HEAD"}:
        return False
    if "HTTP_AUTHORIZATION" in request.META:
        return False
    cookies = request.COOKIES
    return settings.SESSION_COOKIE_NAME not in cookies and "messages" not in cookies


def _cacheable_response(response: HttpResponse) -> bool:
    if response.status_code != 200 or response.streaming or response.cookies:
        return False
    control = response.get("Cache-Control", "")
    return not any(word in control for word in ("private", "no-store", "no-cache"))


class PublicPageCacheMiddleware:
    """Serve the listed public pages to anonymous readers from the cache."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        seconds = settings.PAGE_CACHE_SECONDS
        if not seconds or not _cacheable_request(request) or not self._listed(request):
            return self.get_response(request)
        page_key = self._key(request)
        found = cache.get_many([GENERATION_KEY, page_key])
        current = found.get(GENERATION_KEY, 0)
        stored = found.get(page_key)
        if stored is not None and stored[0] == current:
            _, status, headers, content = stored
            response = HttpResponse(content, status=status)
            for name, value in headers:
                response[name] = value
            response[HEADER] = "hit"
            return response
        response = self.get_response(request)
        if _cacheable_response(response):
            headers = [(k, v) for k, v in response.items() if k.lower() != "content-length"]
            cache.set(page_key, (current, response.status_code, headers, response.content), seconds)
            response[HEADER] = "miss"
        return response

    @staticmethod
    def _listed(request: HttpRequest) -> bool:
        try:
            match = resolve(request.path_info)
        except Resolver404:
            return False
        return match.view_name in settings.PAGE_CACHE_VIEWS

    @staticmethod
    def _key(request: HttpRequest) -> str:
        vary = "\n".join(
            (
                request.get_full_path(),
                request.META.get("HTTP_ACCEPT", ""),
                request.META.get("HTTP_HOST", ""),
                "https" if request.is_secure() else "http",
            )
        )
        return "pagecache:page:" + hashlib.sha256(vary.encode()).hexdigest()
