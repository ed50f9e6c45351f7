"""Slash commands in issue comments, run through the same services and permissions as the site.

A command is a line that starts with ``/approve``, ``/reject REASON``, ``/request-changes
REASON``, ``/hold``, ``/unhold``, ``/cancel``, ``/rerun RUN`` or ``/status``. Lines in
fenced or indented code blocks and quoted lines (``>``) are not commands. Every command
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
from proposals.models import Proposal
from proposals.selectors import proposal_status_text
from runs.models import Run
from runs.services.runs import run_rerun

COMMAND = re.compile(
    r"^ {0,3}/(approve|reject|request-changes|hold|unhold|cancel|rerun|status)(?=\s|$)[ \t]*(.*)$"
)
TRANSITION_COMMANDS = {
    "approve": "approve",
    "reject": "reject",
    "request-changes": "request_changes",
    "cancel": "cancel",
}


@dataclass(frozen=True)
class Command:
    name: str
    argument: str


def commands_in(body: str | None) -> list[Command]:
    """The commands of a comment, outside code blocks and quotes, in order."""
    found = []
    in_fence = False
    for line in normalise(body or "").split("\n"):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence or line.startswith(("    ", "\t")) or line.lstrip().startswith(">"):
            continue
        match = COMMAND.match(line)
        if match:
            found.append(Command(match.group(1), match.group(2).strip()))
    return found


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


def command_run(*, proposal_id: int, user: User, login: str, command: Command) -> str:
    """Run one command; return what happened, in a sentence. Refusals are answers too."""
    proposal = Proposal.objects.get(pk=proposal_id)
    label = f"@{login}"
    try:
        with transaction.atomic():
            if command.name in TRANSITION_COMMANDS:
                updated = services.proposal_transition(
                    proposal_id=proposal_id,
                    action=TRANSITION_COMMANDS[command.name],
                    actor=user,
                    door=Door.GITHUB,
                    reason=command.argument,
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
