"""The run services ask for their permission themselves, whichever door calls them."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser

from marin_site.doors import Door
from marin_site.errors import ActionForbidden
from runs.models import Run, RunEvent, RunState
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
