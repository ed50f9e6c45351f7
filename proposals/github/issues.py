"""Issue and comment events on a proposal's issue, applied through the proposal services.

An experiment issue opened on GitHub becomes a proposal (``proposal_from_issue``); edits of
its sections are read back by the written rule (``proposal_apply_issue_edit``); comments
are mirrored and their slash commands run. Every function here returns the delivery's
outcome, ``(outcome, detail)``, for ``deliveries`` to store.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.core.validators import URLValidator
from django.db import IntegrityError, transaction
from django.utils.dateparse import parse_datetime

from marin_site.doors import Door
from marin_site.errors import DomainError
from proposals import services
from proposals.actions import ACTIONS
from proposals.github.accounts import github_account, github_login
from proposals.github.body import issue_fields
from proposals.github.commands import commands_answer
from proposals.github.outbox.enqueue import outbox_comment_enqueue, outbox_proposal_changed
from proposals.github.outbox.render import is_own_text
from proposals.models import MAX_MARKDOWN, Comment, Proposal, State, WebhookDelivery
from runs.models import Recipe

URL_FIELDS = ("wandb_url", "data_browser_url", "experiment_json_url")
LABEL_OK = re.compile(r"^[a-z0-9][a-z0-9:._-]{0,49}$")
Result = tuple[str, str]  # (outcome, detail)


def ignored(detail: str) -> Result:
    return WebhookDelivery.Outcome.IGNORED, detail


def applied(detail: str) -> Result:
    return WebhookDelivery.Outcome.APPLIED, detail


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
    """Drop what the model would refuse (a malformed or overlong URL), trim any other value
    to its column, so one odd section never costs the issue its other fields."""
    clean = {}
    validate = URLValidator(schemes=["http", "https"])
    for key, value in data.items():
        try:
            limit = getattr(Proposal._meta.get_field(key), "max_length", None) or MAX_MARKDOWN
        except FieldDoesNotExist:
            limit = MAX_MARKDOWN
        if key in URL_FIELDS:
            try:
                validate(value)
            except ValidationError:
                continue
            if len(value) > limit:
                continue
        clean[key] = value[:limit]
    return clean


def issue_labels(issue: dict[str, Any]) -> list[str]:
    return [str(label.get("name", "")) for label in issue.get("labels") or []]


def proposal_from_issue(*, issue: dict[str, Any]) -> Proposal:
    """An experiment issue opened on GitHub becomes a proposal linked to it."""
    user_data = issue.get("user") or {}
    author = github_account(login=github_login(user_data), github_id=user_data.get("id"))
    recipe = _issue_recipe()
    if recipe is None:
        raise DomainError("No active recipe to attach issue proposals to (GITHUB_ISSUE_RECIPE).")
    fields = issue_fields(title=issue.get("title") or "Untitled", body=issue.get("body"))
    data = _safe_data(fields.data)
    labels = [n.lower() for n in issue_labels(issue) if LABEL_OK.match(n.lower())][:20]
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
            outbox_proposal_changed(proposal=proposal)
            link = f"{settings.SITE_URL}{proposal.get_absolute_url()}"
            outbox_comment_enqueue(
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
        return ignored("an older edit than the one already applied")
    if not proposal.github_sections:
        return ignored("the site wrote this issue; edits on GitHub are discussion")
    data = _safe_data(issue_fields(title=issue.get("title") or "", body=issue.get("body")).data)
    changes = {k: v for k, v in data.items() if proposal.github_sections.get(k) != v}
    if proposal.state == State.APPROVED:
        changes = {k: v for k, v in changes.items() if k in services.AMENDABLE_FIELDS}
    Proposal.objects.filter(pk=proposal.pk).update(
        github_updated_at=updated_at, github_sections={**proposal.github_sections, **data}
    )
    if not changes:
        return ignored("nothing changed outside the site's block")
    if proposal.state not in ACTIONS["edit"].states:
        return ignored(f"a {proposal.get_state_display().lower()} proposal is not edited")
    editor = github_account(login=github_login(sender), github_id=sender.get("id"))
    services.proposal_update(proposal_id=proposal.pk, actor=editor, data=changes, door=Door.GITHUB)
    return applied("updated " + ", ".join(sorted(changes)))


def linked_proposal(number: int) -> Proposal | None:
    """The proposal linked to issue ``number``, if any (the issue number is unique)."""
    return Proposal.objects.filter(github_issue_number=number).order_by().first()


def issue_event_apply(
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
            actor_label=f"@{github_login(sender)}",
            verb=f"issue {action}",
            door=Door.GITHUB,
            message="Closing or reopening the issue says nothing about the outcome.",
        )
        return applied(f"issue {action}: noted on the timeline, state unchanged")
    if action in {"deleted", "transferred"}:
        Proposal.objects.filter(pk=proposal.pk).update(
            github_issue_number=None, github_status_comment_id=None
        )
        services.event_record(
            proposal=proposal,
            actor=None,
            actor_label=f"@{github_login(sender)}",
            verb=f"issue {action}",
            door=Door.GITHUB,
            message=f"GitHub issue #{number} was {action}; the proposal is no longer linked.",
        )
        return applied(f"issue {action}: unlinked")
    return ignored(f"issues.{action} needs nothing here")


# Comments.


def comment_event_apply(
    action: str, proposal: Proposal, comment: dict[str, Any], payload: dict[str, Any]
) -> Result:
    """An ``issue_comment`` delivery on the issue linked to ``proposal``."""
    comment_id = comment.get("id")
    body = comment.get("body") or ""
    if not isinstance(comment_id, int):
        return ignored("no comment id")
    if is_own_text(body):
        return ignored("the site's own comment")
    existing = Comment.objects.filter(github_comment_id=comment_id).first()
    updated_at = _when(comment.get("updated_at"))
    if action == "deleted":
        if existing is None:
            return ignored("comment not mirrored")
        existing.delete()
        _comment_noted(proposal, payload, "deleted a comment", "")
        return applied(f"comment {comment_id} removed")
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
            return applied("comment updated (its commands are not run again)")
        return ignored("comment already stored")
    if action not in {"created", "edited"} or not body.strip():
        return ignored(f"issue_comment.{action} needs nothing here")
    user_data = comment.get("user") or {}
    login = github_login(user_data)
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
        return ignored("comment already stored")
    if action == "edited":
        return applied("comment stored (an edit does not run commands)")
    answers = commands_answer(
        proposal_id=proposal.pk, user=author, login=login, github_comment_id=comment_id, body=body
    )
    return applied(f"comment stored; {len(answers)} command(s) answered")


def _comment_noted(proposal: Proposal, payload: dict[str, Any], verb: str, message: str) -> None:
    """A comment edited or deleted on GitHub, on the proposal's timeline."""
    sender = payload.get("sender") or {}
    services.event_record(
        proposal=proposal,
        actor=None,
        actor_label=f"@{github_login(sender)}",
        verb=verb,
        door=Door.GITHUB,
        message=message,
    )
