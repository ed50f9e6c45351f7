"""Refuse request bodies over the configured cap with 413 before anything reads them, and
forms not in UTF-8 with 400 before anything decodes them; the Content-Security-Policy header
on every answer, built once; and the runner's lane, which takes a run's metrics batches
through only the middleware that act on them."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from csp.constants import HEADER, HEADER_REPORT_ONLY
from csp.middleware import CheckableLazyObject, CSPMiddleware
from csp.utils import build_policy
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, RequestDataTooBig, TooManyFieldsSent
from django.core.handlers.exception import convert_exception_to_response
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.http.multipartparser import MultiPartParserError
from django.urls import resolve
from django.utils.html import escape
from django.utils.module_loading import import_string

from marin_site.input import decoded_form_problem, form_encoding_problem

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


FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


class FormEncodingMiddleware:
    """A form posted in bytes that are not UTF-8 is refused with a 400 saying which field,
    before anything reads it: Django would decode it with U+FFFD in place of the bad bytes
    and the site would store them silently (``marin_site.input``)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        problem = self.problem(request)
        if problem:
            message = f"The form is refused: {problem}. Send it in UTF-8."
            if request.path.startswith(("/api/", "/mlflow/")):
                return JsonResponse({"detail": message}, status=400)
            return HttpResponse(
                f"<!doctype html><title>Refused</title><p>{escape(message)}</p>",
                status=400,
                content_type="text/html; charset=utf-8",
            )
        return self.get_response(request)

    @staticmethod
    def problem(request: HttpRequest) -> str | None:
        if request.method in ("GET", "HEAD", "OPTIONS"):
            return None
        content_type = request.META.get("CONTENT_TYPE", "").split(";")[0].strip().lower()
        if content_type not in FORM_TYPES or STREAMED_UPLOAD_PATHS.match(request.path):
            return None
        try:
            if content_type == FORM_TYPES[0]:
                return form_encoding_problem(request.body)
            return decoded_form_problem(dict(request.POST.lists()))
        except (RequestDataTooBig, TooManyFieldsSent, MultiPartParserError):
            return None  # Django answers these itself when the view reads the form


# What a view may set on its answer to change the policy for it (django-csp's decorators).
_POLICY_OF_A_VIEW = tuple(
    f"_csp_{kind}{ro}" for kind in ("config", "update", "replace") for ro in ("", "_ro")
)


class PolicyMiddleware(CSPMiddleware):
    """django-csp's middleware, with the site's policy built once, not on every answer
    (about 0.1 ms of CPU each: a hundred agents answered at once paid 10 ms of it). An answer
    whose policy varies (a nonce used, a view's own policy, Django's debug pages) goes
    through django-csp's own code."""

    def __init__(self, get_response: Any) -> None:
        super().__init__(get_response)
        self._built: dict[bool, tuple[object, str]] = {}  # report only -> (its setting, header)

    def _policy(self, *, report_only: bool) -> tuple[str, tuple[str, ...]]:
        """The header of the policy (or of the report-only one) and its excluded prefixes."""
        name = "CONTENT_SECURITY_POLICY" + ("_REPORT_ONLY" if report_only else "")
        setting = getattr(settings, name, None)
        built = self._built.get(report_only)
        if built is None or built[0] is not setting:  # new settings (a test's override)
            built = self._built[report_only] = (setting, build_policy(report_only=report_only))
        return built[1], tuple((setting or {}).get("EXCLUDE_URL_PREFIXES") or ())

    def process_response(
        self, request: HttpRequest, response: HttpResponseBase
    ) -> HttpResponseBase:
        if (
            getattr(request, "_csp_nonce", None) is not None
            or any(hasattr(response, name) for name in _POLICY_OF_A_VIEW)
            or (settings.DEBUG and response.status_code in (404, 500))
        ):
            return super().process_response(request, response)
        for report_only, header in ((False, HEADER), (True, HEADER_REPORT_ONLY)):
            policy, excluded = self._policy(report_only=report_only)
            exempt = getattr(response, "_csp_exempt" + ("_ro" if report_only else ""), False)
            if (
                policy
                and header not in response
                and exempt is False
                and not request.path_info.startswith(excluded)
            ):
                response[header] = policy
        request.csp_nonce = CheckableLazyObject(self._csp_nonce_post_response)  # type: ignore[attr-defined]
        return response


# The middleware a runner's metrics POST skips, and why each does nothing for it: the door
# takes a bearer token and a JSON body, answers JSON, and reads no session, cookie or user.
RUNNER_LANE_SKIPS = {
    "whitenoise.middleware.WhiteNoiseMiddleware": "serves files under STATIC_URL only",
    "django.contrib.sessions.middleware.SessionMiddleware": "no session is read: no cookie, no Vary",
    "django.middleware.csrf.CsrfViewMiddleware": "the door is csrf_exempt (a bearer token)",
    "django.contrib.auth.middleware.AuthenticationMiddleware": "the door's user is anonymous",
    "django.contrib.messages.middleware.MessageMiddleware": "no messages on a JSON answer",
    "allauth.account.middleware.AccountMiddleware": "redirects the account pages' 404s only",
    "marin_site.pagecache.PublicPageCacheMiddleware": "caches public GET pages only",
}
# The runner's metrics door (``runs.runner_api.RunMetricsView``, ``<int:pk>`` in its route).
RUNNER_LANE_PATH = re.compile(r"/api/v1/runs/(?P<pk>[0-9]+)/metrics/\Z")


class RunnerLaneMiddleware:
    """Every metrics batch of every run through the middleware that acts on it, not the
    whole chain: first in MIDDLEWARE, it hands a POST to the metrics door that takes the
    door's short cycle (``takes_short_cycle``: JSON accepted) to a chain of the middleware
    after it but those in RUNNER_LANE_SKIPS (the body cap, the security and CSP headers, the
    common and frame headers stay), ending in the door's view without resolving the URL again.
    The answer is the one the whole chain gives (tests/marin_site/test_middleware.py holds
    them equal); anything else goes the whole way. About 0.2 ms of a batch's 5 of Python."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.lane: Callable[[HttpRequest], HttpResponse] | None = None
        self.view: Any = None

    def __call__(self, request: HttpRequest) -> HttpResponse:
        match = RUNNER_LANE_PATH.match(request.path_info)
        if match is None or request.method != "POST":
            return self.get_response(request)
        if self.lane is None:
            self.view = resolve(request.path_info).func
            self.lane = self._chain()
        if not self.view.view_class.takes_short_cycle(request):
            return self.get_response(request)
        request.runner_lane_kwargs = {"pk": int(match["pk"])}  # type: ignore[attr-defined]
        return self.lane(request)

    def _chain(self) -> Callable[[HttpRequest], HttpResponse]:
        """The lane's middleware, each wrapped as Django wraps it, around the view."""
        if any(db.get("ATOMIC_REQUESTS") for db in settings.DATABASES.values()):
            return self.get_response  # the view would run in a transaction: the whole way
        after = settings.MIDDLEWARE[settings.MIDDLEWARE.index(RUNNER_LANE) + 1 :]
        handler: Any = convert_exception_to_response(self._view)
        for path in reversed([p for p in after if p not in RUNNER_LANE_SKIPS]):
            middleware = import_string(path)(handler)
            hooks = ("process_view", "process_exception", "process_template_response")
            if any(hasattr(middleware, hook) for hook in hooks):
                raise ImproperlyConfigured(f"{path} hooks the view: not in the runner's lane")
            handler = convert_exception_to_response(middleware)
        return handler

    def _view(self, request: HttpRequest) -> HttpResponse:
        """What Django's handler does around a view without view or template middleware:
        call it, and render the answer."""
        response = self.view(request, **request.runner_lane_kwargs)  # type: ignore[attr-defined]
        if response is None:
            raise ValueError("The runner's metrics view returned None.")
        if callable(getattr(response, "render", None)):
            response = response.render()
        return response


RUNNER_LANE = f"{RunnerLaneMiddleware.__module__}.{RunnerLaneMiddleware.__qualname__}"
