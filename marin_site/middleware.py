"""Refuse request bodies over the configured cap with 413 before anything reads them."""

from __future__ import annotations

import re
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

# Paths whose own cap differs from REQUEST_BODY_CAP (GitHub sends webhooks up to 25 MB).
# MLflow's door reads at most 1 MB itself and refuses more in MLflow's error shape.
PATH_BODY_CAPS: dict[str, int] = {
    "/github/webhook/": 25 * 1024 * 1024,
    "/mlflow/": 64 * 1024 * 1024,
}
# Streamed uploads of a run's tracker_metrics.jsonl (runs/trackers/jsonl.py reads them in
# blocks and stops at the same cap when no Content-Length announced the size).
STREAMED_UPLOAD_PATHS = re.compile(r"^/(?:api/v1/)?runs/\d+/(?:tracker-metrics|import)/$")


def body_cap_for(path: str) -> int:
    for prefix, cap in PATH_BODY_CAPS.items():
        if path.startswith(prefix):
            return cap
    if path == "/imports/":  # the importers' page: marin_site/importing.py caps what it reads
        return int(settings.IMPORTS_MAX_BYTES)
    if STREAMED_UPLOAD_PATHS.match(path):
        return int(settings.RUNS_TRACKER_IMPORT_MAX_BYTES)
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
