"""API doors for recipes, plan previews and runs (public reads, maintainers' actions).

The runner's doors are ``runs.runner_api``, tracker imports ``runs.trackers.api``, chart
series ``runs.series.api``, the agents' door ``runs.pools.api``, MLflow's ``runs.mlflow``.
"""

from __future__ import annotations

from typing import Any

from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, PolymorphicProxySerializer, extend_schema
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import (
    PermissionDenied,
    ValidationError,
)
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from marin_site.api import HasNamedPermission
from marin_site.doors import Door
from runs import permissions as run_perms
from runs import selectors
from runs.api_shapes import (
    RunLogsSerializer,
    RunSeriesKeysSerializer,
    RunSeriesSerializer,
)
from runs.executors import get_executor
from runs.metrics import points as metric_points
from runs.models import Run
from runs.serializers import (
    PlanPreviewRequestSerializer,
    PlanSerializer,
    RecipeSerializer,
    RunDetailSerializer,
    RunSerializer,
    plan_data,
)
from runs.series import charts
from runs.services import claims
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


# --- runs: public reads and maintainer actions ---------------------------------------------


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
