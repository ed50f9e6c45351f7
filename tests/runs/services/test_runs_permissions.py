"""The run services ask for their permission themselves, whichever door calls them."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser

from marin_site.doors import Door
from marin_site.errors import ActionForbidden
from runs.models import Run, RunEvent, RunState
from runs.permissions import run_allowed_actions
from runs.services import runs as run_writes
from tests.factories import UserFactory
from tests.runs.runs_helpers import launched_plan

pytestmark = pytest.mark.django_db


@pytest.fixture
def runs(recipe: Any) -> list[Run]:
    return list(Run.objects.filter(plan=launched_plan(recipe)).order_by("entry__index"))


def _finish(run: Run) -> None:
    run_writes.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door=Door.WORKER)
    run_writes.run_transition(run_id=run.pk, to_state=RunState.FAILED, door=Door.RUNNER)


@pytest.mark.parametrize("who", [None, "anonymous", "contributor", "reviewer"])
@pytest.mark.parametrize(
    ("service", "verb"),
    [
        (run_writes.run_cancel, "cancel"),
        (run_writes.run_rerun, "rerun"),
        (run_writes.run_retry, "retry"),
    ],
)
def test_run_actions_are_refused_without_the_permission(
    runs: list[Run], who: str | None, service: Any, verb: str
) -> None:
    run = runs[1]
    if verb != "cancel":
        _finish(run)
    actor: Any = {
        None: None,
        "anonymous": AnonymousUser(),
        "contributor": UserFactory.create(username="carl", roles=["contributor"]),
        "reviewer": UserFactory.create(username="rev", roles=["reviewer"]),
    }[who]
    events = RunEvent.objects.count()
    with pytest.raises(ActionForbidden) as refused:
        service(run_id=run.pk, actor=actor, door=Door.GITHUB)
    assert refused.value.message == f"You do not have permission to {verb} this run."
    assert RunEvent.objects.count() == events
    assert Run.objects.filter(plan=run.plan).count() == 2
    run.refresh_from_db()
    assert run.cancel_requested_at is None


@pytest.mark.parametrize(
    ("service", "verb"),
    [
        (run_writes.run_cancel, "cancel"),
        (run_writes.run_rerun, "rerun"),
        (run_writes.run_retry, "retry"),
    ],
)
def test_a_maintainer_may_act_on_runs(
    runs: list[Run], maintainer: Any, service: Any, verb: str
) -> None:
    run = runs[1]
    if verb != "cancel":
        _finish(run)
    service(run_id=run.pk, actor=maintainer, door=Door.API)
    assert RunEvent.objects.filter(actor=maintainer, door="api").exists()


def test_a_superuser_is_a_maintainer(runs: list[Run]) -> None:
    root = UserFactory.create(username="root", is_superuser=True)
    run_writes.run_cancel(run_id=runs[0].pk, actor=root)
    assert Run.objects.get(pk=runs[0].pk).state == RunState.KILLED


def test_the_runs_of_a_canceled_plan_are_stopped_by_the_plan_s_cancel(runs: list[Run]) -> None:
    from runs.services.plans import plan_cancel

    assert plan_cancel(plan_id=runs[0].plan_id, door=Door.GITHUB) == 2
    assert {r.state for r in Run.objects.filter(plan_id=runs[0].plan_id)} == {RunState.KILLED}


def _running_after_its_plan_was_canceled(run: Run) -> Run:
    from runs.services.plans import plan_cancel

    run_writes.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door=Door.WORKER)
    plan_cancel(plan_id=run.plan_id, door=Door.WEB)
    run.refresh_from_db()
    assert run.state == RunState.RUNNING and run.cancel_requested_at is not None
    return run


@pytest.mark.parametrize("who", ["anonymous", "contributor", "reviewer"])
def test_a_canceled_plan_does_not_let_anyone_cancel_its_runs(runs: list[Run], who: str) -> None:
    run = _running_after_its_plan_was_canceled(runs[0])
    actor: Any = {
        "anonymous": AnonymousUser(),
        "contributor": UserFactory.create(username="carl", roles=["contributor"]),
        "reviewer": UserFactory.create(username="rev", roles=["reviewer"]),
    }[who]
    events = RunEvent.objects.filter(run=run).count()
    with pytest.raises(ActionForbidden):
        run_writes.run_cancel(run_id=run.pk, actor=actor, door=Door.API)
    assert RunEvent.objects.filter(run=run).count() == events
    assert "cancel" not in run_allowed_actions(run=run, user=actor, latest=True, plan_live=False)


def test_a_maintainer_still_cancels_a_run_of_a_canceled_plan(
    runs: list[Run], maintainer: Any
) -> None:
    run = _running_after_its_plan_was_canceled(runs[0])
    assert "cancel" in run_allowed_actions(run=run, user=maintainer, latest=True, plan_live=False)
    run_writes.run_cancel(run_id=run.pk, actor=maintainer, door=Door.API)


def test_the_author_of_the_approved_proposal_cancels_its_runs_and_no_other(
    contributor: Any, maintainer: Any, recipe: Any
) -> None:
    from proposals.services import proposal_transition
    from runs.services import dispatch
    from tests.factories import ProposalFactory

    proposal = ProposalFactory.create(
        author=contributor, recipe=recipe, baseline={"steps": 10}, ablation_spec=""
    )
    proposal_transition(proposal_id=proposal.pk, action="submit", actor=contributor)
    proposal_transition(
        proposal_id=proposal.pk, action="approve", actor=maintainer, git_ref="cafebabe" * 5
    )
    proposal.refresh_from_db()
    assert proposal.plan_id is not None
    dispatch.plan_expand(plan_id=proposal.plan_id)
    theirs = Run.objects.get(plan_id=proposal.plan_id)
    others = Run.objects.filter(plan=launched_plan(recipe)).first()
    assert others is not None

    with pytest.raises(ActionForbidden):
        run_writes.run_cancel(run_id=others.pk, actor=contributor, door=Door.WEB)
    run_writes.run_cancel(run_id=theirs.pk, actor=contributor, door=Door.WEB)
    assert Run.objects.get(pk=theirs.pk).state == RunState.KILLED
