"""The board's API:

- ``GET /api/v1/board/tracks/``: the active tracks (slug, title, recipe, metric, rule and its
  parameters, entry count);
- ``GET /api/v1/board/?track=<slug>&page=<n>``: a track's ranked entries with their
  provenance and links, paginated as the other lists (50 a page); the first track when none
  is named. An unknown track is 404, a page that is not a page 404 ("Invalid page."), in
  words.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Count
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from marin_site.fragments import Fragments
from proposals.board.views import PAGE_ENTRIES, entry_rows
from runs.board.models import BoardEntry, BoardTrack
from runs.board.read import BOARD_VERSION, TrackUnknown, entries, track_get, tracks_active


class BoardTrackSerializer(serializers.ModelSerializer[BoardTrack]):
    entries = serializers.SerializerMethodField()

    class Meta:
        model = BoardTrack
        fields = [
            "slug",
            "title",
            "description",
            "recipe_name",
            "metric",
            "rule",
            "parameters",
            "top_n",
            "ranked_at",
            "entries",
        ]

    def get_entries(self, obj: BoardTrack) -> int:
        return int(getattr(obj, "entry_count", 0))


class BoardProposalSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    title = serializers.CharField()
    url = serializers.CharField()
    issue = serializers.IntegerField(allow_null=True)
    issue_url = serializers.CharField()
    author = serializers.CharField()


class BoardEntrySerializer(serializers.Serializer[Any]):
    """One ranked entry, as ``proposals.board.views.entry_row`` builds it."""

    rank = serializers.IntegerField()
    run_id = serializers.IntegerField()
    run_url = serializers.CharField()
    plan_id = serializers.IntegerField()
    score = serializers.FloatField(help_text="What the rule ranks by.")
    value = serializers.FloatField(help_text="The final value of the track's metric.")
    flops = serializers.FloatField(allow_null=True)
    label = serializers.ChoiceField(choices=["verified", "unverified"])  # type: ignore[assignment]
    verified = serializers.BooleanField(
        help_text="The site launched the run itself at a pinned commit."
    )
    origin = serializers.CharField(help_text="launched, claimed or imported")
    ran_by = serializers.CharField()
    executor = serializers.CharField()
    pool = serializers.CharField()
    agent = serializers.CharField()
    git_sha = serializers.CharField()
    config_hash = serializers.CharField()
    recipe = serializers.CharField()
    run_name = serializers.CharField()
    description = serializers.CharField()
    finished_at = serializers.DateTimeField(allow_null=True)
    wandb_url = serializers.CharField()
    imported_from = serializers.CharField()
    model_size = serializers.FloatField(allow_null=True)
    training_time = serializers.FloatField(allow_null=True)
    training_hardware_flops = serializers.FloatField(allow_null=True)
    note = serializers.CharField()
    proposal = BoardProposalSerializer(allow_null=True)


class BoardPageSerializer(serializers.Serializer[Any]):
    count = serializers.IntegerField()
    next = serializers.CharField(allow_null=True)
    previous = serializers.CharField(allow_null=True)
    track = BoardTrackSerializer()
    results = BoardEntrySerializer(many=True)


class BoardPagination(PageNumberPagination):
    page_size = PAGE_ENTRIES


class BoardTracksView(APIView):
    permission_classes: list[Any] = []

    @extend_schema(responses=BoardTrackSerializer(many=True), summary="The board's tracks")
    def get(self, request: Request) -> Response:
        tracks = tracks_active()
        counts = dict(
            BoardEntry.objects.filter(track__in=tracks)
            .values("track")
            .annotate(n=Count("pk"))
            .values_list("track", "n")
        )
        for track in tracks:
            track.entry_count = counts.get(track.pk, 0)  # type: ignore[attr-defined]
        return Response(BoardTrackSerializer(tracks, many=True).data)


class BoardView(APIView):
    permission_classes: list[Any] = []

    @extend_schema(
        parameters=[
            OpenApiParameter("track", str, description="A track's slug; the first track if none"),
            OpenApiParameter("page", int, description="A page of 50 entries, from 1"),
        ],
        responses=BoardPageSerializer,
        summary="A track's ranked entries, with their provenance",
    )
    def get(self, request: Request) -> Response:
        try:
            track = track_get(request.query_params.get("track"), tracks_active())
        except TrackUnknown as problem:
            raise NotFound(str(problem)) from problem
        if track is None:
            raise NotFound("track: there are no tracks yet")
        # The page's data is one fragment for every reader (by track, page and host: the
        # pager's links are absolute), versioned by the track's ranking.
        name = (
            f"board-api:{track.pk}:{request.query_params.get('page', '')[:12]}:{request.get_host()}"
        )
        fragments = Fragments({name: [(BOARD_VERSION, track.pk)]})
        data = fragments.get(name)
        if data is None:
            paginator = BoardPagination()
            page = paginator.paginate_queryset(entries(track), request, view=self)
            data = paginator.get_paginated_response(entry_rows(list(page or []))).data
            track.entry_count = paginator.page.paginator.count  # type: ignore[attr-defined,union-attr]
            data["track"] = BoardTrackSerializer(track).data
            fragments.put(name, data)
            fragments.save()
        return Response(data)
