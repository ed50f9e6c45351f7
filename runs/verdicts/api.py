"""The verdict door: ``POST /api/v1/verdicts/check/`` recomputes a verdict from figures (to
check a claim made in an issue comment), as ``manage.py verdict_check`` does; ``GET
/api/v1/verdicts/rules/`` lists the rules with their parameters. Nothing is stored.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from marin_site.untrusted import untrusted_problem
from runs.verdicts.base import Refusal
from runs.verdicts.rules import rules_catalogue, verdict_compute


class VerdictCheckView(APIView):
    """A verdict recomputed from the figures in the body; a refusal names the field and rule."""

    permission_classes: list[Any] = []
    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "verdict-check"

    @extend_schema(request=OpenApiTypes.OBJECT, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request) -> Response:
        problem = untrusted_problem(request.data)
        if problem:
            return Response({"detail": problem, "field": "", "rule": ""}, status=400)
        try:
            verdict = verdict_compute(request.data)
        except Refusal as refusal:
            return Response(refusal.as_dict(), status=400)
        body = dict(verdict.result)
        if request.query_params.get("explain") == "1":
            body["verdict"] = verdict.as_dict()
        return Response(body)


class VerdictRulesView(APIView):
    """Every rule: its kind, version, parameters (default and range) and inputs."""

    permission_classes: list[Any] = []

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request: Request) -> Response:
        return Response({"rules": rules_catalogue()})
