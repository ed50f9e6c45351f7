"""The agents' door (``/api/v1/agent/...``) and the pools' API (``/api/v1/pools/...``).

An agent authenticates with ``Authorization: Bearer <credential>`` (registering, with the
pool's registration token instead): no session, no CSRF. Refusals: 401 for an unknown,
expired or revoked token or credential (and a retired pool), 403 for another agent's lease,
409 for a lease that is over, 413 for an oversized log tail, 400 naming the field.
"""

from __future__ import annotations

from typing import Any

from django.http import FileResponse, HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from marin_site import api_input as policy
from runs import permissions as run_perms
from runs.pools import leases, services, wakeup
from runs.pools.models import Agent, Pool

MAX_WAIT_SECONDS = 60


def _bearer(request: Request) -> str:
    scheme, _, token = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _body(request: Request) -> dict[str, Any]:
    data = request.data
    if not isinstance(data, dict):
        raise ValidationError({"non_field_errors": ["send a JSON object"]})
    return data


class AgentDoor(APIView):
    """Base of the agent's doors: its own bearer credential, no session, no CSRF."""

    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []

    def get_authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="agent"'

    def dispatch(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        with wakeup.database_slot():  # a held poll gives its slot up while it waits
            return super().dispatch(request, *args, **kwargs)

    def handle_exception(self, exc: Exception) -> Response:
        response = super().handle_exception(exc)
        if response.status_code == 401:  # services.AgentUnauthorized, a domain error
            response["WWW-Authenticate"] = self.get_authenticate_header(self.request)
        return response

    def agent(self, request: Request) -> Agent:
        return services.agent_authenticate(credential=_bearer(request))


class AgentRegisterView(AgentDoor):
    """``POST {"name", "labels", "version"}`` with the registration token as the bearer:
    answers the agent's credential, once."""

    @extend_schema(request=OpenApiTypes.OBJECT, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request) -> Response:
        data = _body(request)
        agent, credential = services.agent_register(
            token=_bearer(request),
            name=data.get("name"),
            labels=data.get("labels"),
            version=data.get("version", ""),
        )
        return Response(
            {
                "agent": {"id": agent.pk, "name": agent.name, "pool": agent.pool.name},
                "credential": credential,
            },
            status=201,
        )


class AgentPollView(AgentDoor):
    """``POST {"wait": seconds}``: a lease on a run (200) or, after waiting, nothing (204)."""

    @extend_schema(request=OpenApiTypes.OBJECT, responses={200: OpenApiTypes.OBJECT, 204: None})
    def post(self, request: Request) -> Response | HttpResponse:
        agent = self.agent(request)
        wait = _body(request).get("wait", 0)
        if type(wait) not in (int, float) or not 0 <= wait <= MAX_WAIT_SECONDS:
            raise ValidationError(
                {"wait": [f"must be a number of seconds from 0 to {MAX_WAIT_SECONDS}"]}
            )
        lease = leases.lease_wait(agent=agent, wait_seconds=float(wait))
        if lease is None:
            return Response(status=204)
        # The JSON of ``leases.lease_offer``, built when the lease was granted: a poll woken
        # with its lease writes it, touching no database.
        return HttpResponse(leases.lease_answer(lease=lease), content_type="application/json")


class AgentLeaseRenewView(AgentDoor):
    """``POST {"log_tail"?}``: the lease runs on; the answer says whether to stop the job."""

    @extend_schema(request=OpenApiTypes.OBJECT, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request, lease_id: int) -> Response:
        agent = self.agent(request)
        data = _body(request)
        unknown = sorted(set(data) - {"log_tail"})
        if unknown:
            raise ValidationError({unknown[0][:64]: ["unknown field"]})
        return Response(
            leases.lease_renew(agent=agent, lease_id=lease_id, log_tail=data.get("log_tail"))
        )


class AgentLeaseCodeView(AgentDoor):
    """``GET``: the gzipped tar of the leased run's pinned commit (``git archive``), for
    the agent holding the lease, which runs the job from it."""

    @extend_schema(responses={(200, "application/gzip"): OpenApiTypes.BINARY})
    def get(self, request: Request, lease_id: int) -> Any:
        agent = self.agent(request)
        path = leases.lease_code(agent=agent, lease_id=lease_id)
        return FileResponse(
            path.open("rb"), content_type="application/gzip", filename=path.name, as_attachment=True
        )


class AgentLeaseReportView(AgentDoor):
    """``POST {"outcome", "exit_code", "signal", "oom_kills", "cgroup", "message",
    "log_tail"}``: how the job ended; the lease ends and the run is settled from it."""

    @extend_schema(request=OpenApiTypes.OBJECT, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request, lease_id: int) -> Response:
        agent = self.agent(request)
        report = leases.lease_report_parse(data=request.data)
        run = leases.lease_report(agent=agent, lease_id=lease_id, report=report)
        return Response({"run": run.pk, "state": run.state, "attempt": run.attempt})


# --- pools: public to read; maintainers create and retire, owners make tokens ---------------


class AgentSerializer(policy.ModelSerializer[Agent]):
    current_run = serializers.SerializerMethodField()

    class Meta:
        model = Agent
        fields = [
            "id",
            "name",
            "labels",
            "version",
            "registered_at",
            "last_contact_at",
            "revoked_at",
            "current_run",
        ]
        read_only_fields = fields

    def get_current_run(self, agent: Agent) -> int | None:
        open_runs = getattr(agent, "open_runs", None)
        if open_runs is not None:
            return open_runs[0] if open_runs else None
        lease = agent.leases.filter(ended_at__isnull=True).first()
        return lease.run_id if lease else None


class PoolSerializer(policy.ModelSerializer[Pool]):
    owner = serializers.CharField(source="owner.username", read_only=True)
    executor = serializers.CharField(read_only=True)

    class Meta:
        model = Pool
        fields = [
            "id",
            "name",
            "executor",
            "description",
            "labels",
            "recipes",
            "max_concurrent_runs",
            "author_dry_runs",
            "owner",
            "created_at",
            "retired_at",
        ]
        read_only_fields = ["id", "executor", "owner", "created_at", "retired_at"]


class PoolWriteSerializer(policy.Serializer[Any]):
    name = serializers.CharField(max_length=64)
    description = serializers.CharField(required=False, allow_blank=True, max_length=2_000)
    labels = serializers.ListField(child=serializers.CharField(max_length=64), required=False)
    recipes = serializers.ListField(child=serializers.CharField(max_length=63), required=False)
    max_concurrent_runs = serializers.IntegerField(required=False, default=4)
    author_dry_runs = serializers.BooleanField(
        required=False,
        default=False,
        help_text="the author of a proposal whose recipe runs here may start its dry run",
    )
    owner = serializers.CharField(required=False, help_text="username; default: you")


class PoolViewSet(viewsets.ReadOnlyModelViewSet[Pool]):
    """Pools and their agents, public to read."""

    serializer_class = PoolSerializer
    lookup_field = "name"
    lookup_value_regex = "[a-z0-9-]+"

    def get_queryset(self) -> Any:
        return Pool.objects.select_related("owner").order_by("name")

    @extend_schema(request=PoolWriteSerializer, responses=PoolSerializer)
    def create(self, request: Request) -> Response:
        from django.contrib.auth.models import User

        body = PoolWriteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = dict(body.validated_data)
        owner = None
        if username := data.pop("owner", ""):
            owner = User.objects.filter(username=username).first()
            if owner is None:
                raise ValidationError({"owner": [f"no user named '{username[:150]}'"]})
        pool = services.pool_create(actor=request.user, data=data, owner=owner)
        return Response(PoolSerializer(pool).data, status=201)

    @extend_schema(responses=AgentSerializer(many=True))
    @action(detail=True, methods=["get"])
    def agents(self, request: Request, name: str) -> Response:
        pool = self.get_object()
        return Response(AgentSerializer(pool.agents.order_by("pk"), many=True).data)

    @extend_schema(request=OpenApiTypes.OBJECT, responses=OpenApiTypes.OBJECT)
    @action(detail=True, methods=["post"])
    def tokens(self, request: Request, name: str) -> Response:
        """A registration token for this pool (its owner or a maintainer); shown once."""
        pool = self.get_object()
        data = request.data if isinstance(request.data, dict) else {}
        token, plain = services.registration_token_create(
            actor=request.user, pool_id=pool.pk, note=data.get("note", ""), days=data.get("days")
        )
        return Response(
            {
                "id": token.pk,
                "token": plain,
                "expires_at": token.expires_at.isoformat(),
                "note": token.note,
            },
            status=201,
        )

    @extend_schema(request=None, responses=PoolSerializer)
    @action(detail=True, methods=["post"])
    def retire(self, request: Request, name: str) -> Response:
        pool = services.pool_retire(actor=request.user, pool_id=self.get_object().pk)
        return Response(PoolSerializer(pool).data)


class AgentRevokeView(APIView):
    """``POST /api/v1/agents/{id}/revoke/``: the pool's owner or a maintainer."""

    @extend_schema(request=None, responses=AgentSerializer)
    def post(self, request: Request, agent_id: int) -> Response:
        agent = Agent.objects.select_related("pool").filter(pk=agent_id).first()
        if agent is None:
            raise NotFound("No such agent.")
        if not request.user.has_perm(run_perms.MANAGE_POOL, agent.pool):
            raise PermissionDenied(f"You need the permission '{run_perms.MANAGE_POOL}'.")
        agent = services.agent_revoke(actor=request.user, agent_id=agent.pk)
        return Response(AgentSerializer(agent).data)
