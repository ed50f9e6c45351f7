"""The doors of ``tracker_metrics.jsonl`` imports: a file posted into a run (its token, or a
maintainer), whole or streamed, and the imports' progress."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.authentication import SessionAuthentication, TokenAuthentication
from rest_framework.exceptions import (
    NotFound,
    PermissionDenied,
)
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from marin_site.doors import Door
from runs import permissions as run_perms
from runs import selectors
from runs.models import Run
from runs.runner_api import runner_run
from runs.serializers import (
    TrackerImportSerializer,
)
from runs.trackers import jsonl as tracker_import
from runs.trackers import uploads as tracker_uploads


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
        return runner_run(request, pk), Door.RUNNER, "runner"
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
