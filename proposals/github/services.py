"""Writes driven by GitHub: storing and processing webhook deliveries, linking accounts.

The webhook door stores a delivery (``delivery_store``) and answers at once; the Celery task
calls ``delivery_process``, which turns it into calls of the proposal services with the
mapped site account as the actor, so the same rules and permissions apply as on the site.
"""

from __future__ import annotations

import contextlib
import logging
import re
from datetime import datetime, timedelta
from typing import Any

from allauth.socialaccount.models import SocialAccount
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from marin_site.errors import DomainError
from proposals import permissions as perms
from proposals import services
from proposals.github import outbox
from proposals.github.body import is_experiment, issue_fields
from proposals.github.commands import commands_answer
from proposals.github.payloads import payload_problem
from proposals.models import MAX_MARKDOWN, Comment, Door, Proposal, State, WebhookDelivery
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
        roles.append(perms.ROLE_MAINTAINER)
    if login.lower() in {r.lower() for r in settings.GITHUB_REVIEWERS}:
        roles.append(perms.ROLE_REVIEWER)
    for role in roles:
        user.groups.add(Group.objects.get_or_create(name=role)[0])
    if roles and hasattr(user, "_marin_roles"):
        del user._marin_roles
    return user


# Deliveries.


def _in_transaction() -> bool:
    return not transaction.get_autocommit()


def delivery_store(*, delivery_id: str, event: str, payload: dict[str, Any]) -> bool:
    """Store a verified delivery and nudge a worker to process it; False when seen before."""
    raw_action = payload.get("action")
    action = raw_action if isinstance(raw_action, str) else ""
    try:  # one INSERT; the unique delivery id is the dedupe (a savepoint only if in a transaction)
        with (
            transaction.atomic(savepoint=True, durable=False)
            if _in_transaction()
            else contextlib.nullcontext()
        ):
            WebhookDelivery.objects.create(
                delivery_id=delivery_id[:100], event=event[:50], action=action[:50], payload=payload
            )
    except IntegrityError:
        return False
    transaction.on_commit(deliveries_nudge, robust=True)
    return True


DRAIN_NUDGED = "github:deliveries:nudged"
DRAIN_NUDGE_SECONDS = 30


def deliveries_nudge() -> None:
    """Ask a worker to process the stored deliveries.

    With a shared cache, one queued nudge stands for every delivery stored until a worker
    takes it up (the worker clears the flag before it looks for work), so a burst of
    deliveries costs one broker message instead of one each, and the webhook answers
    sooner. If the nudge is lost anyway, the reconciler finds what is left unprocessed.
    """
    from proposals import tasks

    shared = settings.SHARED_CACHE
    if shared and not cache.add(DRAIN_NUDGED, 1, timeout=DRAIN_NUDGE_SECONDS):
        return
    try:
        tasks.github_deliveries_drain.apply_async(retry=False)
    except Exception:  # broker down: the reconciler processes them
        logger.warning("could not enqueue the processing of webhook deliveries")
        if shared:
            cache.delete(DRAIN_NUDGED)


def deliveries_drain(*, batch: int = 200) -> int:
    """Process every stored, unprocessed delivery, oldest first; returns how many."""
    cache.delete(DRAIN_NUDGED)  # before looking: a delivery stored from now on nudges again
    done = 0
    while True:
        pending = list(
            WebhookDelivery.objects.filter(outcome=WebhookDelivery.Outcome.PENDING)
            .order_by("received_at", "pk")
            .values_list("pk", flat=True)[:batch]
        )
        for pk in pending:
            if delivery_process(delivery_id=pk):
                done += 1
        if len(pending) < batch:
            return done


def delivery_process(*, delivery_id: int) -> str:
    """Process one stored delivery, once; the outcome and why are stored on it."""
    with transaction.atomic():
        delivery = WebhookDelivery.objects.select_for_update().filter(pk=delivery_id).first()
        if delivery is None or delivery.processed_at is not None:
            return ""
        try:
            with transaction.atomic():
                outcome, detail = _dispatch(delivery.event, delivery.action, delivery.payload)
        except DomainError as exc:
            outcome, detail = WebhookDelivery.Outcome.IGNORED, f"refused: {exc.message}"
        except ValidationError as exc:
            outcome, detail = WebhookDelivery.Outcome.IGNORED, "refused: " + "; ".join(exc.messages)
        except Exception as exc:
            logger.exception("webhook delivery %s failed", delivery.delivery_id)
            outcome, detail = WebhookDelivery.Outcome.FAILED, f"{type(exc).__name__}: {exc}"
        delivery.outcome = outcome
        delivery.detail = detail[:10_000]
        delivery.processed_at = timezone.now()
        delivery.save(update_fields=["outcome", "detail", "processed_at"])
        return outcome


def delivery_pending_ids() -> list[int]:
    """Deliveries stored but not processed for a minute: what the reconciler retries."""
    cutoff = timezone.now() - timedelta(minutes=1)
    return list(
        WebhookDelivery.objects.filter(processed_at__isnull=True, received_at__lt=cutoff)
        .order_by("received_at")
        .values_list("pk", flat=True)[:500]
    )


def _ignored(detail: str) -> Result:
    return WebhookDelivery.Outcome.IGNORED, detail


def _applied(detail: str) -> Result:
    return WebhookDelivery.Outcome.APPLIED, detail


def _dispatch(event: str, action: str, payload: dict[str, Any]) -> Result:
    if event == "ping":
        return _applied("pong")
    if event not in {"issues", "issue_comment"}:
        return _ignored(f"{event} events need nothing here")
    problem = payload_problem(event, payload)
    if problem:
        return _ignored(f"malformed {event} payload: {problem}")
    repository = (payload.get("repository") or {}).get("full_name", "")
    if settings.GITHUB_REPOSITORY and repository.lower() != settings.GITHUB_REPOSITORY.lower():
        return _ignored(f"repository {repository} is not {settings.GITHUB_REPOSITORY}")
    sender = (payload.get("sender") or {}).get("login", "")
    if settings.GITHUB_BOT_LOGIN and sender.lower() == settings.GITHUB_BOT_LOGIN.lower():
        return _ignored("the site's own write")
    issue = payload.get("issue") or {}
    if event == "issue_comment":
        return _comment_event(action, issue, payload.get("comment") or {})
    return _issue_event(action, issue, payload)


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
    if proposal.state not in {*services.EDITABLE_STATES, State.APPROVED}:
        return _ignored(f"a {proposal.get_state_display().lower()} proposal is not edited")
    editor = github_account(login=sender.get("login", "ghost"), github_id=sender.get("id"))
    services.proposal_update(proposal_id=proposal.pk, actor=editor, data=changes, door=Door.GITHUB)
    return _applied("updated " + ", ".join(sorted(changes)))


def _issue_event(action: str, issue: dict[str, Any], payload: dict[str, Any]) -> Result:
    number = issue.get("number")
    if not isinstance(number, int) or issue.get("pull_request"):
        return _ignored("not an issue")
    proposal = Proposal.objects.filter(github_issue_number=number).first()
    if proposal is None:
        if outbox.is_own_text(issue.get("body")):
            return _ignored("an issue the site opened")  # its link may not be stored yet
        if action in {"opened", "labeled", "edited", "reopened"} and is_experiment(
            _issue_labels(issue)
        ):
            created = proposal_from_issue(issue=issue)
            return _applied(f"proposal {created.pk} created ({created.state})")
        return _ignored("not an experiment issue")
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


def _comment_event(action: str, issue: dict[str, Any], comment: dict[str, Any]) -> Result:
    if issue.get("pull_request"):
        return _ignored("a comment on a pull request is not a proposal comment")
    proposal = Proposal.objects.filter(github_issue_number=issue.get("number")).first()
    if proposal is None:
        return _ignored("the issue is not linked to a proposal")
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
