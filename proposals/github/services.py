"""Writes driven by GitHub: storing and processing webhook deliveries, linking accounts.

The webhook door stores a delivery (``delivery_store``) and answers at once; the Celery task
calls ``deliveries_drain``, which turns each into calls of the proposal services with the
mapped site account as the actor, so the same rules and permissions apply as on the site.
"""

from __future__ import annotations

import logging
import re
import time
from collections import defaultdict
from datetime import datetime, timedelta
from itertools import islice
from typing import Any

import orjson
from allauth.socialaccount.models import SocialAccount
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from marin_site.db import server_binding_cursor
from marin_site.doors import Door
from marin_site.errors import DomainError
from marin_site.roles import ROLE_MAINTAINER, ROLE_REVIEWER, roles_forget
from proposals import services
from proposals.actions import ACTIONS
from proposals.github import outbox
from proposals.github.body import is_experiment, issue_fields
from proposals.github.commands import commands_answer
from proposals.github.payloads import payload_problem
from proposals.models import MAX_MARKDOWN, Comment, Proposal, State, WebhookDelivery
from runs.models import Recipe

logger = logging.getLogger(__name__)

URL_FIELDS = ("wandb_url", "data_browser_url", "experiment_json_url")
LABEL_OK = re.compile(r"^[a-z0-9][a-z0-9:._-]{0,49}$")
Result = tuple[str, str]  # (outcome, detail)


# Accounts.


def github_account(*, login: str, github_id: int | str | None) -> User:
    """The site account of a GitHub user: linked by GitHub id, created on first sight.

    Accounts are never linked by matching usernames (anyone can take a login on GitHub);
    a site user who signs in with GitHub gets the same SocialAccount row, so the two meet.
    Logins in GITHUB_MAINTAINERS / GITHUB_REVIEWERS get those roles.
    """
    uid = str(github_id if github_id is not None else f"login:{login}")
    social = SocialAccount.objects.filter(provider="github", uid=uid).select_related("user").first()
    if social is None:
        base = re.sub(r"[^\w.@+-]", "-", login)[:140] or "github-user"
        username = base
        suffix = 1
        while User.objects.filter(username=username).exists():
            suffix += 1
            username = f"{base}-gh{suffix if suffix > 2 else ''}"
        user = User.objects.create_user(username=username)
        social = SocialAccount.objects.create(
            user=user, provider="github", uid=uid, extra_data={"login": login}
        )
    elif social.extra_data.get("login") != login:
        social.extra_data = {**social.extra_data, "login": login}
        social.save(update_fields=["extra_data"])
    user = social.user
    roles = []
    if login.lower() in {m.lower() for m in settings.GITHUB_MAINTAINERS}:
        roles.append(ROLE_MAINTAINER)
    if login.lower() in {r.lower() for r in settings.GITHUB_REVIEWERS}:
        roles.append(ROLE_REVIEWER)
    for role in roles:
        user.groups.add(Group.objects.get_or_create(name=role)[0])
    if roles:
        roles_forget(user)
    return user


# Deliveries.


def delivery_store(*, delivery_id: str, event: str, action: str, body: str) -> bool:
    """Store a verified delivery as it came and nudge a worker; False when seen before.

    This is the webhook's whole synchronous work, so it is one statement: the unique delivery
    id does the dedupe (``ON CONFLICT DO NOTHING``, no exception and no savepoint), and the
    body goes in as the JSON text GitHub signed, neither re-encoded here nor parsed by the
    database (the drain parses it).
    """
    if "\\u0000" in body:  # JSON allows NUL in strings; PostgreSQL's text, where they end, does not
        body = body.replace("\\u0000", "\\ufffd")
    table = connection.ops.quote_name(WebhookDelivery._meta.db_table)
    with server_binding_cursor() as cursor:  # the body as a parameter, not in the statement
        cursor.execute(
            f"INSERT INTO {table} "  # noqa: S608  (the table name is ours; values are parameters)
            "(delivery_id, event, action, body, received_at, outcome, detail) "
            "VALUES (%s, %s, %s, %s, %s, %s, '') ON CONFLICT (delivery_id) DO NOTHING RETURNING id",
            [
                delivery_id[:100],
                event[:50],
                action[:50],
                body,
                connection.ops.adapt_datetimefield_value(timezone.now()),
                WebhookDelivery.Outcome.PENDING,
            ],
        )
        created = cursor.fetchone() is not None
    if created:
        transaction.on_commit(deliveries_nudge, robust=True)
    return created


DRAIN_NUDGED = "github:deliveries:nudged"
DRAIN_NUDGE_SECONDS = 30
DRAIN_LINGER_SECONDS = 0.25
DRAIN_NUDGE_MEMO_SECONDS = 0.1
NUDGE_RETRY_SECONDS = 10  # after a failed publish, this process leaves the broker alone
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
    from proposals import tasks

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
        tasks.github_deliveries_drain.apply_async(retry=False)
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

    A batch is one transaction: its rows are locked together (rows another worker holds are
    skipped, not waited for), each delivery that needs the database runs in its own
    savepoint so one failure stays its own, and the outcomes are written with one UPDATE per
    distinct outcome. Rows are read DRAIN_CHUNK at a time, so large payloads (up to 25 MB
    each) never sit in memory together, and which of a chunk's issues are linked to a
    proposal is asked once for the chunk.
    """
    done = 0
    while True:
        with transaction.atomic():
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
        return _ignored("the body is not a JSON object")
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


def _ignored(detail: str) -> Result:
    return WebhookDelivery.Outcome.IGNORED, detail


def _applied(detail: str) -> Result:
    return WebhookDelivery.Outcome.APPLIED, detail


def _triage(event: str, action: str, payload: dict[str, Any]) -> Result | None:
    """The outcome of a delivery the payload alone settles; None when it needs the database."""
    if event == "ping":
        return _applied("pong")
    if event not in {"issues", "issue_comment"}:
        return _ignored(f"{event} events need nothing here")
    problem = payload_problem(event, payload)
    if problem:
        return _ignored(f"malformed {event} payload: {problem}")
    issue = payload["issue"]  # payload_problem checked it is there, with a number
    if not isinstance(issue["number"], int) or issue.get("pull_request"):  # 1.0 passes the schema
        if event == "issue_comment":
            return _ignored("a comment on a pull request is not a proposal comment")
        return _ignored("not an issue")
    repository = (payload.get("repository") or {}).get("full_name", "")
    if settings.GITHUB_REPOSITORY and repository.lower() != settings.GITHUB_REPOSITORY.lower():
        return _ignored(f"repository {repository} is not {settings.GITHUB_REPOSITORY}")
    sender = (payload.get("sender") or {}).get("login", "")
    if settings.GITHUB_BOT_LOGIN and sender.lower() == settings.GITHUB_BOT_LOGIN.lower():
        return _ignored("the site's own write")
    return None


def _dispatch(event: str, action: str, payload: dict[str, Any]) -> Result:
    """Apply an ``issues`` or ``issue_comment`` delivery that passed ``_triage``."""
    issue = payload["issue"]
    proposal = _linked_proposal(issue["number"])
    if proposal is None:
        settled = _unlinked_outcome(event, action, issue)
        if settled is not None:
            return settled
        created = proposal_from_issue(issue=issue)
        return _applied(f"proposal {created.pk} created ({created.state})")
    if event == "issue_comment":
        return _comment_event(action, proposal, payload.get("comment") or {}, payload)
    return _issue_event(action, proposal, issue, payload)


OPENING_ACTIONS = {"opened", "labeled", "edited", "reopened"}


def _unlinked_outcome(event: str, action: str, issue: dict[str, Any]) -> Result | None:
    """What a delivery about an issue linked to no proposal comes to; None when it opens one.

    Reads only the payload, so the drain settles most deliveries with it and no query.
    """
    if event == "issue_comment":
        return _ignored("the issue is not linked to a proposal")
    if outbox.is_own_text(issue.get("body")):
        return _ignored("an issue the site opened")  # its link may not be stored yet
    if action in OPENING_ACTIONS and is_experiment(_issue_labels(issue)):
        return None
    return _ignored("not an experiment issue")


# Issues.


def _when(value: Any) -> datetime | None:
    return parse_datetime(value) if isinstance(value, str) else None


def _issue_recipe() -> Recipe | None:
    name = settings.GITHUB_ISSUE_RECIPE
    recipes = Recipe.objects.filter(is_active=True)
    if name:
        name, _, version = name.partition("@")
        recipes = recipes.filter(name=name, **({"version": version} if version else {}))
    return recipes.order_by("name", "-id").first()


def _safe_data(data: dict[str, str]) -> dict[str, str]:
    """Drop what the model would refuse (a malformed URL), trim what is too long."""
    clean = {}
    validate = URLValidator(schemes=["http", "https"])
    for key, value in data.items():
        if key in URL_FIELDS:
            try:
                validate(value)
            except ValidationError:
                continue
        clean[key] = value[:MAX_MARKDOWN]
    return clean


def _issue_labels(issue: dict[str, Any]) -> list[str]:
    return [str(label.get("name", "")) for label in issue.get("labels") or []]


def proposal_from_issue(*, issue: dict[str, Any]) -> Proposal:
    """An experiment issue opened on GitHub becomes a proposal linked to it."""
    user_data = issue.get("user") or {}
    author = github_account(login=user_data.get("login", "ghost"), github_id=user_data.get("id"))
    recipe = _issue_recipe()
    if recipe is None:
        raise DomainError("No active recipe to attach issue proposals to (GITHUB_ISSUE_RECIPE).")
    fields = issue_fields(title=issue.get("title") or "Untitled", body=issue.get("body"))
    data = _safe_data(fields.data)
    labels = [n.lower() for n in _issue_labels(issue) if LABEL_OK.match(n.lower())][:20]
    with transaction.atomic():
        proposal = services.proposal_create(
            author=author, data={**data, "recipe": recipe}, labels=labels, door=Door.GITHUB
        )
        Proposal.objects.filter(pk=proposal.pk).update(
            github_issue_number=issue["number"],
            github_issue_node_id=issue.get("node_id") or "",
            github_updated_at=_when(issue.get("updated_at")),
            github_sections=data,
        )
        proposal.refresh_from_db()
        services.event_record(
            proposal=proposal,
            actor=author,
            verb="linked",
            door=Door.GITHUB,
            message=f"From GitHub issue #{issue['number']}.",
        )
        problems = list(fields.missing)
        if not problems:
            try:
                with transaction.atomic():
                    proposal = services.proposal_transition(
                        proposal_id=proposal.pk, action="submit", actor=author, door=Door.GITHUB
                    )
            except ValidationError as exc:
                problems += exc.messages
        if proposal.state == State.DRAFT:
            outbox.outbox_proposal_changed(proposal=proposal)
            link = f"{settings.SITE_URL}{proposal.get_absolute_url()}"
            outbox.outbox_comment_enqueue(
                proposal=proposal,
                key=f"missing:{proposal.pk}",
                body=(
                    f"This issue is now [a draft proposal on marin-site]({link}). Before it can "
                    "be submitted for review it needs:\n\n"
                    + "\n".join(f"- {problem}" for problem in problems)
                ),
            )
    return proposal


def proposal_apply_issue_edit(
    *, proposal: Proposal, issue: dict[str, Any], sender: dict[str, Any]
) -> Result:
    """Apply an issue edit by the written rule (README, "GitHub sync").

    Only issues opened on GitHub are read back. A delivery older than the last one applied
    changes nothing. A field changes only when its value as read from the issue changed
    since the last edit applied, so an unchanged section never undoes a site edit, and a
    removed section never blanks a field. The editor must be allowed to edit the proposal.
    """
    updated_at = _when(issue.get("updated_at"))
    if proposal.github_updated_at and updated_at and updated_at <= proposal.github_updated_at:
        return _ignored("an older edit than the one already applied")
    if not proposal.github_sections:
        return _ignored("the site wrote this issue; edits on GitHub are discussion")
    data = _safe_data(issue_fields(title=issue.get("title") or "", body=issue.get("body")).data)
    changes = {k: v for k, v in data.items() if proposal.github_sections.get(k) != v}
    if proposal.state == State.APPROVED:
        changes = {k: v for k, v in changes.items() if k in services.AMENDABLE_FIELDS}
    Proposal.objects.filter(pk=proposal.pk).update(
        github_updated_at=updated_at, github_sections={**proposal.github_sections, **data}
    )
    if not changes:
        return _ignored("nothing changed outside the site's block")
    if proposal.state not in ACTIONS["edit"].states:
        return _ignored(f"a {proposal.get_state_display().lower()} proposal is not edited")
    editor = github_account(login=sender.get("login", "ghost"), github_id=sender.get("id"))
    services.proposal_update(proposal_id=proposal.pk, actor=editor, data=changes, door=Door.GITHUB)
    return _applied("updated " + ", ".join(sorted(changes)))


def _linked_proposal(number: int) -> Proposal | None:
    """The proposal linked to issue ``number``, if any (the issue number is unique)."""
    return Proposal.objects.filter(github_issue_number=number).order_by().first()


def _issue_event(
    action: str, proposal: Proposal, issue: dict[str, Any], payload: dict[str, Any]
) -> Result:
    """An ``issues`` delivery about the issue linked to ``proposal``."""
    number = issue["number"]
    sender = payload.get("sender") or {}
    if action == "edited":
        return proposal_apply_issue_edit(proposal=proposal, issue=issue, sender=sender)
    if action in {"closed", "reopened"}:
        services.event_record(
            proposal=proposal,
            actor=None,
            actor_label=f"@{sender.get('login', '')}",
            verb=f"issue {action}",
            door=Door.GITHUB,
            message="Closing or reopening the issue says nothing about the outcome.",
        )
        return _applied(f"issue {action}: noted on the timeline, state unchanged")
    if action in {"deleted", "transferred"}:
        Proposal.objects.filter(pk=proposal.pk).update(
            github_issue_number=None, github_status_comment_id=None
        )
        services.event_record(
            proposal=proposal,
            actor=None,
            actor_label=f"@{sender.get('login', '')}",
            verb=f"issue {action}",
            door=Door.GITHUB,
            message=f"GitHub issue #{number} was {action}; the proposal is no longer linked.",
        )
        return _applied(f"issue {action}: unlinked")
    return _ignored(f"issues.{action} needs nothing here")


# Comments.


def _comment_event(
    action: str, proposal: Proposal, comment: dict[str, Any], payload: dict[str, Any]
) -> Result:
    """An ``issue_comment`` delivery on the issue linked to ``proposal``."""
    comment_id = comment.get("id")
    body = comment.get("body") or ""
    if not isinstance(comment_id, int):
        return _ignored("no comment id")
    if outbox.is_own_text(body):
        return _ignored("the site's own comment")
    existing = Comment.objects.filter(github_comment_id=comment_id).first()
    updated_at = _when(comment.get("updated_at"))
    if action == "deleted":
        if existing is None:
            return _ignored("comment not mirrored")
        existing.delete()
        _comment_noted(proposal, payload, "deleted a comment", "")
        return _applied(f"comment {comment_id} removed")
    if existing is not None:
        if (
            action == "edited"
            and updated_at
            and (existing.github_updated_at is None or updated_at > existing.github_updated_at)
        ):
            Comment.objects.filter(pk=existing.pk).update(
                body=body[:MAX_MARKDOWN], github_updated_at=updated_at
            )
            _comment_noted(proposal, payload, "edited a comment", services.excerpt(body))
            return _applied("comment updated (its commands are not run again)")
        return _ignored("comment already stored")
    if action not in {"created", "edited"} or not body.strip():
        return _ignored(f"issue_comment.{action} needs nothing here")
    user_data = comment.get("user") or {}
    login = user_data.get("login", "ghost")
    author = github_account(login=login, github_id=user_data.get("id"))
    try:
        with transaction.atomic():
            stored = services.comment_create(
                proposal_id=proposal.pk, author=author, body=body[:MAX_MARKDOWN], door=Door.GITHUB
            )
            Comment.objects.filter(pk=stored.pk).update(
                github_comment_id=comment_id,
                github_updated_at=updated_at,
                author_label=f"@{login} on GitHub"[:100],
            )
    except IntegrityError:
        return _ignored("comment already stored")
    if action == "edited":
        return _applied("comment stored (an edit does not run commands)")
    answers = commands_answer(
        proposal_id=proposal.pk, user=author, login=login, github_comment_id=comment_id, body=body
    )
    return _applied(f"comment stored; {len(answers)} command(s) answered")


def _comment_noted(proposal: Proposal, payload: dict[str, Any], verb: str, message: str) -> None:
    """A comment edited or deleted on GitHub, on the proposal's timeline."""
    sender = payload.get("sender") or {}
    services.event_record(
        proposal=proposal,
        actor=None,
        actor_label=f"@{sender.get('login', '')}"[:100],
        verb=verb,
        door=Door.GITHUB,
        message=message,
    )
