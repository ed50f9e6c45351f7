"""Webhook deliveries: stored as they came, then processed by a worker, oldest first.

The webhook door stores a delivery (``delivery_store``) and answers at once; the Celery task
calls ``deliveries_drain``, which settles what the payload alone settles (``_triage``) and
dispatches the rest to ``issues``, with the mapped site account as the actor, so the same
rules and permissions apply as on the site. The task is defined here, beside the drain
and the nudge that sends it.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from datetime import timedelta
from itertools import islice
from typing import Any

import orjson
from celery import shared_task
from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from marin_site.db import exclusive_for_transaction, row_insert_unless_present
from marin_site.errors import DomainError
from proposals.github.accounts import github_login
from proposals.github.backfill import imported_comment_apply, imported_issue_apply
from proposals.github.body import is_experiment
from proposals.github.issues import (
    RecipeMissing,
    Result,
    _when,
    applied,
    comment_event_apply,
    ignored,
    is_bot,
    issue_event_apply,
    issue_keep,
    issue_labels,
    linked_proposal,
    proposal_from_issue,
)
from proposals.github.outbox.render import is_own_text
from proposals.github.payloads import payload_problem
from proposals.models import GitHubBackfill, PendingIssue, Proposal, State, WebhookDelivery

logger = logging.getLogger(__name__)


def delivery_store(*, delivery_id: str, event: str, action: str, body: str) -> bool:
    """Store a verified delivery as it came and nudge a worker; False when seen before.

    This is the webhook's whole synchronous work, so it is one statement on PostgreSQL: the
    unique delivery id does the dedupe (``row_insert_unless_present``: no exception and no
    savepoint), and the body goes in as the JSON text GitHub signed, neither re-encoded here
    nor parsed by the database (the drain parses it).
    """
    if "\\u0000" in body:  # JSON allows NUL in strings; PostgreSQL's text, where they end, does not
        body = body.replace("\\u0000", "\\ufffd")
    created = row_insert_unless_present(
        model=WebhookDelivery,
        unique="delivery_id",
        values={
            "delivery_id": delivery_id[:100],
            "event": event[:50],
            "action": action[:50],
            "body": body,
            "received_at": timezone.now(),
            "outcome": WebhookDelivery.Outcome.PENDING,
            "detail": "",
        },
    )
    if created:
        transaction.on_commit(deliveries_nudge, robust=True)
    return created


DRAIN_NUDGED = "github:deliveries:nudged"
DRAIN_NUDGE_SECONDS = 30
DRAIN_LINGER_SECONDS = 0.25
DRAIN_NUDGE_MEMO_SECONDS = 0.1
NUDGE_RETRY_SECONDS = 10  # after a failed publish, this process leaves the broker alone
DRAIN_LOCK = "github-deliveries-drain"
DRAIN_CHUNK = 10  # deliveries read from the database at a time


class _NudgeMemo:
    """When this process last saw the flag held, and last failed to publish a nudge
    (time.monotonic), shared by its threads."""

    seen_at = float("-inf")
    failed_at = float("-inf")


_memo = _NudgeMemo()


def deliveries_nudge() -> None:
    """Ask a worker to process the stored deliveries.

    With a shared cache, one queued nudge stands for every delivery stored until the drain
    lets go of the flag, so a stream of deliveries costs a handful of broker messages instead
    of one each: publishing costs more than the rest of the acknowledgement together
    (bench/webhooks.py). A process that saw the flag held less than
    DRAIN_NUDGE_MEMO_SECONDS ago does not even ask Redis again; the drain waits that long
    after letting go before its last look, so such a delivery is still found. If a nudge
    is lost anyway, the flag expires and the reconciler finds what is left.

    A publish that fails (the broker down) takes the broker's connection timeouts, some
    seconds, inside the acknowledgement. So a process whose publish failed does not try
    again for NUDGE_RETRY_SECONDS: the deliveries stored meanwhile cannot reach a worker
    anyway, and the next nudge after that, or the reconciler, drains them all. It lets go
    of the shared flag, so other processes are not held back by its failure.
    """
    now = time.monotonic()  # before asking: the flag was held at some point after this
    if now - _memo.failed_at < NUDGE_RETRY_SECONDS:
        return
    shared = settings.SHARED_CACHE
    if shared:
        if now - _memo.seen_at < DRAIN_NUDGE_MEMO_SECONDS:
            return
        _memo.seen_at = now
        if not cache.add(DRAIN_NUDGED, 1, timeout=DRAIN_NUDGE_SECONDS):
            return
    try:
        github_deliveries_drain.apply_async(retry=False)
    except Exception:  # broker down: the reconciler processes them
        logger.warning(
            "could not enqueue the processing of webhook deliveries; trying again in %s s",
            NUDGE_RETRY_SECONDS,
        )
        _memo.failed_at = time.monotonic()
        if shared:
            _memo.seen_at = float("-inf")
            cache.delete(DRAIN_NUDGED)


def nudge_memo_forget() -> None:
    """Forget what this process saw of the flag and the broker (tests start from a clean slate)."""
    _memo.seen_at = _memo.failed_at = float("-inf")


def deliveries_drain(*, batch: int = 50) -> tuple[int, bool]:
    """Process every stored, unprocessed delivery, oldest first: (how many, come back?).

    While deliveries keep coming, the drain keeps the nudge flag and asks to be run again
    in DRAIN_LINGER_SECONDS (the task reschedules itself; no worker sleeps long), so the
    webhook does not publish a message per delivery. Once a pass finds nothing, it lets go
    of the flag, waits out the nudge memo, and looks once more: a delivery stored before
    that is found by the last look, one stored after it nudges on its own, so none waits
    for the reconciler.
    """
    done = _drain_pending(batch)
    if not settings.SHARED_CACHE:
        return done, False
    if done:
        cache.set(DRAIN_NUDGED, 1, timeout=DRAIN_NUDGE_SECONDS)
        return done, True
    cache.delete(DRAIN_NUDGED)
    time.sleep(DRAIN_NUDGE_MEMO_SECONDS)
    return done + _drain_pending(batch), False


def _drain_pending(batch: int) -> int:
    """Process what is pending now, in batches.

    One drain at a time, whatever the number of workers: a batch's transaction first takes
    the drain's lock, and a drain that finds it taken stops (the one holding it goes on, and
    comes back while deliveries keep arriving). So deliveries are applied in the order they
    arrived: a comment is never processed before the ``opened`` of its issue that came
    first, only because another worker had that one in hand.

    A batch is one transaction: its rows are locked together, each delivery that needs the database runs in its own
    savepoint so one failure stays its own, and the outcomes are written with one UPDATE per
    distinct outcome. Rows are read DRAIN_CHUNK at a time, so large payloads (up to 25 MB
    each) never sit in memory together, and which of a chunk's issues are linked to a
    proposal is asked once for the chunk.
    """
    done = 0
    while True:
        with transaction.atomic():
            if not exclusive_for_transaction(DRAIN_LOCK):
                return done
            pending = (
                WebhookDelivery.objects.filter(outcome=WebhookDelivery.Outcome.PENDING)
                .order_by("received_at", "pk")
                .select_for_update(skip_locked=True)
                .only("pk", "delivery_id", "event", "action", "body")[:batch]
            )
            outcomes: dict[Result, list[int]] = defaultdict(list)
            rows = pending.iterator(chunk_size=DRAIN_CHUNK)
            while chunk := list(islice(rows, DRAIN_CHUNK)):
                payloads = [_payload(delivery.body) for delivery in chunk]
                linked = _linked_numbers(payloads)
                for delivery, payload in zip(chunk, payloads, strict=True):
                    outcome, detail = _delivery_outcome(delivery, payload, linked)
                    outcomes[outcome, detail[:10_000]].append(delivery.pk)
                del chunk, payloads  # before the next chunk is read
            processed_at = timezone.now()
            for (outcome, detail), ids in outcomes.items():  # most deliveries share a few
                WebhookDelivery.objects.filter(pk__in=ids).update(
                    outcome=outcome, detail=detail, processed_at=processed_at
                )
        count = sum(len(ids) for ids in outcomes.values())
        done += count
        if count < batch:
            return done


def _payload(body: str) -> dict[str, Any] | None:
    """The delivery's JSON object; None if it is not one (the webhook stores only objects)."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return payload if isinstance(payload, dict) else None


def _issue_number(payload: dict[str, Any] | None) -> int | None:
    issue = payload.get("issue") if payload is not None else None
    number = issue.get("number") if isinstance(issue, dict) else None
    return number if isinstance(number, int) else None


def _linked_numbers(payloads: list[dict[str, Any] | None]) -> set[int]:
    """Which of the issues these payloads are about are linked to a proposal: one query."""
    numbers = {n for n in map(_issue_number, payloads) if n is not None}
    if not numbers:
        return set()
    linked = Proposal.objects.filter(github_issue_number__in=numbers).order_by()
    return {n for n in linked.values_list("github_issue_number", flat=True) if n is not None}


def _delivery_outcome(
    delivery: WebhookDelivery, payload: dict[str, Any] | None, linked: set[int]
) -> Result:
    """Apply one delivery: what it did, or why not. Never raises.

    Most deliveries are settled without writing: from the payload alone (a ping, an event
    the site does not follow, another repository, a pull request), or because their issue
    is in no proposal's ``linked`` number set (asked once for the drain's chunk) and they do
    not open one. Only the rest enter a savepoint, so a failure undoes that delivery's
    writes and nothing else. A delivery that takes that path adds its issue to ``linked``:
    what it did (opening a proposal, say) is seen by the chunk's later deliveries, which
    look the proposal up again.
    """
    event, action = delivery.event, delivery.action
    if payload is None:
        return ignored("the body is not a JSON object")
    try:
        settled = _triage(event, action, payload)
        if settled is not None:
            return settled
        issue = payload["issue"]  # an object with an integer number: _triage checked
        if issue["number"] not in linked:
            settled = _unlinked_outcome(event, action, issue)
            if settled is not None:
                return settled
        linked.add(issue["number"])
        with transaction.atomic():
            return _dispatch(event, action, payload)
    except DomainError as exc:
        return WebhookDelivery.Outcome.IGNORED, f"refused: {exc.message}"
    except ValidationError as exc:
        return WebhookDelivery.Outcome.IGNORED, "refused: " + "; ".join(exc.messages)
    except Exception as exc:
        logger.exception("webhook delivery %s failed", delivery.delivery_id)
        return WebhookDelivery.Outcome.FAILED, f"{type(exc).__name__}: {exc}"


def deliveries_left_behind() -> bool:
    """Deliveries stored but not processed for a minute (a lost nudge): the reconciler drains."""
    cutoff = timezone.now() - timedelta(minutes=1)
    return WebhookDelivery.objects.filter(
        outcome=WebhookDelivery.Outcome.PENDING, received_at__lt=cutoff
    ).exists()


def _triage(event: str, action: str, payload: dict[str, Any]) -> Result | None:
    """The outcome of a delivery the payload alone settles; None when it needs the database."""
    if event == "ping":
        return applied("pong")
    if event not in {"issues", "issue_comment"}:
        return ignored(f"{event} events need nothing here")
    problem = payload_problem(event, payload)
    if problem:
        return ignored(f"malformed {event} payload: {problem}")
    issue = payload["issue"]  # payload_problem checked it is there, with a number
    if not isinstance(issue["number"], int) or issue.get("pull_request"):  # 1.0 passes the schema
        if event == "issue_comment":
            return ignored("a comment on a pull request is not a proposal comment")
        return ignored("not an issue")
    repository = (payload.get("repository") or {}).get("full_name", "")
    if settings.GITHUB_REPOSITORY and repository.lower() != settings.GITHUB_REPOSITORY.lower():
        return ignored(f"repository {repository} is not {settings.GITHUB_REPOSITORY}")
    sender = github_login(payload.get("sender"))
    if settings.GITHUB_BOT_LOGIN and sender.lower() == settings.GITHUB_BOT_LOGIN.lower():
        return ignored("the site's own write")
    return None


def _dispatch(event: str, action: str, payload: dict[str, Any]) -> Result:
    """Apply an ``issues`` or ``issue_comment`` delivery that passed ``_triage``."""
    issue = payload["issue"]
    proposal = linked_proposal(issue["number"])
    if proposal is None:
        settled = _unlinked_outcome(event, action, issue)
        if settled is not None:
            return settled
        if is_bot(payload.get("sender")):
            return ignored(f"a bot's {action} starts no proposal")
        if action in MIRROR_ACTIONS or (action != "opened" and not _recent_open_issue(issue)):
            # An old experiment issue (closed, or older than the last backfill): mirrored
            # quietly as an imported proposal, never answered with a draft and a comment.
            return imported_issue_apply(issue)
        try:
            with transaction.atomic():
                created = proposal_from_issue(issue=issue)
        except RecipeMissing as exc:
            return issue_keep(issue=issue, reason=exc.message)
        return applied(f"proposal {created.pk} created ({created.state})")
    if proposal.state == State.IMPORTED:
        if event == "issue_comment":
            return imported_comment_apply(action, proposal, payload.get("comment") or {})
        if action not in {"deleted", "transferred"}:
            return imported_issue_apply(issue)
    if event == "issue_comment":
        return comment_event_apply(action, proposal, payload.get("comment") or {}, payload)
    return issue_event_apply(action, proposal, issue, payload)


NEW_ISSUE_WINDOW = timedelta(days=1)


def _recent_open_issue(issue: dict[str, Any]) -> bool:
    """An open issue opened after the last backfill began (or, with none, within a day), or
    one kept waiting for a recipe: labelling or editing it makes a proposal as opening it
    does. Older ones are history."""
    created = _when(issue.get("created_at"))
    if issue.get("state") == "closed" or created is None:
        return False
    if PendingIssue.objects.filter(number=issue["number"]).exists():
        return True  # opened while the site was watching, kept until a recipe exists
    started = (
        GitHubBackfill.objects.filter(started_at__isnull=False)
        .order_by("-started_at")
        .values_list("started_at", flat=True)
        .first()
    )
    return created >= (started or timezone.now() - NEW_ISSUE_WINDOW)


OPENING_ACTIONS = {"opened", "labeled", "edited", "reopened"}
MIRROR_ACTIONS = {"closed", "unlabeled"}  # on an old experiment issue: mirrored, quietly


def _unlinked_outcome(event: str, action: str, issue: dict[str, Any]) -> Result | None:
    """What a delivery about an issue linked to no proposal comes to; None when it opens one.

    Reads only the payload, so the drain settles most deliveries with it and no query.
    """
    if event == "issue_comment":
        return ignored("the issue is not linked to a proposal")
    if is_own_text(issue.get("body")):
        return ignored("an issue the site opened")  # its link may not be stored yet
    if action in OPENING_ACTIONS | MIRROR_ACTIONS and is_experiment(issue_labels(issue)):
        return None  # opened: a proposal; otherwise new ones too, old ones only mirrored
    return ignored("not an experiment issue")


@shared_task(
    bind=True, name="proposals.github_deliveries_drain", time_limit=600, soft_time_limit=580
)
def github_deliveries_drain(self: object) -> int:
    """Process stored webhook deliveries; while more keep coming, come back shortly."""
    done, come_back = deliveries_drain()
    if come_back and not getattr(getattr(self, "request", None), "is_eager", False):
        github_deliveries_drain.apply_async(countdown=DRAIN_LINGER_SECONDS)
    return done
