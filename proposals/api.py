"""API doors for proposals, reviews and comments: validate, call the service, render."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from marin_site.api import HasNamedPermission
from proposals import permissions as perms
from proposals import selectors, services
from proposals.filters import ProposalFilter
from proposals.models import Comment, Door, Review
from proposals.serializers import (
    CommentSerializer,
    EventSerializer,
    OutcomeSerializer,
    ProposalSerializer,
    ReviewSerializer,
    TransitionSerializer,
)
from runs.serializers import PlanSerializer, plan_data


class ProposalViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    viewsets.GenericViewSet,
):
    """Proposals: public to read; contributors create and edit their own.

    Each state change is its own action endpoint (``submit``, ``approve``, ...) calling the
    same service as the web page. A wrong role answers 403; a wrong state 409, naming the
    states the action may start from.
    """

    serializer_class = ProposalSerializer
    permission_classes = [HasNamedPermission]
    permission_name = perms.ADD
    filterset_class = ProposalFilter

    def get_queryset(self) -> Any:
        return selectors.proposal_list()

    def perform_create(self, serializer: Any) -> None:
        data = dict(serializer.validated_data)
        labels = data.pop("labels", [])
        serializer.instance = services.proposal_create(
            author=self.request.user, data=data, labels=labels, door=Door.API
        )

    def perform_update(self, serializer: Any) -> None:
        assert serializer.instance is not None
        data = dict(serializer.validated_data)
        labels = data.pop("labels", None)
        services.proposal_update(
            proposal_id=serializer.instance.pk,
            actor=self.request.user,
            data=data,
            labels=labels,
            door=Door.API,
        )
        serializer.instance = self.get_queryset().get(pk=serializer.instance.pk)

    def _transition(self, request: Request, pk: str | None, name: str) -> Response:
        body = TransitionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        proposal = self.get_object()
        services.proposal_transition(
            proposal_id=proposal.pk,
            action=name,
            actor=request.user,
            door=Door.API,
            reason=body.validated_data["reason"],
            git_ref=body.validated_data["git_ref"],
        )
        fresh = self.get_queryset().get(pk=proposal.pk)
        return Response(self.get_serializer(fresh).data)

    @extend_schema(request=TransitionSerializer, responses=ProposalSerializer)
    @action(detail=True, methods=["post"])
    def submit(self, request: Request, pk: str | None = None) -> Response:
        return self._transition(request, pk, "submit")

    @extend_schema(request=TransitionSerializer, responses=ProposalSerializer)
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str | None = None) -> Response:
        return self._transition(request, pk, "approve")

    @extend_schema(request=TransitionSerializer, responses=ProposalSerializer)
    @action(detail=True, methods=["post"])
    def reject(self, request: Request, pk: str | None = None) -> Response:
        return self._transition(request, pk, "reject")

    @extend_schema(request=TransitionSerializer, responses=ProposalSerializer)
    @action(detail=True, methods=["post"], url_path="request-changes")
    def request_changes(self, request: Request, pk: str | None = None) -> Response:
        return self._transition(request, pk, "request_changes")

    @extend_schema(request=TransitionSerializer, responses=ProposalSerializer)
    @action(detail=True, methods=["post"])
    def withdraw(self, request: Request, pk: str | None = None) -> Response:
        return self._transition(request, pk, "withdraw")

    @extend_schema(request=TransitionSerializer, responses=ProposalSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        return self._transition(request, pk, "cancel")

    @extend_schema(request=OutcomeSerializer, responses=ProposalSerializer)
    @action(detail=True, methods=["post"])
    def outcome(self, request: Request, pk: str | None = None) -> Response:
        body = OutcomeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        proposal = self.get_object()
        services.proposal_record_outcome(
            proposal_id=proposal.pk, actor=request.user, door=Door.API, **body.validated_data
        )
        return Response(self.get_serializer(self.get_queryset().get(pk=proposal.pk)).data)

    @extend_schema(responses=PlanSerializer)
    @action(detail=True, methods=["get"])
    def plan(self, request: Request, pk: str | None = None) -> Response:
        """The frozen plan once approved; before that, the plan approval would launch."""
        proposal = self.get_object()
        if proposal.plan is not None:
            return Response(PlanSerializer(plan_data(proposal.plan)).data)
        preview = services.proposal_plan(proposal=proposal)
        return Response(PlanSerializer(plan_data(preview)).data)

    @extend_schema(responses=EventSerializer(many=True))
    @action(detail=True, methods=["get"])
    def timeline(self, request: Request, pk: str | None = None) -> Response:
        proposal = self.get_object()
        events = proposal.events.select_related("actor").order_by("created_at", "id")
        page = self.paginate_queryset(events)
        return self.get_paginated_response(EventSerializer(page, many=True).data)


class ReviewViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet,
):
    """Reviews: public to read; reviewers post one per proposal (posting again updates it)."""

    serializer_class = ReviewSerializer
    permission_classes = [HasNamedPermission]
    filterset_fields = ["proposal"]

    def get_queryset(self) -> Any:
        return Review.objects.select_related("reviewer").order_by("created_at", "id")

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        review = services.review_submit(
            proposal_id=data["proposal"].pk,
            reviewer=request.user,
            score=data["score"],
            recommendation=data["recommendation"],
            text=data["text"],
            door=Door.API,
        )
        return Response(self.get_serializer(review).data, status=status.HTTP_201_CREATED)


class CommentViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet,
):
    """Comments: public to read; any signed-in user comments."""

    serializer_class = CommentSerializer
    permission_classes = [HasNamedPermission]
    permission_name = perms.COMMENT
    filterset_fields = ["proposal"]

    def get_queryset(self) -> Any:
        return Comment.objects.select_related("author").order_by("created_at", "id")

    def perform_create(self, serializer: Any) -> None:
        data = serializer.validated_data
        serializer.instance = services.comment_create(
            proposal_id=data["proposal"].pk,
            author=self.request.user,
            body=data["body"],
            door=Door.API,
        )
