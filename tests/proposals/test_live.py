"""The proposal page's poll (``proposals.live``): one answer with the run table and every
panel that follows the runs, each with the version the page's own panel carries, so the
page swaps only what changed; a fixed number of queries whatever the number of runs."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from proposals.models import Proposal, State
from proposals.services import proposal_transition
from runs.models import Run, RunState
from runs.services import dispatch
from runs.services import runs as run_writes
from tests.factories import ProposalFactory
from tests.runs.runs_helpers import launched_plan

pytestmark = pytest.mark.django_db

PANELS = ("outcome", "results", "alerts", "actions")
SLOT = re.compile(r'data-live-slot="(\w+)" data-version="(\w+)"')
TEMPLATE = re.compile(r'<template data-live-panel="(\w+)" data-version="(\w+)">')


@pytest.fixture
def approved(recipe: Any, contributor: Any, maintainer: Any) -> Proposal:
    proposal = ProposalFactory.create(
        author=contributor, recipe=recipe, ablation_spec="axes:\n  capacity_factor: [1.0, 1.5]\n"
    )
    proposal_transition(proposal_id=proposal.pk, action="submit", actor=contributor)
    proposal_transition(proposal_id=proposal.pk, action="approve", actor=maintainer)
    return Proposal.objects.get(pk=proposal.pk)


def test_the_live_answer_carries_the_table_and_the_pages_panels(
    client: Client, approved: Proposal
) -> None:
    page = client.get(f"/proposals/{approved.pk}/").content.decode()
    live = client.get(f"/proposals/{approved.pk}/live/")
    assert live.status_code == 200
    assert "no-cache" in live["Cache-Control"]
    body = live.content.decode()
    assert 'class="run-table-box"' in body
    assert dict(TEMPLATE.findall(body)) == dict(SLOT.findall(page))  # the same panels, alike
    assert set(dict(TEMPLATE.findall(body))) == set(PANELS)


def test_a_maintainers_panels_carry_the_pages_versions_whatever_the_csrf_token(
    client: Client, approved: Proposal, maintainer: Any
) -> None:
    """The maintainer's actions and outcome form hold this request's CSRF token; the version
    leaves it out, or every poll would swap them for nothing."""
    client.force_login(maintainer)
    page = client.get(f"/proposals/{approved.pk}/").content.decode()
    live = client.get(f"/proposals/{approved.pk}/live/").content.decode()
    assert 'name="csrfmiddlewaretoken"' in live
    assert dict(TEMPLATE.findall(live)) == dict(SLOT.findall(page))


def test_the_outcome_panel_says_what_the_runs_say(
    client: Client, approved: Proposal, maintainer: Any
) -> None:
    client.force_login(maintainer)
    before = client.get(f"/proposals/{approved.pk}/live/").content.decode()
    assert "the plan&#x27;s runs are not created yet" in before
    assert approved.plan_id is not None
    dispatch.plan_expand(plan_id=approved.plan_id)
    after = client.get(f"/proposals/{approved.pk}/live/").content.decode()
    assert "2 of 2 runs not terminal yet" in after
    assert "not created yet" not in after
    versions = dict(TEMPLATE.findall(after))
    assert versions["outcome"] != dict(TEMPLATE.findall(before))["outcome"]
    # The maintainer's buttons come with this request's CSRF token.
    assert 'name="csrfmiddlewaretoken"' in after.split('data-live-panel="actions"')[1]


def test_a_proposal_without_a_plan_has_nothing_live(client: Client, proposal: Any) -> None:
    assert client.get(f"/proposals/{proposal.pk}/live/").status_code == 404
    assert client.get("/proposals/999999/live/").status_code == 404


def test_the_live_answer_costs_the_same_queries_whatever_the_runs(
    client: Client, recipe: Any, contributor: Any, django_assert_max_num_queries: Any
) -> None:
    def proposal_with(spec: str) -> Proposal:
        plan = launched_plan(recipe, spec)
        for run in Run.objects.filter(plan=plan):
            run_writes.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door="worker")
        return ProposalFactory.create(
            author=contributor, recipe=recipe, state=State.APPROVED, plan=plan
        )

    small = proposal_with("axes:\n  capacity_factor: [1.0]\n")
    large = proposal_with("axes:\n  capacity_factor: [1.0, 1.5, 2.0, 2.5]\n  seed: [0, 1, 2]\n")
    client.get(f"/proposals/{small.pk}/live/")  # sessions, content types: first-use reads
    with django_assert_max_num_queries(10) as small_queries:
        client.get(f"/proposals/{small.pk}/live/")
    with django_assert_max_num_queries(len(small_queries.captured_queries)):
        client.get(f"/proposals/{large.pk}/live/")
