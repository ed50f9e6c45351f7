"""Site-wide views: the health check, and the 404 and 500 answers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from allauth.socialaccount.adapter import get_adapter
from django.db import connection
from django.http import HttpRequest, HttpResponse, HttpResponsePermanentRedirect, JsonResponse
from django.shortcuts import render
from django.templatetags.static import static
from django.views import defaults
from django.views.decorators.cache import never_cache

from marin_site.celery import app as celery_app


def _database() -> str | None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:
        return f"unreachable: {exc.__class__.__name__}: {exc}"
    return None


def _broker() -> str | None:
    try:
        with celery_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, timeout=2)
    except Exception as exc:
        return f"unreachable: {exc.__class__.__name__}: {exc}"
    return None


@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    """200 when the database and the broker answer; 503 naming whichever does not."""
    problems = {"database": _database(), "broker": _broker()}
    body = {name: problem or "ok" for name, problem in problems.items()}
    failing = [name for name, problem in problems.items() if problem]
    status = 503 if failing else 200
    return JsonResponse({"status": "unavailable" if failing else "ok", **body}, status=status)


# Machine doors answer machines: a refusal there is JSON, never the site's HTML page.
MACHINE_PREFIXES = ("/api/", "/mlflow/", "/github/webhook/")


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.path.startswith(MACHINE_PREFIXES):
        return JsonResponse({"detail": "Not found."}, status=404)
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    if request.path.startswith(MACHINE_PREFIXES):
        return JsonResponse({"detail": "Server error: it has been logged."}, status=500)
    return defaults.server_error(request)


def favicon(request: HttpRequest) -> HttpResponse:
    """``/favicon.ico``, which browsers and feed readers ask for whatever the page links:
    the site's icon (a static file, ``static/img/favicon.svg``)."""
    return HttpResponsePermanentRedirect(static("img/favicon.svg"))


def github_sign_in(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """allauth's GitHub sign-in ``view``, answering in words where this site has no GitHub
    OAuth app (allauth raises, a 500, for someone who types the address)."""

    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not get_adapter(request).list_apps(request, provider="github"):
            return render(
                request,
                "refused.html",
                {
                    "problems": [
                        "Signing in with GitHub is not set up on this site: sign in with your"
                        " username and password."
                    ],
                    "back": "/accounts/login/",
                },
                status=404,
            )
        return view(request, *args, **kwargs)

    return guarded
