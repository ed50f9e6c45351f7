"""What an actor may do to a proposal in its current state: the one table every door asks.

``TRANSITIONS`` is the proposal's state machine; ``ACTIONS`` is every action on a proposal
(the transitions, editing, reviewing, commenting, recording the outcome, holding and
releasing, rerunning one of its runs), each with its permission (``proposals/permissions.py``
or ``runs/permissions.py``) and the states it starts from. ``action_refusal`` says why an
actor may not take an action now, or None; ``allowed_actions`` lists those it may.

The services refuse with exactly that refusal (``action_require``), so the doors agree by
construction: the proposal page shows a button for each allowed action, the API lists them
on the proposal (``allowed_actions``) and answers a refused one with the refusal's status
(403 permission, 409 state, 400 another rule), and a slash command answers with its message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings

from marin_site.errors import ActionForbidden, DomainError, TransitionNotAllowed
from marin_site.events import Verb
from marin_site.roles import role_names
from proposals import permissions as perms
from proposals.models import Proposal, State
from runs import permissions as run_perms

ALL_STATES = frozenset(State.values)
EDITABLE_STATES = frozenset({State.DRAFT, State.SUBMITTED, State.CHANGES_REQUESTED})


@dataclass(frozen=True)
class Transition:
    action: str
    sources: frozenset[str]
    target: str
    permission: str
    verb: Verb
    needs_reason: bool = False


TRANSITIONS: dict[str, Transition] = {
    t.action: t
    for t in (
        Transition(
            "submit",
            frozenset({State.DRAFT, State.CHANGES_REQUESTED}),
            State.SUBMITTED,
            perms.SUBMIT,
            Verb.SUBMITTED,
        ),
        Transition(
            "request_changes",
            frozenset({State.SUBMITTED}),
            State.CHANGES_REQUESTED,
            perms.REQUEST_CHANGES,
            Verb.CHANGES_REQUESTED,
            needs_reason=True,
        ),
        Transition(
            "approve", frozenset({State.SUBMITTED}), State.APPROVED, perms.APPROVE, Verb.APPROVED
        ),
        Transition(
            "reject",
            frozenset({State.SUBMITTED}),
            State.REJECTED,
            perms.REJECT,
            Verb.REJECTED,
            needs_reason=True,
        ),
        Transition(
            "withdraw",
            frozenset({State.DRAFT, State.SUBMITTED, State.CHANGES_REQUESTED, State.APPROVED}),
            State.WITHDRAWN,
            perms.WITHDRAW,
            Verb.WITHDRAWN,
        ),
        Transition(
            "cancel", frozenset({State.APPROVED}), State.CANCELED, perms.CANCEL, Verb.CANCELED
        ),
        # An imported old issue (manage.py github_backfill) joins the lifecycle as a draft;
        # from then on the site syncs it like any other (until then it writes nothing).
        Transition("adopt", frozenset({State.IMPORTED}), State.DRAFT, perms.ADOPT, Verb.ADOPTED),
    )
}


@dataclass(frozen=True)
class Action:
    """One thing an actor may do to a proposal."""

    name: str
    label: str  # the button's words
    permission: str
    states: frozenset[str]  # the states it may start from
    phrase: str  # "Cannot <phrase> from state ..."
    what: str  # "You do not have permission to <what>."
    tone: str = ""  # how its button looks: "primary", "danger" or plain
    needs_reason: bool = False

    @property
    def transition(self) -> Transition | None:
        return TRANSITIONS.get(self.name)


def _transition_action(name: str, label: str, tone: str = "") -> Action:
    transition = TRANSITIONS[name]
    phrase = name.replace("_", " ")
    return Action(
        name=name,
        label=label,
        permission=transition.permission,
        states=transition.sources,
        phrase=phrase,
        what=f"{phrase} this proposal",
        tone=tone,
        needs_reason=transition.needs_reason,
    )


ACTIONS: dict[str, Action] = {
    action.name: action
    for action in (
        _transition_action("submit", "Submit for review", "primary"),
        _transition_action("request_changes", "Request changes"),
        _transition_action("approve", "Approve", "primary"),
        _transition_action("reject", "Reject", "danger"),
        _transition_action("withdraw", "Withdraw", "danger"),
        _transition_action("cancel", "Cancel", "danger"),
        _transition_action("adopt", "Adopt on the site", "primary"),
        Action("hold", "Hold", perms.HOLD, ALL_STATES, "hold", "hold or unhold this proposal"),
        Action(
            "unhold",
            "Release the hold",
            perms.HOLD,
            ALL_STATES,
            "unhold",
            "hold or unhold this proposal",
        ),
        Action(
            "edit",
            "Edit proposal",
            perms.CHANGE,
            EDITABLE_STATES | {State.APPROVED},
            "edit",
            "edit this proposal",
        ),
        Action(
            "review",
            "Review",
            perms.REVIEW,
            frozenset({State.SUBMITTED, State.CHANGES_REQUESTED}),
            "review",
            "review this proposal",
        ),
        Action("comment", "Comment", perms.COMMENT, ALL_STATES, "comment", "comment"),
        Action(
            "record_outcome",
            "Record outcome",
            perms.RECORD_OUTCOME,
            # An imported issue's result, found before the site: no plan, no approval.
            frozenset({State.APPROVED, State.CANCELED, State.IMPORTED}),
            "record an outcome",
            "record the outcome",
        ),
        Action(
            "dry_run",
            "Start a dry run",
            perms.DRY_RUN,
            frozenset({State.SUBMITTED, State.CHANGES_REQUESTED}),
            "start a dry run",
            "start a dry run of this proposal",
        ),
        Action(
            "rerun",
            "Rerun a run",
            run_perms.RERUN_RUN,
            ALL_STATES,  # the rule: a launched plan
            "rerun a run",
            "rerun runs of this proposal",
        ),
    )
}
# The actions the proposal page offers as buttons in its actions panel, in this order.
BUTTON_ACTIONS = (*TRANSITIONS, "hold", "unhold", "dry_run")


class AlreadyDone(DomainError):
    """The action would change nothing (the proposal is already where it leads): services
    return quietly, and no door offers it."""

    status_code = 200


def action_refusal(*, proposal: Proposal, actor: Any, name: str) -> DomainError | None:
    """Why ``actor`` may not take action ``name`` on ``proposal`` now; None if it may.

    Asked in this order: the permission (ActionForbidden), whether it is already done
    (AlreadyDone), the state (TransitionNotAllowed, naming the states it starts from), then
    the action's own rule (a hold blocks approval; an author approves their own proposal only
    after PROPOSALS_APPROVAL_MIN_OTHER_REVIEWS reviews by others; a rerun needs a launched plan).
    """
    action = ACTIONS.get(name)
    if action is None:
        return DomainError(f"Unknown action '{name}'; known: {', '.join(ACTIONS)}.")
    if actor is None or not actor.has_perm(action.permission, proposal):
        return ActionForbidden(f"You do not have permission to {action.what}.")
    transition = action.transition
    if (
        (transition is not None and proposal.state == transition.target)
        or (name == "hold" and proposal.on_hold)
        or (name == "unhold" and not proposal.on_hold)
    ):
        return AlreadyDone(f"Nothing to do: the proposal is already {proposal.state}.")
    if proposal.state not in action.states:
        return TransitionNotAllowed(
            action=action.phrase, current=proposal.state, allowed=action.states
        )
    if name == "approve" and proposal.on_hold:
        return DomainError("This proposal is on hold; a maintainer must unhold it first.")
    if name == "approve" and proposal.author_id is not None and proposal.author_id == actor.pk:
        wanted = settings.PROPOSALS_APPROVAL_MIN_OTHER_REVIEWS
        others = proposal.reviews.exclude(reviewer_id=actor.pk).count() if wanted > 0 else 0
        if others < wanted:
            return DomainError(
                "You cannot approve your own proposal before "
                + (
                    "someone else has reviewed it"
                    if wanted == 1
                    else f"{wanted} other people have reviewed it"
                )
                + f" ({others} so far)."
            )
    if name == "rerun" and proposal.plan_id is None:
        return DomainError("This proposal has no launched plan, so no run to rerun.")
    return None


def action_permission_require(*, proposal: Proposal, actor: Any, name: str) -> None:
    """The permission of action ``name`` alone, asked by a door before it reads the request
    (the input policy's order): someone who may not act is told so, not what the form wants."""
    action = ACTIONS[name]
    if actor is None or not actor.has_perm(action.permission, proposal):
        raise ActionForbidden(f"You do not have permission to {action.what}.")


def action_require(*, proposal: Proposal, actor: Any, name: str) -> bool:
    """Raise the refusal of ``name``; False when it would change nothing, True to go ahead."""
    refusal = action_refusal(proposal=proposal, actor=actor, name=name)
    if isinstance(refusal, AlreadyDone):
        return False
    if refusal is not None:
        raise refusal
    return True


# What a reader may do to a proposal they did not write depends on its state, hold and plan
# and on the reader's standing alone: signed in, active, superuser, role groups (the rules of
# proposals/permissions.py ask nothing else of them). A list asking it of many rows keeps the
# answers in the process under exactly that (a deploy restarts the process).
_NOT_THEIRS: dict[tuple[Any, ...], list[str]] = {}
_NOT_THEIRS_MAX = 4096


def allowed_action_names(
    user: Any,
    *,
    pk: int,
    state: str,
    on_hold: bool,
    plan_id: int | None,
    author_id: int,
    recipe_id: int | None = None,
) -> list[str]:
    """The names of ``allowed_actions`` of the proposal with these fields (the API list keeps
    the fields of each row, not the row); for a proposal the user did not write, asked once
    per process for each state, hold, plan and reader standing."""

    def ask() -> list[str]:
        proposal = Proposal(
            pk=pk,
            state=state,
            on_hold=on_hold,
            plan_id=plan_id,
            author_id=author_id,
            # where its author may start a dry run (unknown: the rule reads it)
            **({"recipe_id": recipe_id} if recipe_id is not None else {}),
        )
        return [action.name for action in allowed_actions(proposal, user)]

    authenticated = bool(getattr(user, "is_authenticated", False))
    if authenticated and author_id == user.pk:
        return ask()  # their own: approval also counts the reviews by others
    standing = (
        authenticated,
        bool(getattr(user, "is_active", False)),
        bool(getattr(user, "is_superuser", False)),
        role_names(user),
    )
    key = (state, on_hold, plan_id is None, *standing)
    names = _NOT_THEIRS.get(key)
    if names is None:
        if len(_NOT_THEIRS) >= _NOT_THEIRS_MAX:
            _NOT_THEIRS.clear()
        names = _NOT_THEIRS[key] = ask()
    return list(names)


def allowed_action_names_forget() -> None:
    """Forget the answers kept per process (tests: every test starts with none)."""
    _NOT_THEIRS.clear()


def allowed_actions(proposal: Proposal, user: Any) -> list[Action]:
    """The actions ``user`` may take on ``proposal`` now, in the table's order.

    An action whose states do not include the proposal's is refused whoever asks, so the
    permission (the costlier question) is asked only of the others."""
    return [
        action
        for name, action in ACTIONS.items()
        if proposal.state in action.states
        and action_refusal(proposal=proposal, actor=user, name=name) is None
    ]
