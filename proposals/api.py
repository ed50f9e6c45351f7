"""API doors for proposals, reviews and comments: validate, call the service, render."""

from __future__ import annotations

import hashlib
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from marin_site.api import HasNamedPermission
from marin_site.doors import Door
from marin_site.fragments import Fragments
from marin_site.roles import role_names, roles_kept
from proposals import export as proposal_export
from proposals import permissions as perms
from proposals import query_language, selectors, services
from proposals import search as proposal_search
from proposals.actions import action_permission_require
from proposals.filters import ProposalFilter
from proposals.models import Comment, Review
from proposals.serializers import (
    CommentSerializer,
    OutcomeSerializer,
    ProposalSerializer,
    ReviewSerializer,
    TimelineEntrySerializer,
    TransitionSerializer,
    proposal_list_data,
)
from runs.models import DryRun
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

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """The filtered page's ids (and their count) from the fragment cache while no proposal
        changed, else the database (``selectors.CachedListing``); its rows mostly from the
        fragment cache (``proposal_list_data``), field for field what ``ProposalSerializer``
        writes."""
        digest = hashlib.sha256(request.GET.urlencode().encode()).hexdigest()
        name = f"api-list-page:{digest}"
        fragments = Fragments({name: [selectors.LIST_VERSION]}, shared=roles_kept(request.user))
        role_names(request.user, fragments)  # each row's actions ask them: one round trip
        listed = selectors.CachedListing(
            lambda: self.filter_queryset(selectors.proposal_ids()).values_list("pk", flat=True),
            fragments,
            name,
        )
        if fragments.get(name) is None:
            listed.count()  # bad filters answer 400 here, before anything is kept
        page: list[int] | None = self.paginate_queryset(listed)  # type: ignore[arg-type]
        listed.save()
        fragments.save()
        data = proposal_list_data(pks=list(listed[:] if page is None else page), request=request)
        return Response(data) if page is None else self.get_paginated_response(data)

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
        proposal = self.get_object()
        action_permission_require(proposal=proposal, actor=request.user, name=name)
        body = TransitionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        services.proposal_transition(
            proposal_id=proposal.pk,
            action=name,
            actor=request.user,
            door=Door.API,
            reason=body.validated_data["reason"],
            git_ref=body.validated_data["git_ref"],
            executor=body.validated_data["executor"],
            dry_run_override=body.validated_data["dry_run_override"],
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

    @extend_schema(request=TransitionSerializer, responses=ProposalSerializer)
    @action(detail=True, methods=["post"])
    def adopt(self, request: Request, pk: str | None = None) -> Response:
        """An imported old issue joins the site's lifecycle (a draft) and its GitHub sync."""
        return self._transition(request, pk, "adopt")

    @extend_schema(request=OutcomeSerializer, responses=ProposalSerializer)
    @action(detail=True, methods=["post"])
    def outcome(self, request: Request, pk: str | None = None) -> Response:
        proposal = self.get_object()
        action_permission_require(proposal=proposal, actor=request.user, name="record_outcome")
        body = OutcomeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
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

    @extend_schema(request=TransitionSerializer, responses=ProposalSerializer)
    @action(detail=True, methods=["post"])
    def hold(self, request: Request, pk: str | None = None) -> Response:
        return self._hold(request, hold=True)

    @extend_schema(request=TransitionSerializer, responses=ProposalSerializer)
    @action(detail=True, methods=["post"])
    def unhold(self, request: Request, pk: str | None = None) -> Response:
        return self._hold(request, hold=False)

    def _hold(self, request: Request, *, hold: bool) -> Response:
        proposal = self.get_object()
        name = "hold" if hold else "unhold"
        action_permission_require(proposal=proposal, actor=request.user, name=name)
        body = TransitionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        services.proposal_hold(
            proposal_id=proposal.pk,
            actor=request.user,
            hold=hold,
            door=Door.API,
            reason=body.validated_data["reason"],
        )
        return Response(self.get_serializer(self.get_queryset().get(pk=proposal.pk)).data)

    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    @action(detail=True, methods=["get", "post"], url_path="dry-runs")
    def dry_runs(self, request: Request, pk: str | None = None) -> Response:
        """``GET``: the proposal's dry runs, newest first, beside the site's estimate.
        ``POST``: start one (maintainers): the recipe script in its plan-only mode."""
        proposal = self.get_object()
        if request.method == "POST":
            services.proposal_dry_run(proposal_id=proposal.pk, actor=request.user, door=Door.API)
        rows = DryRun.objects.filter(subject=services.dry_run_subject(proposal)).order_by("-pk")
        return Response(
            {
                "dry_runs": [
                    {
                        "id": row.pk,
                        "state": row.state,
                        "command": row.command,
                        "figures": row.figures,
                        "estimate": row.estimate,
                        "reason": row.reason,
                        "output_tail": row.output[-4000:],
                        "created_at": row.created_at.isoformat(),
                        "finished_at": row.finished_at.isoformat() if row.finished_at else None,
                    }
                    for row in rows[:20]
                ]
            },
            status=201 if request.method == "POST" else 200,
        )

    @extend_schema(responses=TimelineEntrySerializer(many=True))
    @action(detail=True, methods=["get"])
    def timeline(self, request: Request, pk: str | None = None) -> Response:
        """The proposal's events and its runs' events (``run`` set), oldest first."""
        proposal = self.get_object()
        page = self.paginate_queryset(selectors.proposal_timeline(proposal=proposal))
        entries = selectors.timeline_entries(page or [])
        return self.get_paginated_response(TimelineEntrySerializer(entries, many=True).data)


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


class ProposalSearchView(generics.GenericAPIView):
    """Search proposals with the query language of /search/ (``q``; empty: every proposal).

    Rows carry the export columns (proposals/export.py), paginated; ``?format=csv`` streams
    every match as CSV instead. A query that cannot be read answers 400 with ``column``,
    ``expected`` and ``found``.
    """

    permission_classes = [HasNamedPermission]
    # No browsable HTML here: people search on /search/; asked for HTML, this answers 406.
    renderer_classes = [JSONRenderer, proposal_export.CSVRenderer]

    @extend_schema(
        parameters=[OpenApiParameter("q", str, description="A search query, e.g. label:moe")],
        responses={200: OpenApiTypes.OBJECT, 400: OpenApiTypes.OBJECT},
    )
    def get(self, request: Request) -> Any:
        text = request.query_params.get("q", "")
        try:
            query = query_language.parse_query(text)
        except query_language.QuerySyntaxError as exc:
            response = Response(exc.as_dict(), status=status.HTTP_400_BAD_REQUEST)
            if request.accepted_renderer.format == "csv":
                renderer = JSONRenderer()  # an error reads as JSON, whatever was asked
                request.accepted_renderer = renderer
                request.accepted_media_type = renderer.media_type
            return response
        result = proposal_search.proposal_search(query=query)
        if request.accepted_renderer.format == "csv":
            return proposal_export.export_response(request, result.proposals, fmt="csv", query=text)
        page = self.paginate_queryset(proposal_export.export_queryset(result.proposals))
        base_url = request.build_absolute_uri("/").rstrip("/")
        rows = list(proposal_export.export_rows(page or [], base_url=base_url))
        return self.get_paginated_response(rows)
