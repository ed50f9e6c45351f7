"""Slash commands in issue comments, run through the same services and permissions as the site.

A command is a line that starts with ``/approve``, ``/reject REASON``, ``/request-changes
REASON``, ``/withdraw [REASON]`` (the author), ``/hold``, ``/unhold``, ``/cancel``,
``/rerun RUN``, ``/status`` or ``/spec``
(followed by the ablation spec in a fenced YAML block: the first fenced block after it).
Lines in fenced or indented code blocks and quoted lines (``>``) are not commands. Every command
gets an answer comment: what was done, or why it was refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction

from marin_site.doors import Door
from marin_site.errors import DomainError
from proposals import services
from proposals.actions import action_require
from proposals.github.body import FENCE, normalise
from proposals.github.outbox.enqueue import outbox_comment_enqueue
from proposals.models import Proposal, State
from proposals.selectors import proposal_status_text
from runs.models import Run
from runs.services.runs import run_rerun

COMMAND = re.compile(
    r"^ {0,3}/(approve|reject|request-changes|withdraw|hold|unhold|cancel|rerun|status|spec)"
    r"(?=\s|$)"
    r"[ \t]*(.*)$"
)
TRANSITION_COMMANDS = {
    "approve": "approve",
    "reject": "reject",
    "request-changes": "request_changes",
    "cancel": "cancel",
    "withdraw": "withdraw",
}


@dataclass(frozen=True)
class Command:
    name: str
    argument: str


def commands_in(body: str | None) -> list[Command]:
    """The commands of a comment, outside code blocks and quotes, in order."""
    found: list[list[str]] = []
    in_fence = False
    spec: list[str] | None = None  # a /spec command waiting for its fenced block
    block: list[str] | None = None  # the lines of that block, while inside it
    for line in normalise(body or "").split("\n"):
        if FENCE.match(line):
            in_fence = not in_fence
            if in_fence and spec is not None:
                block = []
            elif not in_fence and block is not None and spec is not None:
                spec[1] = "\n".join(block)
                spec = block = None
            continue
        if in_fence:
            if block is not None:
                block.append(line)
            continue
        if line.startswith(("    ", "\t")) or line.lstrip().startswith(">"):
            continue
        match = COMMAND.match(line)
        if match:
            found.append([match.group(1), match.group(2).strip()])
            spec = found[-1] if match.group(1) == "spec" else None
            if spec is not None:
                spec[1] = ""  # only a fenced block is a spec
    return [Command(name, argument) for name, argument in found]


def _rerun(proposal: Proposal, user: User, argument: str) -> str:
    action_require(proposal=proposal, actor=user, name="rerun")
    number = argument.strip().lstrip("#")
    if not number.isdigit() or len(number) > 18:
        raise DomainError("Say which run: `/rerun RUN` with the run's number.")
    run = Run.objects.filter(pk=int(number)).first()
    if run is None or run.plan_id != proposal.plan_id:
        raise DomainError(f"Run {argument} is not one of this proposal's runs.")
    new_run = run_rerun(run_id=run.pk, actor=user, door=Door.GITHUB)
    return f"run {run.pk} queued again as run {new_run.pk}"


def _spec(proposal: Proposal, user: User, spec_text: str) -> str:
    """Set the ablation spec, as the site's edit form would (permission and state: "edit";
    after approval the plan is frozen)."""
    if not spec_text.strip():
        raise DomainError("Put the ablation spec in a fenced YAML block after `/spec`.")
    action_require(proposal=proposal, actor=user, name="edit")
    if proposal.state == State.APPROVED:
        raise DomainError("The plan is frozen at approval; the ablation spec can no longer change.")
    updated = services.proposal_update(
        proposal_id=proposal.pk,
        actor=user,
        data={"ablation_spec": spec_text.strip() + "\n"},
        door=Door.GITHUB,
    )
    plan = services.proposal_plan(proposal=updated)
    text = (
        f"the ablation spec is set: {plan.run_count} runs, "
        f"{plan.total_accelerator_hours:.1f} accelerator-hours"
    )
    if updated.state == State.DRAFT and updated.github_sections:
        try:
            with transaction.atomic():
                updated = services.proposal_transition(
                    proposal_id=proposal.pk, action="submit", actor=user, door=Door.GITHUB
                )
        except (DomainError, ValidationError) as exc:
            reasons = exc.message if isinstance(exc, DomainError) else " ".join(exc.messages)
            return f"{text}; still a draft: {reasons}"
    return f"{text}; {proposal_status_text(updated)}"


APPROVE_OPTIONS = ("executor", "ref")


def _options(command: Command) -> tuple[dict[str, str], str]:
    """``/approve executor=pool:tpu ref=1a2b3c`` : the options (where the runs go, the git
    ref pinned) and the rest as the reason; an unknown ``key=value`` is refused by name."""
    options: dict[str, str] = {}
    rest: list[str] = []
    for word in command.argument.split():
        key, sep, value = word.partition("=")
        if sep and key.isidentifier():
            if key not in APPROVE_OPTIONS:
                known = ", ".join(APPROVE_OPTIONS)
                raise DomainError(f"{key[:40]}: is no option of /approve (they are: {known})")
            options[key] = value
        else:
            rest.append(word)
    return options, " ".join(rest)


def command_run(*, proposal_id: int, user: User, login: str, command: Command) -> str:
    """Run one command; return what happened, in a sentence. Refusals are answers too."""
    proposal = Proposal.objects.get(pk=proposal_id)
    label = f"@{login}"
    try:
        with transaction.atomic():
            if command.name in TRANSITION_COMMANDS:
                options, reason = _options(command) if command.name == "approve" else ({}, "")
                updated = services.proposal_transition(
                    proposal_id=proposal_id,
                    action=TRANSITION_COMMANDS[command.name],
                    actor=user,
                    door=Door.GITHUB,
                    reason=reason if command.name == "approve" else command.argument,
                    git_ref=options.get("ref", ""),
                    executor=options.get("executor", ""),
                    actor_label=label,
                )
                done = f"done; {proposal_status_text(updated)}."
            elif command.name in {"hold", "unhold"}:
                updated = services.proposal_hold(
                    proposal_id=proposal_id,
                    actor=user,
                    hold=command.name == "hold",
                    door=Door.GITHUB,
                    reason=command.argument,
                )
                done = f"done; {proposal_status_text(updated)}."
            elif command.name == "spec":
                done = "done: " + _spec(proposal, user, command.argument) + "."
            elif command.name == "rerun":
                done = "done: " + _rerun(proposal, user, command.argument) + "."
            else:
                done = f"{proposal_status_text(proposal)}."
    except DomainError as exc:
        return f"Sorry {label}, `/{command.name}` was refused: {exc.message}"
    except ValidationError as exc:
        return f"Sorry {label}, `/{command.name}` was refused: {' '.join(exc.messages)}"
    return f"{label} `/{command.name}`: {done}"


def commands_answer(
    *, proposal_id: int, user: User, login: str, github_comment_id: int, body: str
) -> list[str]:
    """Run every command of a new comment and queue one answer comment per command."""
    answers = []
    for index, command in enumerate(commands_in(body)):
        answer = command_run(proposal_id=proposal_id, user=user, login=login, command=command)
        proposal = Proposal.objects.get(pk=proposal_id)
        outbox_comment_enqueue(
            proposal=proposal, key=f"answer:{github_comment_id}:{index}", body=answer
        )
        answers.append(answer)
    return answers
