"""Refuse request bodies over the configured cap with 413 before anything reads them."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

# Paths whose own cap differs from REQUEST_BODY_CAP (GitHub sends webhooks up to 25 MB).
PATH_BODY_CAPS: dict[str, int] = {"/github/webhook/": 25 * 1024 * 1024}


def body_cap_for(path: str) -> int:
    for prefix, cap in PATH_BODY_CAPS.items():
        if path.startswith(prefix):
            return cap
    return int(settings.REQUEST_BODY_CAP)


class RequestBodyCapMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return JsonResponse({"detail": "Content-Length is not a number."}, status=400)
        cap = body_cap_for(request.path)
        if length > cap:
            return JsonResponse(
                {"detail": f"Request body is {length} bytes; the limit is {cap} bytes."},
                status=413,
            )
        return self.get_response(request)
