"""API doors of campaigns: public reads; maintainers declare campaigns, attach runs and
record interventions. Each write calls one service, which checks the permission again."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from marin_site import api_input as policy
from marin_site.api import HasNamedPermission
from runs.campaigns import selectors, services
from runs.campaigns.models import Campaign, CampaignRun, Intervention, InterventionKind, Phase
from runs.campaigns.permissions import MANAGE_CAMPAIGNS, RECORD_INTERVENTION
from runs.models import Plan, Run
from runs.series import charts as series


class LinkSerializer(policy.Serializer):
    label = serializers.CharField(  # type: ignore[assignment]  # a field named "label"
        max_length=200, required=False, allow_blank=True
    )
    url = serializers.CharField(max_length=1000)


class CampaignRunSerializer(policy.ModelSerializer):
    run = serializers.PrimaryKeyRelatedField(queryset=Run.objects.all())
    phase = serializers.ChoiceField(choices=Phase.choices, default=Phase.PRETRAINING)
    order = serializers.IntegerField(min_value=0, required=False)
    data_mix = serializers.DictField(
        child=serializers.FloatField(min_value=0), required=False, default=dict
    )
    state = serializers.CharField(source="run.state", read_only=True)

    class Meta:
        model = CampaignRun
        fields = ["run", "phase", "order", "data_mix", "state"]
        validators: list[Any] = []  # order and run are checked by the service


class InterventionSerializer(policy.ModelSerializer):
    kind = serializers.ChoiceField(choices=InterventionKind.choices)
    step = serializers.IntegerField(min_value=0, max_value=2**62)
    window_steps = serializers.IntegerField(min_value=10, max_value=1_000_000, default=2000)
    keys = serializers.ListField(
        child=serializers.CharField(max_length=200), max_length=20, required=False, default=list
    )
    links = LinkSerializer(many=True, required=False, default=list)
    happened_at = serializers.DateTimeField(required=False)

    class Meta:
        model = Intervention
        fields = [
            "id",
            "step",
            "happened_at",
            "kind",
            "title",
            "from_value",
            "to_value",
            "keys",
            "window_steps",
            "note",
            "links",
            "created_at",
        ]
        read_only_fields = ["id", "created_at"]


class CampaignSerializer(policy.ModelSerializer):
    ladder_plan = serializers.PrimaryKeyRelatedField(
        queryset=Plan.objects.all(), required=False, allow_null=True
    )
    target_tokens = serializers.FloatField(min_value=1)
    target_flops = serializers.FloatField(min_value=1)
    telemetry_keys = serializers.ListField(
        child=serializers.CharField(max_length=200), max_length=20, required=False, default=list
    )
    recipe_config = serializers.DictField(required=False, default=dict)
    links = LinkSerializer(many=True, required=False, default=list)
    runs = CampaignRunSerializer(source="members", many=True, read_only=True)
    url = serializers.CharField(source="get_absolute_url", read_only=True)

    class Meta:
        model = Campaign
        # What a maintainer writes (one list, with the services), then what is read back.
        fields = [*services.CAMPAIGN_FIELDS, "runs", "url", "created_at", "updated_at"]
        read_only_fields = ["created_at", "updated_at"]


class CampaignChartSerializer(policy.Serializer):
    """The chart data (documentation only: the view writes it directly)."""

    campaign = serializers.CharField()
    active = serializers.BooleanField(help_text="False once every attempt ended and caught up.")
    x = serializers.ChoiceField(choices=["tokens", "step"], help_text="The charts' x axis.")
    keys = serializers.ListField(child=serializers.CharField())
    mixture = serializers.ListField(
        child=serializers.CharField(), help_text="mixture/weight/<source> keys, stacked."
    )
    series = serializers.DictField(
        child=serializers.DictField(child=serializers.ListField(child=serializers.FloatField())),
        help_text="key -> {step, tokens, value, min, max}: stitched across the attempts.",
    )
    interventions = serializers.ListField(child=serializers.DictField())
    restarts = serializers.ListField(child=serializers.DictField())
    progress = serializers.DictField()
    flops_per_token = serializers.FloatField(allow_null=True)


def _points(request: Request) -> int:
    text = request.query_params.get("points", str(series.DEFAULT_POINTS))
    try:
        points = int(text)
    except ValueError:
        raise ValidationError({"points": ["must be an integer"]}) from None
    if not 2 <= points <= series.MAX_POINTS:
        raise ValidationError({"points": [f"must be between 2 and {series.MAX_POINTS}"]})
    return points


class CampaignViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    viewsets.GenericViewSet,
):
    """Campaigns: public to read; maintainers declare and edit them."""

    serializer_class = CampaignSerializer
    permission_classes = [HasNamedPermission]
    permission_name = MANAGE_CAMPAIGNS
    lookup_field = "slug"
    filterset_fields = ["is_active"]

    def get_queryset(self) -> Any:
        if self.action in {"chart", "attach_run", "interventions"}:
            return selectors.campaign_list()
        return selectors.campaign_list().prefetch_related("members__run")

    def get_permissions(self) -> Any:
        if self.action == "interventions" and self.request.method == "POST":
            self.permission_name = RECORD_INTERVENTION
        return super().get_permissions()

    def perform_create(self, serializer: Any) -> None:
        serializer.instance = services.campaign_create(
            actor=self.request.user, data=dict(serializer.validated_data)
        )

    def perform_update(self, serializer: Any) -> None:
        serializer.instance = services.campaign_update(
            campaign=serializer.instance,
            actor=self.request.user,
            data=dict(serializer.validated_data),
        )

    @extend_schema(
        parameters=[OpenApiParameter("points", int, description="at most this many per key")],
        responses=CampaignChartSerializer,
    )
    @action(detail=True, methods=["get"], url_path="series", permission_classes=[])
    def chart(self, request: Request, slug: str) -> HttpResponse:
        """The stitched chart data of the campaign page (polled while it is live)."""
        campaign = self.get_object()
        body = selectors.campaign_chart_data(campaign=campaign, points=_points(request))
        return HttpResponse(body, content_type="application/json")

    @extend_schema(request=CampaignRunSerializer, responses=CampaignRunSerializer)
    @action(detail=True, methods=["post"], url_path="runs")
    def attach_run(self, request: Request, slug: str) -> Response:
        """Attach a run as the campaign's next attempt (a restart or a new phase)."""
        campaign = self.get_object()
        serializer = CampaignRunSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        member = services.campaign_run_add(
            campaign=campaign,
            run=data["run"],
            actor=request.user,
            phase=data["phase"],
            order=data.get("order"),
            data_mix=data.get("data_mix"),
        )
        return Response(CampaignRunSerializer(member).data, status=status.HTTP_201_CREATED)

    @extend_schema(methods=["GET"], request=None, responses=InterventionSerializer(many=True))
    @extend_schema(
        methods=["POST"], request=InterventionSerializer, responses=InterventionSerializer
    )
    @action(detail=True, methods=["get", "post"])
    def interventions(self, request: Request, slug: str) -> Response:
        """The campaign's interventions; maintainers record one (a dated, stepped change)."""
        campaign = self.get_object()
        if request.method == "GET":
            found = campaign.interventions.order_by("step", "pk")
            return Response(InterventionSerializer(found, many=True).data)
        serializer = InterventionSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        intervention = services.intervention_record(
            campaign=campaign, actor=request.user, **serializer.validated_data
        )
        return Response(InterventionSerializer(intervention).data, status=status.HTTP_201_CREATED)
