"""Writes for proposals: create, edit, the state transitions, reviews, comments, outcomes.

Every door (web form, API, GitHub slash command) calls these functions, so the rules, the
permission checks and the timeline are the same whichever way a change arrives.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from marin_site.doors import Door
from marin_site.errors import DomainError
from marin_site.events import Verb, verb_label
from marin_site.roles import permission_require
from proposals import permissions as perms
from proposals.actions import TRANSITIONS, action_require
from proposals.follows import notice_add
from proposals.github.outbox.enqueue import (
    outbox_outcome_comment,
    outbox_proposal_changed,
    outbox_review_comment,
    outbox_site_comment,
)
from proposals.models import (
    Amendment,
    Comment,
    Event,
    Label,
    Outcome,
    Proposal,
    Review,
    State,
)
from runs import selectors as run_selectors
from runs.models import DryRun, DryRunState
from runs.services.dry_runs import dry_run_start
from runs.services.plans import plan_build, plan_cancel, plan_freeze, plan_launch
from runs.specs.ablation import Plan as PlanPreview
from runs.verdicts.base import Refusal
from runs.verdicts.rules import preregistered_rule

Actor = User | AnonymousUser

# After approval the plan is frozen: only these fields may still change (as amendments).
AMENDABLE_FIELDS = {
    "description",
    "hypothesis",
    "success_metric",
    "success_direction",
    "success_threshold",
    "verdict_rule",
    "pr_url",
    "branch",
    "wandb_url",
    "data_browser_url",
    "labels",
    "summary",
    # Read from a GitHub issue (proposals/github/): results and links arrive after approval.
    "results",
    "experiment_json_url",
}
PREREGISTERED_FIELDS = (
    "hypothesis",
    "success_metric",
    "success_direction",
    "success_threshold",
    "verdict_rule",
)
PROPOSAL_FIELDS = (
    "title",
    "summary",
    "description",
    "hypothesis",
    "success_metric",
    "success_direction",
    "success_threshold",
    "verdict_rule",
    "recipe",
    "baseline",
    "ablation_spec",
    "budget_accelerator_hours",
    "pr_url",
    "branch",
    "wandb_url",
    "data_browser_url",
    # Read from a GitHub issue (proposals/github/body.py).
    "results",
    "submitter_name",
    "submitter_affiliation",
    "submitter_link",
    "experiment_json_url",
)


def _amended_text(value: Any) -> str:
    """A preregistered value as an amendment records it (a rule as its canonical JSON)."""
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _user(actor: Actor | None) -> User | None:
    return actor if isinstance(actor, User) and actor.is_authenticated else None


def event_record(
    *,
    proposal: Proposal,
    actor: Actor | None,
    verb: Verb,
    door: str,
    from_state: str = "",
    to_state: str = "",
    message: str = "",
    actor_label: str = "",
) -> Event:
    user = _user(actor)
    event = Event.build(
        proposal=proposal,
        actor=user,
        actor_label=actor_label or (user.get_username() if user else ""),
        verb=verb,
        from_state=from_state,
        to_state=to_state,
        message=message,
        door=door,
    )
    event.save(force_insert=True)
    return event


def excerpt(text: str, limit: int = 280) -> str:
    """The start of a text for a timeline row (a comment's first words)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def proposal_plan(*, proposal: Proposal) -> PlanPreview:
    """The plan approval would launch, computed from the proposal as it stands."""
    return plan_build(
        recipe=proposal.recipe,
        baseline=proposal.baseline or {},
        spec_text=proposal.ablation_spec,
        budget_accelerator_hours=proposal.budget_accelerator_hours,
    )


def _clean(proposal: Proposal) -> None:
    """Model-level field validation and the plan (recipe, baseline, spec) together."""
    errors: dict[str, list[str]] = {}
    try:
        proposal.full_clean(exclude=["author", "plan"])
    except ValidationError as exc:
        errors.update(exc.message_dict)
    if proposal.verdict_rule is not None and "recipe" not in errors and proposal.recipe_id:
        try:
            proposal.verdict_rule = preregistered_rule(
                spec=proposal.verdict_rule, declared=proposal.recipe.verdict_rules
            )
        except Refusal as refusal:
            errors.setdefault("verdict_rule", []).append(str(refusal))
    if "recipe" not in errors and proposal.recipe_id is not None:
        if not proposal.recipe.is_active and not proposal.is_frozen:
            errors.setdefault("recipe", []).append(f"recipe {proposal.recipe} is retired")
        try:
            proposal_plan(proposal=proposal)
        except ValidationError as exc:
            for field, messages in exc.message_dict.items():
                errors.setdefault(field, []).extend(messages)
    if errors:
        raise ValidationError(errors)


def _labels(names: Iterable[str]) -> list[Label]:
    wanted = sorted({name.strip().lower() for name in names if name.strip()})
    if len(wanted) > 20:
        raise ValidationError({"labels": ["at most 20 labels"]})
    labels = []
    for name in wanted:
        label = Label(name=name)
        try:
            label.full_clean(validate_unique=False)
        except ValidationError as exc:
            raise ValidationError({"labels": [f"'{name}': {m}" for m in exc.messages]}) from exc
        labels.append(Label.objects.get_or_create(name=name)[0])
    return labels


@transaction.atomic
def proposal_create(
    *,
    author: Actor,
    data: dict[str, Any],
    labels: Iterable[str] = (),
    submit: bool = False,
    door: str = Door.WEB,
) -> Proposal:
    """Create a draft (and submit it at once when ``submit``). Nothing is stored on error."""
    permission_require(author, perms.ADD, None, "propose an experiment")
    proposal = Proposal(
        author=_user(author), **{k: v for k, v in data.items() if k in PROPOSAL_FIELDS}
    )
    _clean(proposal)
    label_rows = _labels(labels)
    proposal.save()
    proposal.labels.set(label_rows)
    event_record(
        proposal=proposal, actor=author, verb=Verb.CREATED, door=door, to_state=State.DRAFT
    )
    outbox_proposal_changed(proposal=proposal)  # GitHub sync: after-commit writes
    if submit:
        proposal_transition(proposal_id=proposal.pk, action="submit", actor=author, door=door)
        proposal.refresh_from_db()
    return proposal


@transaction.atomic
def proposal_update(
    *,
    proposal_id: int,
    actor: Actor,
    data: dict[str, Any],
    labels: Iterable[str] | None = None,
    door: str = Door.WEB,
) -> Proposal:
    """Edit a proposal; after approval only amendable fields change, as dated amendments."""
    proposal = Proposal.objects.select_for_update().get(pk=proposal_id)
    action_require(proposal=proposal, actor=actor, name="edit")
    changes = {k: v for k, v in data.items() if k in PROPOSAL_FIELDS and getattr(proposal, k) != v}
    if proposal.state == State.APPROVED:
        locked = sorted(set(changes) - AMENDABLE_FIELDS)
        if locked:
            raise DomainError(
                f"The plan is frozen at approval; these fields can no longer change: "
                f"{', '.join(locked)}."
            )
    old = {field: getattr(proposal, field) for field in changes}
    for field, value in changes.items():
        setattr(proposal, field, value)
    _clean(proposal)
    label_names: list[str] = []
    if labels is not None:
        label_rows = _labels(labels)
        label_names = [label.name for label in label_rows]
        current = sorted(proposal.labels.values_list("name", flat=True))
        if current != label_names:
            proposal.labels.set(label_rows)
            changes["labels"] = label_names
    if not changes:
        return proposal
    proposal.save(update_fields=[f for f in changes if f != "labels"] + ["updated_at"])
    if proposal.state == State.APPROVED:
        for field in PREREGISTERED_FIELDS:
            if field in changes:
                Amendment.objects.create(
                    proposal=proposal,
                    field=field,
                    old_value=_amended_text(old[field]),
                    new_value=_amended_text(getattr(proposal, field)),
                    author=_user(actor),
                )
    event_record(
        proposal=proposal,
        actor=actor,
        verb=Verb.AMENDED if proposal.state == State.APPROVED else Verb.EDITED,
        door=door,
        message="Changed " + ", ".join(sorted(changes)),
    )
    outbox_proposal_changed(proposal=proposal)  # GitHub sync: after-commit writes
    return proposal


def _submission_problems(proposal: Proposal) -> list[str]:
    problems = []
    if not proposal.hypothesis.strip():
        problems.append("the hypothesis is empty")
    if not proposal.success_metric:
        problems.append("the success criteria name no metric")
    if proposal.success_threshold is None:
        problems.append("the success criteria have no threshold")
    if not proposal.summary.strip():
        problems.append("the one-line summary is empty")
    return problems


@transaction.atomic
def proposal_transition(
    *,
    proposal_id: int,
    action: str,
    actor: Actor | None,
    door: str = Door.WEB,
    reason: str = "",
    git_ref: str = "",
    executor: str = "",
    dry_run_override: str = "",
    actor_label: str = "",
) -> Proposal:
    """The one way a proposal changes state: lock, check, change, record.

    Does nothing when the proposal is already in the target state; refuses a source state
    the action does not start from (naming the allowed ones) and an actor without the
    action's permission. Approving launches the plan on ``executor`` when given (one the
    recipe may go to: ``runs.services.plans.plan_launch`` checks it), else the recipe's.
    """
    transition = TRANSITIONS.get(action)
    if transition is None:
        raise DomainError(f"Unknown action '{action}'; known: {', '.join(TRANSITIONS)}.")
    proposal = Proposal.objects.select_for_update().select_related("recipe").get(pk=proposal_id)
    if not action_require(proposal=proposal, actor=actor, name=action):
        return proposal  # already in the target state
    reason = reason.strip()
    if transition.needs_reason and not reason:
        raise ValidationError({"reason": [f"A reason is required to {action.replace('_', ' ')}."]})
    if len(reason) > 10_000:
        raise ValidationError({"reason": ["A reason is at most 10,000 characters."]})

    now = timezone.now()
    update_fields = ["state", "state_reason", "updated_at"]
    if action == "submit":
        problems = _submission_problems(proposal)
        if problems:
            raise ValidationError({"__all__": ["Cannot submit yet: " + "; ".join(problems) + "."]})
        proposal_plan(proposal=proposal)  # raises with field errors if the plan is invalid
        proposal.submitted_at = now
        update_fields.append("submitted_at")
    elif action == "approve":
        _dry_run_gate(proposal=proposal, actor=actor, door=door, reason=dry_run_override)
        proposal.plan = plan_freeze(
            recipe=proposal.recipe,
            baseline=proposal.baseline or {},
            spec_text=proposal.ablation_spec,
            budget_accelerator_hours=proposal.budget_accelerator_hours,
        )
        proposal.approved_hypothesis = proposal.hypothesis
        proposal.approved_criteria = proposal.criteria
        proposal.git_ref = git_ref.strip()[:255] or proposal.git_ref
        update_fields += ["plan", "approved_hypothesis", "approved_criteria", "git_ref"]
        # The launch row commits with the approval (its expansion is nudged after commit),
        # so an approved plan is never left without one.
        plan_launch(
            plan_id=proposal.plan.pk,
            criteria=dict(proposal.criteria),
            git_ref=proposal.git_ref,
            executor=executor.strip(),
            actor=actor if isinstance(actor, User | AnonymousUser) else None,
        )
    elif action in {"cancel", "withdraw"} and proposal.plan_id is not None:
        # Set-based and in this transaction: the proposal and its plan stop together.
        plan_cancel(plan_id=proposal.plan_id, actor=actor, door=door)
    if action in {"approve", "reject"}:
        proposal.decided_at = now
        update_fields.append("decided_at")

    source = proposal.state
    proposal.state = transition.target
    proposal.state_reason = reason
    proposal.save(update_fields=update_fields)
    event = event_record(
        proposal=proposal,
        actor=actor,
        verb=transition.verb,
        door=door,
        from_state=source,
        to_state=transition.target,
        message=reason,
        actor_label=actor_label,
    )
    outbox_proposal_changed(proposal=proposal)  # GitHub sync: after-commit writes
    notice_add(
        proposal=proposal,
        key=f"state:{proposal.pk}:{event.pk}",
        subject=f"{verb_label(transition.verb)} ({proposal.get_state_display()})",
        body=f"The proposal is now {proposal.get_state_display().lower()} "
        f"({source} -> {transition.target})." + (f"\n\n{reason}" if reason else ""),
    )
    return proposal


def dry_run_subject(proposal: Proposal) -> str:
    return f"proposal-{proposal.pk}"


def proposal_dry_run(*, proposal_id: int, actor: Actor | None, door: str = Door.WEB) -> DryRun:
    """Start the recipe script's dry run of the plan approval would launch (its baseline
    run's config), as a CPU job: a maintainer's action, or the author's when the recipe runs
    on a pool that allows it (the ``dry_run`` action: ``proposals.permissions.DRY_RUN``)."""
    proposal = Proposal.objects.select_related("recipe").get(pk=proposal_id)
    action_require(proposal=proposal, actor=actor, name="dry_run")
    plan = proposal_plan(proposal=proposal)
    config = plan.points[0].config if plan.points else dict(proposal.recipe.default_config)
    with transaction.atomic():
        dry_run = dry_run_start(
            recipe=proposal.recipe, config=config, subject=dry_run_subject(proposal), actor=actor
        )
        event_record(
            proposal=proposal,
            actor=actor,
            verb=Verb.DRY_RUN_STARTED,
            door=door,
            message=f"dry run {dry_run.pk}: {dry_run.command}"[:2000],
        )
    return dry_run


def _dry_run_gate(*, proposal: Proposal, actor: Actor | None, door: str, reason: str) -> None:
    """A failed latest dry run blocks approval unless a maintainer overrides it with a
    reason, recorded on the timeline."""
    latest = DryRun.objects.filter(subject=dry_run_subject(proposal)).order_by("-pk").first()
    if latest is None or latest.state != DryRunState.FAILED:
        return
    reason = reason.strip()
    if not reason:
        raise ValidationError(
            {
                "dry_run_override": [
                    f"The latest dry run ({latest.pk}) failed: {latest.reason or 'see its output'}. "
                    "Approve over it only with a reason (dry_run_override)."
                ]
            }
        )
    if len(reason) > 2000:
        raise ValidationError({"dry_run_override": ["A reason is at most 2,000 characters."]})
    event_record(
        proposal=proposal,
        actor=actor,
        verb=Verb.DRY_RUN_OVERRIDDEN,
        door=door,
        message=f"dry run {latest.pk} failed; approved over it: {reason}",
    )


def proposal_plans_reconcile() -> dict[str, int]:
    """Make good a plan hand-off that never happened: launch the plan of an approved
    proposal that has no launch, cancel the launched plan of a canceled or withdrawn one.

    The hand-off commits with the transition, so this finds rows older than that rule, or
    left by a bug; the run reconciler calls it on every pass (``runs.signals.reconcile_pass``).
    Each proposal is locked and looked at again, so a transition in flight is never undone.
    """
    unlaunched = Proposal.objects.filter(
        state=State.APPROVED, plan__isnull=False, plan__launch__isnull=True
    )
    uncanceled = Proposal.objects.filter(
        state__in=[State.CANCELED, State.WITHDRAWN],
        plan__launch__isnull=False,
        plan__launch__canceled_at__isnull=True,
    )
    done = {"launched": 0, "canceled": 0}
    for proposal_id in list(unlaunched.values_list("pk", flat=True)[:500]):
        with transaction.atomic():
            proposal = unlaunched.select_for_update(of=("self",)).filter(pk=proposal_id).first()
            if proposal is not None and proposal.plan_id is not None:
                criteria = proposal.approved_criteria or proposal.criteria
                plan_launch(
                    plan_id=proposal.plan_id, criteria=dict(criteria), git_ref=proposal.git_ref
                )
                done["launched"] += 1
    for proposal_id in list(uncanceled.values_list("pk", flat=True)[:500]):
        with transaction.atomic():
            proposal = uncanceled.select_for_update(of=("self",)).filter(pk=proposal_id).first()
            if proposal is not None and proposal.plan_id is not None:
                plan_cancel(plan_id=proposal.plan_id, door=Door.WORKER)
                outbox_proposal_changed(proposal=proposal)  # the runs' progress
                done["canceled"] += 1
    return done


def proposal_plan_owners(*, plan_id: int, **_signal: Any) -> list[int]:
    """Who answers for a plan (``runs.signals.plan_owners``): the author of the approved
    proposal it came from, who may claim its queued runs to execute elsewhere."""
    return list(
        Proposal.objects.filter(plan_id=plan_id, state=State.APPROVED).values_list(
            "author_id", flat=True
        )
    )


@transaction.atomic
def review_submit(
    *,
    proposal_id: int,
    reviewer: Actor,
    score: int,
    recommendation: str,
    text: str,
    door: str = Door.WEB,
) -> Review:
    """Add or update the reviewer's review; never on one's own proposal."""
    proposal = Proposal.objects.select_for_update().get(pk=proposal_id)
    action_require(proposal=proposal, actor=reviewer, name="review")
    user = _user(reviewer)
    review = Review.objects.filter(proposal=proposal, reviewer=user).first() or Review(
        proposal=proposal, reviewer=user
    )
    created = review.pk is None
    review.score, review.recommendation, review.text = score, recommendation, text
    review.full_clean()
    review.save()
    event_record(
        proposal=proposal,
        actor=reviewer,
        verb=Verb.REVIEWED if created else Verb.REVIEW_UPDATED,
        door=door,
        message=f"score {score}/5, recommends {review.get_recommendation_display().lower()}",
    )
    outbox_review_comment(review=review)  # GitHub sync: mirrored on the issue
    return review


@transaction.atomic
def comment_create(*, proposal_id: int, author: Actor, body: str, door: str = Door.WEB) -> Comment:
    proposal = Proposal.objects.get(pk=proposal_id)
    action_require(proposal=proposal, actor=author, name="comment")
    comment = Comment(proposal=proposal, author=_user(author), body=body)
    comment.author_label = author.get_username() if comment.author else ""
    comment.full_clean()
    if not body.strip():
        raise ValidationError({"body": ["A comment cannot be empty."]})
    comment.save()
    event_record(
        proposal=proposal, actor=author, verb=Verb.COMMENTED, door=door, message=excerpt(body)
    )
    if door != Door.GITHUB:  # GitHub sync: mirror site comments onto the issue
        outbox_site_comment(comment=comment)
    return comment


@transaction.atomic
def proposal_record_outcome(
    *,
    proposal_id: int,
    actor: Actor,
    outcome: str,
    conclusion: str,
    confidence: str,
    door: str = Door.WEB,
    without_results_reason: str = "",
    results: str | None = None,
    wandb_url: str | None = None,
    data_browser_url: str | None = None,
) -> Proposal:
    """Record the scientific verdict, kept apart from the state; an event marks each change.

    A verdict waits for the results: while any run of the proposal's plan is not terminal,
    it is refused unless recorded explicitly without results, with a reason (kept on the
    timeline). An imported old issue has no plan and needs no approval: its verdict is
    recorded as found, with its key figures (``results``) and links when given (None keeps
    what is stored)."""
    proposal = Proposal.objects.select_for_update().get(pk=proposal_id)
    action_require(proposal=proposal, actor=actor, name="record_outcome")
    if outcome not in Outcome.values:
        raise ValidationError({"outcome": [f"must be one of {', '.join(Outcome.values)}"]})
    reason = without_results_reason.strip()
    pending = (
        run_selectors.plan_results_pending(plan_id=proposal.plan_id) if proposal.plan_id else ""
    )
    if pending and not reason:
        raise ValidationError(
            {
                "without_results_reason": [
                    f"The results are not in ({pending}): record the outcome once every run "
                    "has ended, or record it without results and give a reason."
                ]
            }
        )
    previous = proposal.outcome
    extras = {
        key: value.strip()
        for key, value in (
            ("results", results),
            ("wandb_url", wandb_url),
            ("data_browser_url", data_browser_url),
        )
        if value is not None
    }
    if (previous, proposal.conclusion, proposal.confidence) == (
        outcome,
        conclusion,
        confidence,
    ) and all(getattr(proposal, key) == value for key, value in extras.items()):
        return proposal
    proposal.outcome, proposal.conclusion, proposal.confidence = outcome, conclusion, confidence
    for key, value in extras.items():
        setattr(proposal, key, value)
    proposal.concluded_at = timezone.now()
    proposal.full_clean(exclude=["author", "plan", "recipe"])
    proposal.save(
        update_fields=[
            "outcome",
            "conclusion",
            "confidence",
            "concluded_at",
            "updated_at",
            *extras,
        ]
    )
    event_record(
        proposal=proposal,
        actor=actor,
        verb=Verb.OUTCOME_RECORDED,
        door=door,
        from_state=previous,
        to_state=outcome,
        message=(
            f"Recorded without results ({pending}): {reason[:1000]}\n\n{conclusion[:500]}"
            if pending
            else conclusion[:500]
        ),
    )
    outbox_proposal_changed(proposal=proposal)  # GitHub sync: after-commit writes
    outbox_outcome_comment(proposal=proposal)
    verdict = f"{outcome}|{confidence}|{conclusion}"
    notice_add(
        proposal=proposal,
        key=f"outcome:{proposal.pk}:{hashlib.sha256(verdict.encode()).hexdigest()[:16]}",
        subject=f"outcome recorded: {proposal.get_outcome_display()}",
        body=f"Outcome: {proposal.get_outcome_display()}"
        + (f" ({proposal.get_confidence_display()})" if confidence else "")
        + (f"\n\n{conclusion.strip()}" if conclusion.strip() else ""),
    )
    return proposal


@transaction.atomic
def proposal_outcome_found(
    *,
    proposal_id: int,
    actor: Actor | None,
    actor_label: str,
    outcome: str,
    conclusion: str,
    results: str,
    door: str,
) -> bool:
    """An imported proposal's verdict as an editorial source found it (the outcome digest:
    ``proposals/importers.py``, whose doors ask the import permission). Outside the review
    lifecycle, so no plan and no GitHub write; False when it would change nothing."""
    proposal = Proposal.objects.select_for_update().get(pk=proposal_id)
    if proposal.state != State.IMPORTED:
        raise DomainError(f"Proposal {proposal_id} is not an imported issue.")
    if outcome not in Outcome.values:
        raise ValidationError({"outcome": [f"must be one of {', '.join(Outcome.values)}"]})
    if (proposal.outcome, proposal.conclusion, proposal.results) == (outcome, conclusion, results):
        return False
    previous = proposal.outcome
    proposal.outcome, proposal.conclusion, proposal.results = outcome, conclusion, results
    proposal.concluded_at = timezone.now()
    proposal.full_clean(exclude=["author", "plan", "recipe"])
    proposal.save(update_fields=["outcome", "conclusion", "results", "concluded_at", "updated_at"])
    event_record(
        proposal=proposal,
        actor=actor,
        actor_label=actor_label,
        verb=Verb.OUTCOME_RECORDED,
        door=door,
        from_state=previous,
        to_state=outcome,
        message=conclusion[:500],
    )
    return True


@transaction.atomic
def proposal_hold(
    *, proposal_id: int, actor: Actor, hold: bool, door: str = Door.WEB, reason: str = ""
) -> Proposal:
    """Set or clear a maintainer's hold: not a state, a flag that blocks approval while set."""
    proposal = Proposal.objects.select_for_update().get(pk=proposal_id)
    if not action_require(proposal=proposal, actor=actor, name="hold" if hold else "unhold"):
        return proposal
    proposal.on_hold = hold
    proposal.save(update_fields=["on_hold", "updated_at"])
    event_record(
        proposal=proposal,
        actor=actor,
        verb=Verb.HELD if hold else Verb.UNHELD,
        door=door,
        message=reason[:10_000],
    )
    outbox_proposal_changed(proposal=proposal)
    return proposal
