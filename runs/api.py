"""API doors for recipes and plan previews."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpResponse, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, PolymorphicProxySerializer, extend_schema
from rest_framework import mixins, viewsets
from rest_framework.authentication import SessionAuthentication, TokenAuthentication
from rest_framework.decorators import action
from rest_framework.exceptions import (
    NotAuthenticated,
    NotFound,
    PermissionDenied,
    ValidationError,
)
from rest_framework.permissions import SAFE_METHODS
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from marin_site.api import HasNamedPermission
from marin_site.doors import Door
from runs import (
    artifacts,
    claims,
    selectors,
    tokens,
    tracker_import,
    tracker_reports,
    tracker_uploads,
)
from runs import permissions as run_perms
from runs.api_shapes import (
    ChartDataSerializer,
    RunLogsSerializer,
    RunSeriesKeysSerializer,
    RunSeriesSerializer,
)
from runs.executors import get_executor
from runs.metrics import ingest
from runs.metrics import parse as metrics_parse
from runs.metrics import points as metric_points
from runs.models import Run
from runs.serializers import (
    MetricBatchSerializer,
    PlanPreviewRequestSerializer,
    PlanSerializer,
    RecipeSerializer,
    RunDetailSerializer,
    RunSerializer,
    RunStatusSerializer,
    TrackerImportSerializer,
    plan_data,
)
from runs.series import charts
from runs.services import plans as plan_services
from runs.services import recipes as recipe_services
from runs.services import runs as run_writes


class RecipeViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    viewsets.GenericViewSet,
):
    """Recipes: public to read; maintainers register and edit them."""

    serializer_class = RecipeSerializer
    permission_classes = [HasNamedPermission]
    permission_name = run_perms.MANAGE_RECIPES
    filterset_fields = ["name", "is_active"]

    def get_queryset(self) -> Any:
        return selectors.recipe_list(include_inactive=True).order_by("name", "-created_at")

    def perform_create(self, serializer: Any) -> None:
        serializer.instance = recipe_services.recipe_create(
            actor=self.request.user, data=dict(serializer.validated_data), door=Door.API
        )

    def perform_update(self, serializer: Any) -> None:
        assert serializer.instance is not None
        serializer.instance = recipe_services.recipe_update(
            recipe=serializer.instance,
            data=dict(serializer.validated_data),
            actor=self.request.user,
            door=Door.API,
        )


class PlanPreviewView(APIView):
    """The plan a recipe, baseline and ablation spec would launch; nothing is stored."""

    permission_classes: list[Any] = []
    throttle_classes = [ScopedRateThrottle]  # expanding a large spec costs real CPU
    throttle_scope = "plan-preview"

    @extend_schema(request=PlanPreviewRequestSerializer, responses=PlanSerializer)
    def post(self, request: Request) -> Response:
        serializer = PlanPreviewRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        preview = plan_services.plan_build(
            recipe=data["recipe"],
            baseline=data.get("baseline") or {},
            spec_text=data.get("ablation_spec") or "",
            budget_accelerator_hours=data.get("budget_accelerator_hours"),
        )
        return Response(PlanSerializer(plan_data(preview)).data)


# --- runs: public reads, maintainer actions, and the runner's doors -----------------------


def _runner_run(request: Request, run_id: int) -> Run:
    """The run the request's bearer token belongs to; refuses a token of another run."""
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise NotAuthenticated("Send the run's token: 'Authorization: Bearer <token>'.")
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


class RunViewSet(viewsets.ReadOnlyModelViewSet[Run]):
    """Runs: public to read; maintainers cancel, rerun and retry them."""

    filterset_fields = ["plan", "state", "executor"]

    def get_queryset(self) -> Any:
        if self.action == "retrieve":
            return (
                selectors.run_list()
                .select_related("plan")
                .prefetch_related("summaries", "events__actor", "artifacts")
            )
        return selectors.run_list()

    def get_serializer_class(self) -> Any:
        return RunDetailSerializer if self.action == "retrieve" else RunSerializer

    def _maintainer_action(self, request: Request, permission: str, service: Any) -> Response:
        run = self.get_object()
        if not request.user.has_perm(permission, run):
            raise PermissionDenied(f"You need the permission '{permission}'.")
        result = service(run_id=run.pk, actor=request.user, door=Door.API)
        return Response(RunSerializer(result).data)

    @extend_schema(request=None, responses=RunSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        return self._maintainer_action(request, run_perms.CANCEL_RUN, run_writes.run_cancel)

    @extend_schema(request=None, responses=RunSerializer)
    @action(detail=True, methods=["post"])
    def rerun(self, request: Request, pk: str) -> Response:
        return self._maintainer_action(request, run_perms.RERUN_RUN, run_writes.run_rerun)

    @extend_schema(request=None, responses=RunSerializer)
    @action(detail=True, methods=["post"])
    def retry(self, request: Request, pk: str) -> Response:
        return self._maintainer_action(request, run_perms.RETRY_RUN, run_writes.run_retry)

    @extend_schema(request=OpenApiTypes.OBJECT, responses=OpenApiTypes.OBJECT)
    @action(detail=True, methods=["post"])
    def claim(self, request: Request, pk: str) -> Response:
        """Claim a queued run to execute by hand: ``{"where": "our lab, 8xA100"}``. Answers
        the exact command, the resolved config and the run's token, once."""
        run = self.get_object()
        data = request.data if isinstance(request.data, dict) else {}
        claim = claims.run_claim(
            run_id=run.pk, actor=request.user, where=data.get("where"), door=Door.API
        )
        return Response(
            {
                "run": RunSerializer(claim.run).data,
                "token": claim.token,
                "api_url": claim.env["RUN_API_URL"],
                "env": claim.env,
                "command": claim.command,
                "config": claim.run.config,
                "config_hash": claim.run.config_hash,
                "config_file": claim.config_file,
            },
            status=201,
        )

    @extend_schema(request=None, responses=RunSerializer)
    @action(detail=True, methods=["post"], url_path="give-back")
    def give_back(self, request: Request, pk: str) -> Response:
        run = claims.run_claim_release(
            run_id=self.get_object().pk, actor=request.user, door=Door.API
        )
        return Response(RunSerializer(run).data)

    @extend_schema(
        parameters=[
            OpenApiParameter("key", str, description="a metric key; without it, the run's keys"),
            OpenApiParameter("points", int, description="at most this many points (2-10000)"),
        ],
        responses=PolymorphicProxySerializer(
            component_name="RunSeriesAnswer",
            serializers=[RunSeriesSerializer, RunSeriesKeysSerializer],
            resource_type_field_name=None,
        ),
    )
    @action(detail=True, methods=["get"])
    def series(self, request: Request, pk: str) -> Response:
        run = self.get_object()
        key = request.query_params.get("key", "")
        if not key:
            return Response({"keys": metric_points.series_keys(run_id=run.pk)})
        try:
            points = int(request.query_params.get("points", "1000"))
        except ValueError:
            raise ValidationError({"points": ["must be an integer"]}) from None
        if not 2 <= points <= 10_000:
            raise ValidationError({"points": ["must be between 2 and 10000"]})
        return Response(charts.run_series_downsampled(run_id=run.pk, key=key, points=points))

    @extend_schema(
        parameters=[OpenApiParameter("key", str, description="one key; every key when absent")],
        responses={(200, "text/csv"): OpenApiTypes.STR},
    )
    @action(detail=True, methods=["get"], url_path="metrics.csv")
    def csv(self, request: Request, pk: str) -> StreamingHttpResponse:
        run = self.get_object()
        key = request.query_params.get("key") or None
        response = StreamingHttpResponse(
            metric_points.points_csv_rows(run_id=run.pk, key=key), content_type="text/csv"
        )
        response["Content-Disposition"] = f'attachment; filename="run-{run.pk}-metrics.csv"'
        return response

    @extend_schema(responses=RunLogsSerializer)
    @action(detail=True, methods=["get"])
    def logs(self, request: Request, pk: str) -> Response:
        run = self.get_object()
        if not run.external_id:
            return Response({"logs": ""})
        text = get_executor(run.executor).logs(run.external_id)
        return Response({"logs": text})


class RunnerView(APIView):
    """Base of the runner's doors: the run's own bearer token, no session, no CSRF."""

    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []

    def get_authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="run"'  # so a missing token is a 401, not a 403


class RunMetricsView(RunnerView):
    """``POST {"points": [{key, step, value, time?}]}``: upserted by (run, key, step)."""

    @extend_schema(request=MetricBatchSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request, pk: int) -> Response:
        run = _runner_run(request, pk)
        try:
            ingest.metrics_rate_check(run_id=run.pk)
        except ingest.RateLimited as exc:
            return Response(
                {"detail": exc.message}, status=429, headers={"Retry-After": str(exc.retry_after)}
            )
        # The raw body, not request.data: orjson and one checking loop are several times
        # faster than DRF's parser for 1000 points (bench/ingest.py).
        batch = metrics_parse.points_parse_body(body=request.body)
        stored = ingest.metrics_ingest(run=run, batch=batch)
        return Response({"stored": stored})


class RunHeartbeatView(RunnerView):
    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request, pk: int) -> Response:
        run = ingest.run_heartbeat(run_id=_runner_run(request, pk).pk)
        return Response(
            {"state": run.state, "cancel_requested": run.cancel_requested_at is not None}
        )


class RunStatusView(RunnerView):
    """The runner's last word: ``finished`` or ``failed`` (with a failure kind)."""

    @extend_schema(request=RunStatusSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request, pk: int) -> Response:
        run = _runner_run(request, pk)
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
        run = _runner_run(request, pk)
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
        run = _runner_run(request, pk)
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
        run = _runner_run(request, pk)
        artifact = artifacts.run_artifact_add(run=run, data=request.data)
        return Response({"id": artifact.pk, "kind": artifact.kind, "uri": artifact.uri}, status=201)


class RunTrackerImportView(APIView):
    """Import a ``tracker_metrics.jsonl`` into a run, whole (every step, config, summary): the
    run's token, or a maintainer.

    ``application/json`` ``{"jsonl": "..."}`` (at most 1 MB) is imported at once. Any other
    body (``application/x-ndjson``, ``text/plain``) is the file itself, streamed: checked as
    it arrives (``?strict=1``: any wrong line refuses it whole), kept, and imported by a task;
    the answer is 202 with the import's progress at ``GET .../tracker-imports/``.
    """

    authentication_classes = [TokenAuthentication, SessionAuthentication]
    permission_classes: list[Any] = []

    def get_authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="run"'

    @extend_schema(request=TrackerImportSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request, pk: int) -> Response:
        run, door, label = _importer_run(request, pk)
        content_type = request.content_type.split(";")[0].strip().lower()
        if content_type != "application/json":
            upload = tracker_uploads.tracker_import_receive(
                run_id=run.pk,
                stream=request._request,
                door=door,
                actor=request.user,
                actor_label=label,
                filename=request.query_params.get("filename", "")[:255],
                strict=request.query_params.get("strict") in {"1", "true"},
            )
            return Response(TrackerImportSerializer.progress(upload), status=202)
        if int(request.META.get("CONTENT_LENGTH") or 0) > int(settings.REQUEST_BODY_CAP):
            return Response(
                {
                    "detail": "A JSON body holds at most "
                    f"{settings.REQUEST_BODY_CAP} bytes; send a larger file as "
                    "application/x-ndjson, streamed."
                },
                status=413,
            )
        serializer = TrackerImportSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        run = tracker_import.run_import_tracker_metrics(
            run_id=run.pk, jsonl=serializer.validated_data["jsonl"]
        )
        return Response({"final_metrics": run.final_metrics})


def _importer_run(request: Request, pk: int) -> tuple[Run, str, str]:
    """The run a tracker import names, if the caller may import into it; the door and label."""
    if request.META.get("HTTP_AUTHORIZATION", "").lower().startswith("bearer "):
        return _runner_run(request, pk), Door.RUNNER, "runner"
    run = Run.objects.filter(pk=pk).first()
    if run is None:
        raise NotFound()
    if not request.user.has_perm(run_perms.IMPORT_METRICS, run):
        raise PermissionDenied(f"You need the permission '{run_perms.IMPORT_METRICS}'.")
    return run, Door.API, ""


class RunTrackerImportsView(APIView):
    """The imports of a run, newest first, with their progress: public, like the run."""

    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request: Request, pk: int) -> Response:
        if not Run.objects.filter(pk=pk).exists():
            raise NotFound("No such run.")
        uploads = selectors.run_tracker_imports(run_id=pk)[:20]
        return Response({"imports": [TrackerImportSerializer.progress(u) for u in uploads]})


# --- chart series: public reads of the downsampled rollup ---------------------------------


def _series_keys(request: Request) -> list[str] | None:
    text = request.query_params.get("keys", "").strip()
    if not text:
        return None
    keys = list(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    bad = [k for k in keys if not metrics_parse.METRIC_KEY.match(k)]
    if bad:
        raise ValidationError({"keys": [f"not a metric key: {bad[0][:200]!r}"]})
    return keys


def _series_points(request: Request) -> int:
    text = request.query_params.get("points", str(charts.DEFAULT_POINTS))
    try:
        points = int(text)
    except ValueError:
        raise ValidationError({"points": ["must be an integer"]}) from None
    if not 2 <= points <= charts.MAX_POINTS:
        raise ValidationError({"points": [f"must be between 2 and {charts.MAX_POINTS}"]})
    return points


def _series_run_ids(request: Request) -> list[int]:
    parts = [p.strip() for p in request.query_params.get("ids", "").split(",") if p.strip()]
    if not parts:
        raise ValidationError({"ids": ["give run ids, e.g. ?ids=1,2,3"]})
    if not all(p.isdecimal() and 0 < int(p) < 2**63 for p in parts):
        raise ValidationError({"ids": ["run ids are positive integers, separated by commas"]})
    ids = list(dict.fromkeys(int(p) for p in parts))
    if len(ids) > charts.MAX_RUNS:
        raise ValidationError({"ids": [f"at most {charts.MAX_RUNS} runs; got {len(ids)}"]})
    return ids


SERIES_PARAMETERS = [
    OpenApiParameter("keys", str, description="comma-separated metric keys; all when absent"),
    OpenApiParameter(
        "points", int, description=f"at most this many points per series (2-{charts.MAX_POINTS})"
    ),
]


class SeriesView(APIView):
    """Public reads, no session: nothing here depends on who asks."""

    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []


class PlanSeriesView(SeriesView):
    """Chart data of every run of a plan: ``{plan, active, keys, runs, series}``."""

    @extend_schema(parameters=SERIES_PARAMETERS, responses=ChartDataSerializer)
    def get(self, request: Request, plan_id: int) -> HttpResponse:
        body = charts.plan_series(
            plan_id=plan_id, keys=_series_keys(request), points=_series_points(request)
        )
        if body is None:
            raise NotFound("No such plan.")
        return HttpResponse(body, content_type="application/json")


class RunsSeriesView(SeriesView):
    """Chart data of up to 100 runs from any plans (``?ids=1,2,3``), for the compare page."""

    @extend_schema(
        operation_id="v1_runs_series_compare",
        parameters=[OpenApiParameter("ids", str, required=True), *SERIES_PARAMETERS],
        responses=ChartDataSerializer,
    )
    def get(self, request: Request) -> HttpResponse:
        body = charts.runs_series(
            run_ids=_series_run_ids(request),
            keys=_series_keys(request),
            points=_series_points(request),
        )
        return HttpResponse(body, content_type="application/json")
