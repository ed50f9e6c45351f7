"""The runner's doors: what a job reports about its own run with the run's token.

``/api/v1/runs/<id>/{metrics,heartbeat,status,report,config,artifacts}/``: the bearer token
of the run's current attempt (``runs.tokens``), no session, no CSRF. Points go through the
one ingest path (``runs.metrics.ingest``), as from every other door.
"""

from __future__ import annotations

from typing import Any, NoReturn

from django.contrib.auth.models import AnonymousUser
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import (
    NotAuthenticated,
    PermissionDenied,
    ValidationError,
)
from rest_framework.permissions import SAFE_METHODS
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from marin_site.doors import Door
from runs import selectors, tokens
from runs.alerts.services import alerts_not_finite
from runs.metrics import ingest
from runs.metrics import parse as metrics_parse
from runs.models import Run
from runs.serializers import (
    MetricBatchSerializer,
    RunStatusSerializer,
)
from runs.services import claims
from runs.services import runs as run_writes
from runs.trackers import artifacts
from runs.trackers import reports as tracker_reports


def bearer_token(request: Request) -> str:
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise NotAuthenticated("Send the run's token: 'Authorization: Bearer <token>'.")
    return token


def runner_run(request: Request, run_id: int) -> Run:
    """The run the request's bearer token belongs to; refuses a token of another run."""
    token = bearer_token(request)
    run = selectors.runner_run(run_id=run_id)
    if run is None:
        raise PermissionDenied("This token does not belong to this run.")
    if not tokens.run_token_matches(run=run, token=token.strip()):
        if attempt := tokens.run_token_superseded(run=run, token=token.strip()):
            raise tokens.TokenSuperseded(
                f"This token is of attempt {attempt} of run {run.pk}, which is over (the run "
                f"is on attempt {run.attempt}); nothing it sends is taken."
            )
        raise PermissionDenied("This token does not belong to this run.")
    refusal = tokens.run_token_refusal(run=run, write=request.method not in SAFE_METHODS)
    if refusal is not None:
        raise refusal
    return run


class RunnerView(APIView):
    """Base of the runner's doors: the run's own bearer token, no session, no CSRF."""

    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []

    def get_authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="run"'  # so a missing token is a 401, not a 403


# What a runner's client accepts that DRF's negotiation answers with its JSON renderer (the
# first of the defaults): anything else, or ``?format=``, takes DRF's whole cycle.
_JSON_ACCEPTS = frozenset({"", "*/*", "application/json"})


class RunMetricsView(RunnerView):
    """``POST {"points": [{key, step, value, time?}]}``: upserted by (run, key, step), key by
    key. The answer: ``{"stored": n, "refused": [...], "flagged": [...], "refused_keys": n,
    "alerts_opened": n}``, each entry ``{key, reason, step, points}`` (the first step). A
    refused key's points cannot be stored (``runs.metrics.parse``); a flagged key's are
    stored and flagged (``runs.metrics.flags``). 200 when anything was usable; 400 with the
    same lists when nothing was."""

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        """DRF's cycle without its request wrapper, negotiation and per-request checks, for a
        POST that accepts JSON: this door has no authentication classes, permissions,
        throttles or parsers to run (it reads the raw body), and every batch of every run
        comes through it. The answer is the same Response, finished by DRF (its renderer,
        ``Allow`` and ``Vary``), and errors go through the same handler. Any other method, or
        an ``Accept`` DRF might answer with another renderer, takes the whole cycle."""
        if not self.takes_short_cycle(request):
            return super().dispatch(request, *args, **kwargs)
        self.args, self.kwargs = args, kwargs
        self.request = request  # type: ignore[assignment]
        self.headers = self.default_response_headers
        renderer = self.renderer_classes[0]()
        # What DRF's negotiation and its authentication (none: an anonymous user) leave.
        request.accepted_renderer = renderer  # type: ignore[attr-defined]
        request.accepted_media_type = renderer.media_type  # type: ignore[attr-defined]
        request.user = AnonymousUser()
        try:
            response = self.post(request, *args, **kwargs)  # type: ignore[arg-type]
        except Exception as exc:  # answered as DRF answers it
            response = self.handle_exception(exc)
        self.response = self.finalize_response(request, response, *args, **kwargs)  # type: ignore[arg-type]
        return self.response

    @staticmethod
    def takes_short_cycle(request: HttpRequest) -> bool:
        """A POST accepting JSON: answered without DRF's request wrapper here, and through
        the runner's lane of middleware (``marin_site.middleware.RunnerLaneMiddleware``)."""
        return (
            request.method == "POST"
            and request.META.get("HTTP_ACCEPT", "").strip() in _JSON_ACCEPTS
            and "format" not in request.GET
        )

    def raise_uncaught_exception(self, exc: Exception) -> NoReturn:
        if not isinstance(self.request, Request):  # the short cycle: a plain HttpRequest
            raise exc
        super().raise_uncaught_exception(exc)

    @extend_schema(request=MetricBatchSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request, pk: int) -> Response:
        # The process's admission of this token (its last full check), or the full check,
        # which then keeps one: a batch taken on an admission is stored only while the run's
        # row still says what it kept (runs.tokens.Admission), else checked in full here.
        admission = tokens.admission_for(run_id=pk, token=bearer_token(request).strip())
        if admission is not None:
            run = admission.run()
        else:
            run = runner_run(request, pk)
            if request.method not in SAFE_METHODS:
                tokens.admission_keep(run=run)
        counted_in = ""  # the rate window counting this batch

        def row_checked() -> Run:
            """The full check, after the batch was counted on the admission: a refusal
            gives the count back, so a refused batch costs the run nothing."""
            try:
                return runner_run(request, pk)
            except Exception:
                ingest.metrics_rate_return(counted_in=counted_in)
                raise

        try:
            try:
                counted_in = ingest.metrics_rate_check(run_id=run.pk)
                # The raw body, not request.data: orjson and one checking loop are several
                # times faster than DRF's parser for 1000 points (bench/ingest.py).
                checked = metrics_parse.points_check_body(body=request.body)
            except Exception as exc:
                if admission is not None:  # the row's refusal comes first, as without one
                    counted_in = counted_in or getattr(exc, "counted_in", "")
                    row_checked()
                raise
        except ingest.RateLimited as exc:
            return Response(
                {"detail": exc.message}, status=429, headers={"Retry-After": str(exc.retry_after)}
            )
        # A NaN or an infinity is refused (never stored) and opens the key's NaN alert when
        # the run's rules watch it: the refusal says the value was not stored, the alert that
        # the run diverged; both name the same key and first step (docs/trackers.md).
        opened = 0
        first_steps = checked.not_finite()
        # Nothing to store (no statement to check the row), or alerts to open before the
        # points: the row is checked first, as without an admission.
        if admission is not None and (first_steps or not len(checked.batch)):
            admission, run = None, row_checked()
        if first_steps:
            opened = alerts_not_finite(run=run, first_steps=first_steps, door=Door.RUNNER)
        try:
            stored, misfits = ingest.metrics_ingest_flagged(
                run=run, batch=checked.batch, door=Door.RUNNER, admission=admission
            )
        except ingest.NotAdmitted:  # nothing written: the row changed, or points were stored
            tokens.admission_forget(run_id=pk)
            run = row_checked()  # refuses as the row now says, or goes again
            stored, misfits = ingest.metrics_ingest_flagged(
                run=run, batch=checked.batch, door=Door.RUNNER
            )
        refused = metrics_parse.refusals_listed(checked.refused)
        answer = {
            "stored": stored,
            "refused": refused,
            "refused_keys": len(checked.refused),
            "flagged": [
                {"key": m.key, "reason": m.reason, "step": m.step, "points": m.points}
                for m in misfits
            ],
            "alerts_opened": opened,
        }
        return Response(answer, status=400 if checked.refused and not stored else 200)


class RunHeartbeatView(RunnerView):
    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request, pk: int) -> Response:
        run = ingest.run_heartbeat(run_id=runner_run(request, pk).pk)
        return Response(
            {"state": run.state, "cancel_requested": run.cancel_requested_at is not None}
        )


class RunStatusView(RunnerView):
    """The runner's last word: ``finished`` or ``failed`` (with a failure kind)."""

    @extend_schema(request=RunStatusSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request, pk: int) -> Response:
        run = runner_run(request, pk)
        serializer = RunStatusSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        failure_kind = data["failure_kind"] if data["state"] == "failed" else ""
        if data["state"] == "failed" and not failure_kind:
            failure_kind = "code"
        run = run_writes.run_transition(
            run_id=run.pk,
            to_state=data["state"],
            failure_kind=failure_kind,
            message=data["message"],
            door=Door.RUNNER,
            actor_label="runner",
        )
        return Response({"state": run.state})


class RunReportView(RunnerView):
    """``POST {"config"?: {...}, "summary"?: {...}, "artifacts"?: [{uri, name?, type?}]}``:
    what a tracker reports besides points (the Levanter tracker's hyperparameters, summary
    and artifacts). Config and summary merge into what the run has; artifacts are links."""

    @extend_schema(request=OpenApiTypes.OBJECT, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request, pk: int) -> Response:
        run = runner_run(request, pk)
        data = request.data
        if not isinstance(data, dict) or not data.keys() <= {"config", "summary", "artifacts"}:
            raise ValidationError(
                {"detail": ["send an object with any of 'config', 'summary', 'artifacts'"]}
            )
        config = data.get("config")
        if config is not None and not isinstance(config, dict):
            raise ValidationError({"config": ["must be an object"]})
        summary = None
        left_out: list[str] = []
        if "summary" in data:
            summary, left_out = tracker_reports.summary_clean(data["summary"])
        raw_artifacts = data.get("artifacts") or []
        if not isinstance(raw_artifacts, list) or len(raw_artifacts) > 100:
            raise ValidationError({"artifacts": ["a list of at most 100 artifacts"]})
        reported = [tracker_reports.artifact_clean(item) for item in raw_artifacts]
        run, problems = tracker_reports.run_tracker_report(
            run_id=run.pk, config=config, summary=summary, artifacts=reported
        )
        return Response(
            {
                "final_metrics": run.final_metrics,
                "artifacts": len(run.tracker_artifacts),
                "left_out": left_out + problems,
            }
        )


class RunConfigView(RunnerView):
    """``POST {"config": {...}}``: the config the run used; a hash other than the plan's
    resolved config's is flagged on the run."""

    @extend_schema(request=OpenApiTypes.OBJECT, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request, pk: int) -> Response:
        run = runner_run(request, pk)
        data = request.data if isinstance(request.data, dict) else {}
        run = claims.run_report_config(run=run, config=data.get("config"))
        return Response(
            {"config_hash": run.reported_config_hash, "matches_plan": not run.config_mismatch}
        )


class RunArtifactView(RunnerView):
    """``POST {"kind": "wandb"|"checkpoint"|"link", "uri", "name"?, "step"?}``: a link the
    run reports about itself; shown on its page (a W&B link also in the run table)."""

    @extend_schema(request=OpenApiTypes.OBJECT, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request, pk: int) -> Response:
        run = runner_run(request, pk)
        artifact = artifacts.run_artifact_add(run=run, data=request.data)
        return Response({"id": artifact.pk, "kind": artifact.kind, "uri": artifact.uri}, status=201)
