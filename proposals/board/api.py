"""``GET /api/v1/board/?track=<slug>``: a track's ranked entries with their provenance,
paginated as the other lists (``?page=``); an unknown track is 404 in words."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import NotFound
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from proposals.board.views import entry_rows
from runs.board.read import Entry, track_entries, tracks_active


class BoardView(APIView):
    permission_classes: list[Any] = []

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request: Request) -> Response:
        tracks = tracks_active()
        slug = request.query_params.get("track") or (tracks[0].slug if tracks else "")
        track = next((t for t in tracks if t.slug == slug), None)
        if track is None:
            raise NotFound(f"track: no track named {slug[:63]!r}")
        paginator = PageNumberPagination()
        page: list[Entry] | None = paginator.paginate_queryset(
            track_entries(track),  # type: ignore[arg-type]
            request,
            view=self,
        )
        response = paginator.get_paginated_response(entry_rows(list(page or [])))
        response.data["track"] = {
            "slug": track.slug,
            "title": track.title,
            "metric": track.metric,
            "rule": track.rule,
            "parameters": track.parameters,
        }
        return response
