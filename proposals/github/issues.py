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
from marin_site.events import Verb
from proposals import services
from proposals.actions import action_refusal
from proposals.github.accounts import github_account, github_login
from proposals.github.body import is_experiment, issue_fields
from proposals.github.commands import commands_answer
from proposals.github.outbox.enqueue import outbox_comment_enqueue, outbox_proposal_changed
from proposals.github.outbox.render import HOLD_LABEL, STATE_LABEL_PREFIX, is_own_text
from proposals.models import (
    MAX_MARKDOWN,
    Comment,
    Label,
    PendingIssue,
    Proposal,
    State,
    WebhookDelivery,
)
from runs.models import Recipe
from runs.specs.ablation import PlanError, parse_overrides

URL_FIELDS = ("wandb_url", "data_browser_url", "experiment_json_url")
LABEL_OK = re.compile(r"^[a-z0-9][a-z0-9:._-]{0,49}$")
Result = tuple[str, str]  # (outcome, detail)


def ignored(detail: str) -> Result:
    return WebhookDelivery.Outcome.IGNORED, detail


def applied(detail: str) -> Result:
    return WebhookDelivery.Outcome.APPLIED, detail


def _when(value: Any) -> datetime | None:
    return parse_datetime(value) if isinstance(value, str) else None


class RecipeMissing(DomainError):
    """The issue names a recipe the site does not have, or the site has none yet: the issue
    is kept (``PendingIssue``) and imported when a recipe appears, not refused for good."""


def _issue_recipe(named: str = "") -> Recipe | None:
    """The recipe the issue names (``name`` or ``name@version``), else GITHUB_ISSUE_RECIPE,
    else the first active recipe by name; None when there is no such recipe."""
    name = named or settings.GITHUB_ISSUE_RECIPE
    recipes = Recipe.objects.filter(is_active=True)
    if name:
        name, _, version = name.strip().partition("@")
        recipes = recipes.filter(name=name.strip(), **({"version": version} if version else {}))
    return recipes.order_by("name", "-id").first()


def _recipe_named(named: str) -> Recipe:
    recipe = _issue_recipe(named)
    if recipe is None:
        raise RecipeMissing(
            f"The site has no recipe '{named[:100]}' yet."
            if named
            else "The site has no active recipe yet."
        )
    return recipe


def _safe_data(data: dict[str, Any]) -> dict[str, Any]:
    """Drop what the model would refuse (a malformed or overlong URL), trim any other text
    to its column, so one odd section never costs the issue its other fields."""
    clean: dict[str, Any] = {}
    validate = URLValidator(schemes=["http", "https"])
    for key, value in data.items():
        if not isinstance(value, str):
            clean[key] = value
            continue
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


# What the issue's sections may set that the plan checks: dropped (and named) when invalid.
PLAN_FIELDS = ("baseline", "ablation_spec", "success_metric", "success_threshold")


def model_data(sections: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Sections as read from an issue -> proposal fields (the baseline's YAML as a mapping;
    the recipe is the caller's), and the problems of what could not be read."""
    data = {k: v for k, v in sections.items() if k != "recipe"}
    problems = []
    if "baseline" in data:
        try:
            data["baseline"] = parse_overrides(str(data["baseline"]))
        except PlanError as exc:
            problems += [f"the baseline: {m}" for m in exc.errors.get("baseline", [])] or [
                "the baseline is not a YAML mapping"
            ]
            del data["baseline"]
    return data, problems


def _validation_retry(
    write: Any, data: dict[str, Any], problems: list[str]
) -> tuple[Any, dict[str, Any]]:
    """Call ``write(data)``; when the plan's fields are refused, name why in ``problems``
    and write the rest without them (once), so an invalid spec never loses the issue."""
    try:
        return write(data), data
    except ValidationError as exc:
        errors = exc.message_dict if hasattr(exc, "error_dict") else {"__all__": exc.messages}
        bad = {key for key in errors if key in PLAN_FIELDS or key == "success_direction"}
        if not bad:
            raise
        for key in sorted(bad):
            problems += [f"{key.replace('_', ' ')}: {message}" for message in errors[key]]
        kept = {k: v for k, v in data.items() if k not in bad}
        return write(kept), kept


def issue_labels(issue: dict[str, Any]) -> list[str]:
    return [str(label.get("name", "")) for label in issue.get("labels") or []]


def proposal_from_issue(*, issue: dict[str, Any]) -> Proposal:
    """An experiment issue opened on GitHub becomes a proposal linked to it.

    Raises RecipeMissing when the recipe it names (or any recipe) does not exist yet; the
    caller keeps the issue for later (``issue_keep``)."""
    user_data = issue.get("user") or {}
    fields = issue_fields(title=issue.get("title") or "Untitled", body=issue.get("body"))
    sections = _safe_data(fields.data)
    recipe = _recipe_named(str(sections.get("recipe") or ""))
    author = github_account(login=github_login(user_data), github_id=user_data.get("id"))
    data, problems = model_data(sections)
    labels = [n.lower() for n in issue_labels(issue) if LABEL_OK.match(n.lower())][:20]
    with transaction.atomic():
        proposal, _ = _validation_retry(
            lambda values: services.proposal_create(
                author=author, data={**values, "recipe": recipe}, labels=labels, door=Door.GITHUB
            ),
            data,
            problems,
        )
        Proposal.objects.filter(pk=proposal.pk).update(
            github_issue_number=issue["number"],
            github_issue_node_id=issue.get("node_id") or "",
            github_updated_at=_when(issue.get("updated_at")),
            github_sections=sections,
        )
        PendingIssue.objects.filter(number=issue["number"]).delete()
        proposal.refresh_from_db()
        services.event_record(
            proposal=proposal,
            actor=author,
            verb=Verb.LINKED,
            door=Door.GITHUB,
            message=f"From GitHub issue #{issue['number']}.",
        )
        problems = list(fields.missing) + problems
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
                    + "\n\nEdit the issue, or comment `/spec` with the ablation spec in a "
                    "fenced YAML block, to complete it."
                ),
            )
    return proposal


def issue_keep(*, issue: dict[str, Any], reason: str) -> Result:
    """Keep an issue that cannot become a proposal yet, with its newest payload."""
    updated_at = _when(issue.get("updated_at"))
    kept = PendingIssue.objects.filter(number=issue["number"]).first()
    if kept is None:
        PendingIssue.objects.create(number=issue["number"], issue=issue, reason=reason)
    else:
        before = _when(kept.issue.get("updated_at"))
        if before is None or updated_at is None or updated_at >= before:
            kept.issue = issue
        kept.reason = reason
        kept.save(update_fields=["issue", "reason", "updated_at"])
    return applied(f"kept until it can be imported: {reason}")


def pending_issues_import() -> dict[str, int]:
    """Import the kept issues a recipe now exists for (a recipe was created or loaded, or
    the reconciler's pass): each in its own savepoint; those still waiting stay."""
    done = {"imported": 0, "waiting": 0}
    for number in list(PendingIssue.objects.values_list("number", flat=True)[:200]):
        with transaction.atomic():
            kept = PendingIssue.objects.select_for_update(skip_locked=True).filter(number=number)
            row = kept.first()
            if row is None:
                continue
            if linked_proposal(number) is not None:
                row.delete()
                continue
            try:
                with transaction.atomic():
                    proposal_from_issue(issue=row.issue)
            except RecipeMissing as exc:
                row.reason = exc.message
                row.save(update_fields=["reason", "updated_at"])
                done["waiting"] += 1
                continue
            except (DomainError, ValidationError) as exc:
                row.reason = (
                    exc.message if isinstance(exc, DomainError) else "; ".join(exc.messages)
                )
                row.save(update_fields=["reason", "updated_at"])
                done["waiting"] += 1
                continue
            done["imported"] += 1
    return done


def proposal_apply_issue_edit(
    *, proposal: Proposal, issue: dict[str, Any], sender: dict[str, Any]
) -> Result:
    """Apply an issue edit by the written rule (README, "GitHub sync").

    Only issues opened on GitHub are read back. A delivery older than the last one applied
    changes nothing. A field changes only when its value as read from the issue changed
    since the last edit applied, so an unchanged section never undoes a site edit, and a
    removed section never blanks a field. The editor must be allowed to edit the proposal
    (``allowed_actions``' "edit"), and after approval only amendable fields change.

    An edit that touches the ablation spec is answered with a comment: what it did, or why
    not. A draft that the edit completes is submitted, if the editor may submit it.
    """
    updated_at = _when(issue.get("updated_at"))
    if proposal.github_updated_at and updated_at and updated_at <= proposal.github_updated_at:
        return ignored("an older edit than the one already applied")
    if not proposal.github_sections:
        return ignored("the site wrote this issue; edits on GitHub are discussion")
    sections = _safe_data(issue_fields(title=issue.get("title") or "", body=issue.get("body")).data)
    changed = {k: v for k, v in sections.items() if proposal.github_sections.get(k) != v}
    Proposal.objects.filter(pk=proposal.pk).update(
        github_updated_at=updated_at, github_sections={**proposal.github_sections, **sections}
    )
    if not changed:
        return ignored("nothing changed outside the site's block")
    login = github_login(sender)
    editor = github_account(login=login, github_id=sender.get("id"))
    changes, problems = model_data(changed)
    if "recipe" in changed:
        try:
            changes["recipe"] = _recipe_named(str(changed["recipe"] or ""))
        except RecipeMissing as exc:
            problems.append(exc.message)
    if proposal.state == State.APPROVED:
        locked = sorted(k for k in changes if k not in services.AMENDABLE_FIELDS)
        if locked:
            problems.append(
                "the plan is frozen at approval; these can no longer change: " + ", ".join(locked)
            )
        changes = {k: v for k, v in changes.items() if k in services.AMENDABLE_FIELDS}
    spec_touched = "ablation_spec" in changed
    refusal = action_refusal(proposal=proposal, actor=editor, name="edit")
    if refusal is not None:
        if spec_touched:
            _answer(
                proposal,
                f"edit:{proposal.pk}:{issue.get('updated_at')}",
                (
                    f"Sorry @{login}, the ablation spec in your edit was not applied: "
                    f"{refusal.message}"
                ),
            )
        return ignored(f"refused: {refusal.message}")
    kept: dict[str, Any] = {}
    if changes:
        _, kept = _validation_retry(
            lambda values: services.proposal_update(
                proposal_id=proposal.pk, actor=editor, data=values, door=Door.GITHUB
            ),
            changes,
            problems,
        )
    proposal = _submit_if_complete(proposal.pk, editor, problems)
    if spec_touched:
        _answer(
            proposal,
            f"edit:{proposal.pk}:{issue.get('updated_at')}",
            _spec_answer(proposal, login, "ablation_spec" in kept, problems),
        )
    if not kept:
        return ignored("nothing applied: " + "; ".join(problems))
    return applied("updated " + ", ".join(sorted(kept)))


def _answer(proposal: Proposal, key: str, body: str) -> None:
    outbox_comment_enqueue(proposal=proposal, key=key, body=body)


def _spec_answer(proposal: Proposal, login: str, applied_spec: bool, problems: list[str]) -> str:
    """What a spec change from GitHub did: the plan it makes, what is still missing."""
    if not applied_spec:
        return f"Sorry @{login}, the ablation spec was not applied: " + "; ".join(
            problems or ["it did not change"]
        )
    text = f"@{login} the ablation spec is set"
    try:
        plan = services.proposal_plan(proposal=proposal)
        text += f": {plan.run_count} runs, {plan.total_accelerator_hours:.1f} accelerator-hours"
    except ValidationError:
        pass
    text += f"; the proposal is {proposal.get_state_display().lower()}."
    if problems:
        text += "\n\nNot applied:\n\n" + "\n".join(f"- {p}" for p in problems)
    return text


def _submit_if_complete(proposal_id: int, actor: Any, problems: list[str]) -> Proposal:
    """Submit an issue's draft once it is complete, if ``actor`` may; else say what is missing."""
    proposal = Proposal.objects.get(pk=proposal_id)
    if proposal.state != State.DRAFT or not proposal.github_sections:
        return proposal
    if action_refusal(proposal=proposal, actor=actor, name="submit") is not None:
        return proposal
    try:
        with transaction.atomic():
            return services.proposal_transition(
                proposal_id=proposal_id, action="submit", actor=actor, door=Door.GITHUB
            )
    except ValidationError as exc:
        problems += exc.messages
    return proposal


def _label_event_apply(
    action: str, proposal: Proposal, label: dict[str, Any], sender: dict[str, Any]
) -> Result:
    """A label put on or taken off the issue sets the site's labels, for labels the site
    knows (its state labels, the hold and the experiment labels are the site's own)."""
    name = str(label.get("name") or "").strip().lower()
    if (
        not name
        or name.startswith(STATE_LABEL_PREFIX)
        or name == HOLD_LABEL
        or is_experiment([name])
    ):
        return ignored(f"label '{name[:50]}' is not one of the proposal's labels")
    if not Label.objects.filter(name=name).exists():
        return ignored(f"label '{name[:50]}' is not a label the site knows")
    current = set(proposal.labels.values_list("name", flat=True))
    wanted = current | {name} if action == "labeled" else current - {name}
    if wanted == current:
        return ignored(f"label '{name}' already {'on' if action == 'labeled' else 'off'}")
    editor = github_account(login=github_login(sender), github_id=sender.get("id"))
    services.proposal_update(
        proposal_id=proposal.pk, actor=editor, data={}, labels=sorted(wanted), door=Door.GITHUB
    )
    return applied(f"label '{name}' {'added' if action == 'labeled' else 'removed'}")


def linked_proposal(number: int) -> Proposal | None:
    """The proposal linked to issue ``number``, if any (the issue number is unique)."""
    return Proposal.objects.filter(github_issue_number=number).order_by().first()


def is_bot(user_data: Any) -> bool:
    """A bot's account (``github-actions[bot]``, the stale bot, an app): its events are
    mirrored at most, never answered and never the start of a draft."""
    if not isinstance(user_data, dict):
        return False
    login = str(user_data.get("login") or "").lower()
    return user_data.get("type") == "Bot" or login.endswith("[bot]")


def issue_event_apply(
    action: str, proposal: Proposal, issue: dict[str, Any], payload: dict[str, Any]
) -> Result:
    """An ``issues`` delivery about the issue linked to ``proposal``."""
    number = issue["number"]
    sender = payload.get("sender") or {}
    if is_bot(sender) and action in {"edited", "labeled", "unlabeled"}:
        return ignored(f"a bot's {action} ({github_login(sender)}) is not read back")
    if action == "edited":
        return proposal_apply_issue_edit(proposal=proposal, issue=issue, sender=sender)
    if action in {"labeled", "unlabeled"}:
        return _label_event_apply(action, proposal, payload.get("label") or {}, sender)
    if action in {"closed", "reopened"}:
        services.event_record(
            proposal=proposal,
            actor=None,
            actor_label=f"@{github_login(sender)}",
            verb=Verb.ISSUE_CLOSED if action == "closed" else Verb.ISSUE_REOPENED,
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
            verb=Verb.ISSUE_DELETED if action == "deleted" else Verb.ISSUE_TRANSFERRED,
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
        _comment_noted(proposal, payload, Verb.COMMENT_DELETED, "")
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
            _comment_noted(proposal, payload, Verb.COMMENT_EDITED, services.excerpt(body))
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
    if is_bot(user_data) or is_bot(payload.get("sender")):
        return applied("a bot's comment stored (its commands are not run)")
    answers = commands_answer(
        proposal_id=proposal.pk, user=author, login=login, github_comment_id=comment_id, body=body
    )
    return applied(f"comment stored; {len(answers)} command(s) answered")


def _comment_noted(proposal: Proposal, payload: dict[str, Any], verb: Verb, message: str) -> None:
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
