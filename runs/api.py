"""API doors for recipes and plan previews."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, viewsets
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from marin_site.api import HasNamedPermission
from proposals import permissions as perms
from runs import selectors, services
from runs.serializers import (
    PlanPreviewRequestSerializer,
    PlanSerializer,
    RecipeSerializer,
    plan_data,
)


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
    permission_name = perms.MANAGE_RECIPES
    filterset_fields = ["name", "is_active"]

    def get_queryset(self) -> Any:
        return selectors.recipe_list(include_inactive=True).order_by("name", "-created_at")

    def perform_create(self, serializer: Any) -> None:
        serializer.instance = services.recipe_create(
            actor=self.request.user, data=dict(serializer.validated_data)
        )

    def perform_update(self, serializer: Any) -> None:
        assert serializer.instance is not None
        serializer.instance = services.recipe_update(
            recipe=serializer.instance, data=dict(serializer.validated_data)
        )


class PlanPreviewView(APIView):
    """The plan a recipe, baseline and ablation spec would launch; nothing is stored."""

    permission_classes: list[Any] = []

    @extend_schema(request=PlanPreviewRequestSerializer, responses=PlanSerializer)
    def post(self, request: Request) -> Response:
        serializer = PlanPreviewRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        preview = services.plan_build(
            recipe=data["recipe"],
            baseline=data.get("baseline") or {},
            spec_text=data.get("ablation_spec") or "",
            budget_accelerator_hours=data.get("budget_accelerator_hours"),
        )
        return Response(PlanSerializer(plan_data(preview)).data)
