"""Reads for proposals: the merged timeline and the one status text."""

from __future__ import annotations

from typing import Any

import pytest

from marin_site.doors import Door
from marin_site.events import Verb
from proposals import services
from proposals.github.commands import Command, command_run
from proposals.github.outbox.render import render_block, render_status
from proposals.models import Proposal, State
from proposals.selectors import (
    proposal_status_text,
    proposal_timeline,
    proposal_timeline_recent,
    timeline_entries,
)
from runs.models import Run, RunState
from runs.services import runs as run_writes
from tests.factories import ProposalFactory
from tests.runs.runs_helpers import launched_plan

pytestmark = pytest.mark.django_db


@pytest.fixture
def launched(recipe: Any, contributor: Any) -> Proposal:
    plan = launched_plan(recipe)
    return ProposalFactory.create(
        recipe=recipe, state=State.APPROVED, author=contributor, plan=plan
    )


def test_the_timeline_merges_the_proposal_s_events_and_its_runs_in_time_order(
    launched: Proposal, maintainer: Any
) -> None:
    services.event_record(proposal=launched, actor=maintainer, verb=Verb.APPROVED, door=Door.WEB)
    run = Run.objects.filter(plan=launched.plan).order_by("entry__index").first()
    assert run is not None
    run_writes.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door=Door.WORKER)
    services.comment_create(proposal_id=launched.pk, author=maintainer, body="Started.")
    run_writes.run_transition(
        run_id=run.pk, to_state=RunState.FAILED, door=Door.RUNNER, failure_kind="oom"
    )

    entries = timeline_entries(proposal_timeline(proposal=launched))
    mine = [e for e in entries if e.kind == "proposal" or e.run == run.pk]
    assert [(e.kind, e.verb, e.from_state, e.to_state, e.door) for e in mine] == [
        ("run", "queued", "", "queued", "worker"),  # at expansion, before the approval row
        ("proposal", "approved", "", "", "web"),
        ("run", "running", "queued", "running", "worker"),
        ("proposal", "commented", "", "", "web"),
        ("run", "failed", "running", "failed", "runner"),
    ]
    assert mine[-1].message == "[oom]" and mine[-1].actor == "system"
    assert mine[1].actor == "max" and mine[1].door_label == "Web"


def test_a_proposal_without_a_plan_has_only_its_own_events(proposal: Proposal) -> None:
    services.event_record(proposal=proposal, actor=None, verb=Verb.LINKED, door=Door.GITHUB)
    assert [e.verb for e in timeline_entries(proposal_timeline(proposal=proposal))] == ["linked"]


def test_the_page_shows_the_latest_entries_and_says_when_older_ones_are_left_out(
    proposal: Proposal,
) -> None:
    for n in range(5):
        services.event_record(
            proposal=proposal, actor=None, verb=Verb.EDITED, door=Door.API, message=f"step {n}"
        )
    shown, cut = proposal_timeline_recent(proposal=proposal, limit=3)
    assert ([e.message for e in shown], cut) == (["step 2", "step 3", "step 4"], True)
    shown, cut = proposal_timeline_recent(proposal=proposal, limit=5)
    assert (len(shown), cut) == (5, False)


def test_the_status_text_is_the_same_in_the_answer_the_status_comment_and_the_issue(
    launched: Proposal, maintainer: Any
) -> None:
    services.proposal_hold(proposal_id=launched.pk, actor=maintainer, hold=True)
    services.proposal_record_outcome(
        proposal_id=launched.pk,
        actor=maintainer,
        outcome="promising",
        conclusion="Lower loss at one seed.",
        confidence="exploratory",
        without_results_reason="Recorded early to show it beside the runs still going.",
    )
    run = Run.objects.filter(plan=launched.plan).order_by("entry__index").first()
    assert run is not None
    run_writes.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door=Door.WORKER)
    launched.refresh_from_db()

    text = proposal_status_text(launched)
    assert text == (
        "state: **Approved**, on hold, outcome **Promising**; runs: 1 queued, 1 running"
    )
    answer = command_run(
        proposal_id=launched.pk, user=maintainer, login="max", command=Command("status", "")
    )
    assert answer == f"@max `/status`: {text}."
    assert f"**Status** · {text}" in render_status(launched)
    assert render_block(launched).splitlines()[1].endswith(f"· {text}")
