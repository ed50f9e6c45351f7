"""Doors of the GitHub sync: the webhook receiver and the maintainers' outbox page."""

from __future__ import annotations

import hashlib
import hmac

import orjson
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from marin_site.untrusted import text_problem
from proposals import permissions as perms
from proposals.github import client, selectors
from proposals.github.deliveries import delivery_store
from proposals.github.outbox import enqueue
from proposals.models import GitHubOutbox

WEBHOOK_BODY_CAP = 25 * 1024 * 1024  # GitHub's own cap on a payload


def signature_valid(*, secret: str, body: bytes, header: str) -> bool:
    if not secret or not header.startswith("sha256="):
        return False
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode(), header.encode())


@csrf_exempt
@require_POST
def webhook(request: HttpRequest) -> HttpResponse:
    """Verify, store, queue, answer: the work happens in a Celery task."""
    secret = settings.GITHUB_WEBHOOK_SECRET
    if not secret:
        return JsonResponse({"detail": "No webhook secret is configured."}, status=401)
    body = request.read(WEBHOOK_BODY_CAP + 1)  # .body would apply the site-wide cap
    if len(body) > WEBHOOK_BODY_CAP:
        return JsonResponse({"detail": "Payload over 25 MB."}, status=413)
    header = request.headers.get("X-Hub-Signature-256", "")
    if not signature_valid(secret=secret, body=body, header=header):
        return JsonResponse({"detail": "Missing or wrong X-Hub-Signature-256."}, status=401)
    delivery_id = request.headers.get("X-GitHub-Delivery", "")
    event = request.headers.get("X-GitHub-Event", "")
    if not delivery_id or not event:
        return JsonResponse(
            {"detail": "X-GitHub-Delivery and X-GitHub-Event are required."}, status=400
        )
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:  # also what is not UTF-8, or has lone surrogates
        return JsonResponse({"detail": "The body is not JSON in UTF-8."}, status=400)
    if not isinstance(payload, dict):
        return JsonResponse({"detail": "The body is not a JSON object."}, status=400)
    action = payload.get("action")
    problem = text_problem(action) if isinstance(action, str) else None
    if problem:  # the one value of the payload stored in a column of its own
        return JsonResponse({"detail": f"action: {problem}."}, status=400)
    created = delivery_store(
        delivery_id=delivery_id,
        event=event,
        action=action if isinstance(action, str) else "",
        body=body.decode(),
    )
    return JsonResponse({"delivery": delivery_id, "duplicate": not created}, status=202)


@login_required
def outbox_page(request: HttpRequest) -> HttpResponse:
    if not request.user.has_perm(perms.MANAGE_GITHUB_SYNC):
        raise PermissionDenied("Only maintainers see the GitHub outbox.")
    page = Paginator(selectors.outbox_attention(), 50).get_page(request.GET.get("page"))
    return render(
        request,
        "proposals/github_outbox.html",
        {"page": page, "sync_enabled": client.sync_enabled()},
    )


@require_POST
@login_required
def outbox_retry(request: HttpRequest, pk: int) -> HttpResponse:
    if not request.user.has_perm(perms.MANAGE_GITHUB_SYNC):
        raise PermissionDenied("Only maintainers retry GitHub writes.")
    get_object_or_404(GitHubOutbox, pk=pk)  # rows are never deleted, so it stays there
    row = enqueue.outbox_retry(row_id=pk)
    messages.success(request, f"GitHub write {row.pk} is queued again.")
    return redirect("github:outbox")
