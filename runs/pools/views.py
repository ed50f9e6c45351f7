"""Web doors for pools: public pages, a form for maintainers, tokens and revocation for the
pool's owner; and the agent program and run client served as single files."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Count, Prefetch, Q
from django.http import FileResponse, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST
from marin_client import standalone_file

from marin_site.errors import DomainError
from marin_site.input import PolicyForm
from runs import permissions as run_perms
from runs.models import Run, RunState
from runs.pools import services
from runs.pools.models import Agent, Lease, Pool, RegistrationToken

# The files of the client distribution a machine can fetch alone (standard library only).
SERVED_FILES = {
    "marin-site-agent.py": standalone_file("agent"),
    "marin_run_client.py": standalone_file("client"),
}


def served_file(request: HttpRequest, name: str) -> FileResponse:
    """The agent program and the run client, one standard-library file each."""
    path = SERVED_FILES[name]
    response = FileResponse(path.open("rb"), content_type="text/x-python; charset=utf-8")
    response["Content-Disposition"] = f'inline; filename="{name}"'
    response["Cache-Control"] = "public, max-age=300"
    return response


class PoolForm(PolicyForm):
    name = forms.SlugField(max_length=32, help_text="Runs reach it as executor pool:<name>.")
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False)
    labels = forms.CharField(required=False, help_text="Comma-separated, e.g. gpu:a5000,cuda:12")
    recipes = forms.CharField(
        required=False, help_text="Comma-separated recipe names it may run; empty: any recipe."
    )
    max_concurrent_runs = forms.IntegerField(min_value=1, max_value=10_000, initial=4)
    author_dry_runs = forms.BooleanField(
        required=False,
        label="Authors may start dry runs",
        help_text="The author of a submitted proposal whose recipe runs on this pool may start "
        "its dry run; otherwise only a maintainer may.",
    )
    owner = forms.CharField(required=False, help_text="Username of the owner; empty: you.")


def pool_list(request: HttpRequest) -> HttpResponse:
    pools = Pool.objects.select_related("owner").annotate(
        agent_count=Count("agents", filter=Q(agents__revoked_at__isnull=True), distinct=True),
    )
    executors = [pool.executor for pool in pools]
    counts: dict[tuple[str, str], int] = {}
    for executor, state, n in (
        Run.objects.filter(executor__in=executors, state__in=[RunState.QUEUED, RunState.RUNNING])
        .values_list("executor", "state")
        .annotate(n=Count("pk"))
    ):
        counts[(executor, state)] = n
    rows = [
        {
            "pool": pool,
            "queued": counts.get((pool.executor, RunState.QUEUED), 0),
            "running": counts.get((pool.executor, RunState.RUNNING), 0),
        }
        for pool in pools
    ]
    return render(
        request,
        "runs/pool_list.html",
        {"rows": rows, "can_create": request.user.has_perm(run_perms.CREATE_POOL)},
    )


def _pool_page(
    request: HttpRequest, pool: Pool, *, new_token: str = "", status: int = 200
) -> HttpResponse:
    can_manage = request.user.has_perm(run_perms.MANAGE_POOL, pool)
    agents = pool.agents.order_by("revoked_at", "-last_contact_at", "pk").prefetch_related(
        Prefetch(
            "leases", queryset=Lease.objects.filter(ended_at__isnull=True), to_attr="open_leases"
        )
    )
    runs = (
        Run.objects.filter(executor=pool.executor)
        .exclude(state__in=[RunState.FINISHED, RunState.FAILED, RunState.KILLED, RunState.CRASHED])
        .order_by("pk")[:100]
    )
    context: dict[str, Any] = {
        "pool": pool,
        "agents": agents,
        "runs": runs,
        "can_manage": can_manage,
        "can_retire": request.user.has_perm(run_perms.CREATE_POOL),
        "tokens": pool.registration_tokens.order_by("-created_at")[:50] if can_manage else [],
        "new_token": new_token,
        "site_url": settings.SITE_URL,
    }
    return render(request, "runs/pool_detail.html", context, status=status)


def pool_detail(request: HttpRequest, name: str) -> HttpResponse:
    return _pool_page(request, get_object_or_404(Pool.objects.select_related("owner"), name=name))


@login_required
def pool_create(request: HttpRequest) -> HttpResponse:
    from django.contrib.auth.models import User

    if not request.user.has_perm(run_perms.CREATE_POOL):
        raise PermissionDenied("Only maintainers create pools.")
    form = PoolForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = dict(form.cleaned_data)
        owner = None
        if username := data.pop("owner", ""):
            owner = User.objects.filter(username=username).first()
            if owner is None:
                form.add_error("owner", f"No user is named '{username}'.")
        if not form.errors:
            try:
                pool = services.pool_create(actor=request.user, data=data, owner=owner)
            except ValidationError as exc:
                for field, errors in exc.message_dict.items():
                    form.add_error(field if field in form.fields else None, errors)
            else:
                messages.success(request, f"Pool {pool.name} created.")
                return redirect(pool)
    status = 400 if form.is_bound and form.errors else 200
    return render(request, "runs/pool_form.html", {"form": form}, status=status)


@login_required
@require_POST
def pool_token_create(request: HttpRequest, name: str) -> HttpResponse:
    """A registration token, shown once on the page this answers (never stored in plain)."""
    pool = get_object_or_404(Pool, name=name)
    try:
        days = int(request.POST.get("days") or settings.RUNS_REGISTRATION_TOKEN_DAYS)
    except ValueError:
        days = 0
    try:
        _token, plain = services.registration_token_create(
            actor=request.user, pool_id=pool.pk, note=request.POST.get("note", ""), days=days
        )
    except ValidationError as exc:
        messages.error(
            request, "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())
        )
        return _pool_page(request, pool, status=400)  # refused: the page says why, no token
    except DomainError as exc:
        raise PermissionDenied(exc.message) from exc
    return _pool_page(request, pool, new_token=plain, status=201)


@login_required
@require_POST
def pool_token_revoke(request: HttpRequest, name: str, token_id: int) -> HttpResponse:
    token = get_object_or_404(
        RegistrationToken.objects.select_related("pool"), pk=token_id, pool__name=name
    )
    try:
        services.registration_token_revoke(actor=request.user, token_id=token.pk)
    except DomainError as exc:
        raise PermissionDenied(exc.message) from exc
    messages.success(request, f"Registration token {token.prefix}… revoked.")
    return redirect(token.pool)


@login_required
@require_POST
def agent_revoke(request: HttpRequest, name: str, agent_id: int) -> HttpResponse:
    agent = get_object_or_404(Agent.objects.select_related("pool"), pk=agent_id, pool__name=name)
    try:
        services.agent_revoke(actor=request.user, agent_id=agent.pk)
    except DomainError as exc:
        raise PermissionDenied(exc.message) from exc
    messages.success(request, f"{agent.label} revoked; the run it held went back to the queue.")
    return redirect(agent.pool)


@login_required
@require_POST
def pool_retire(request: HttpRequest, name: str) -> HttpResponse:
    pool = get_object_or_404(Pool, name=name)
    try:
        services.pool_retire(actor=request.user, pool_id=pool.pk)
    except DomainError as exc:
        raise PermissionDenied(exc.message) from exc
    messages.success(request, f"Pool {pool.name} retired.")
    return redirect(pool)
