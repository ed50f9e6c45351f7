"""The demo data command: every state, failures included, and safe to run twice."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from marin_site.events import Verb
from proposals.models import Outcome, Proposal, State
from runs.models import Pool, Recipe

pytestmark = pytest.mark.django_db


def test_seed_demo_fills_every_state_and_is_idempotent(settings: Any) -> None:
    settings.DEBUG = True  # bin/run's default; pytest-django turns it off
    out = StringIO()
    call_command("seed_demo", stdout=out)
    assert set(Proposal.objects.values_list("state", flat=True)) == set(State.values)
    assert Proposal.objects.filter(outcome=Outcome.DID_NOT_WORK).count() >= 2
    assert Proposal.objects.count() >= 12
    approved = Proposal.objects.filter(state=State.APPROVED)
    assert all(p.plan_id for p in approved)
    users = get_user_model().objects
    assert set(users.get(username="max").groups.values_list("name", flat=True)) == {"maintainer"}
    assert users.get(username="carla").check_password("marin-demo")
    # Marin-scale plans go to a Ray cluster; on a machine without one they wait, never fail.
    assert dict(Recipe.objects.values_list("name", "executor")) == {
        "tiny-moe": "",
        "marin-moe": "ray",
    }
    assert "carla (contributor)" in out.getvalue()
    pool = Pool.objects.get()  # a pool for runs on anyone's compute, owned by a contributor
    assert (pool.name, pool.owner.username, pool.recipes) == (
        "community-gpus",
        "carla",
        ["tiny-moe"],
    )

    count = Proposal.objects.count()
    again = StringIO()
    call_command("seed_demo", stdout=again)
    assert Proposal.objects.count() == count
    assert "none added" in again.getvalue()


def test_seed_demo_refuses_to_create_demo_accounts_with_debug_off(settings: Any) -> None:
    settings.DEBUG = False  # production
    with pytest.raises(CommandError, match="load_recipes"):
        call_command("seed_demo", stdout=StringIO())
    assert not get_user_model().objects.exists()
    assert not Recipe.objects.exists()


def test_seed_demo_registers_the_reviewed_recipe_files_as_load_recipes_does(settings: Any) -> None:
    settings.DEBUG = True
    call_command("load_recipes", stdout=StringIO())
    loaded = {r.name: r.updated_at for r in Recipe.objects.all()}
    call_command("seed_demo", stdout=StringIO())
    assert {r.name: r.updated_at for r in Recipe.objects.all()} == loaded


def test_seed_demo_outcomes_agree_with_their_runs(settings: Any) -> None:
    """No demo proposal claims a verdict while its runs are queued, and each verdict is the
    one its runs' numbers support (the summary's suggested verdict over the same runs)."""
    from runs.models import PlanLaunch, Run, RunState
    from runs.results.summary import latest_runs

    settings.DEBUG = True
    call_command("seed_demo", stdout=StringIO())
    # An imported issue's verdict was found, not computed here: it has no plan to agree with.
    imported = Proposal.objects.get(state=State.IMPORTED)
    assert imported.plan_id is None and imported.outcome == Outcome.WORKED
    assert imported.events.filter(verb=Verb.OUTCOME_RECORDED).count() == 1
    concluded = Proposal.objects.exclude(outcome="").exclude(state=State.IMPORTED)
    assert concluded.count() >= 6
    judged = 0
    for proposal in concluded:
        plan_id = proposal.plan_id
        assert plan_id is not None, f"{proposal.title!r} has an outcome and no plan"
        runs = list(Run.objects.filter(plan_id=plan_id))
        open_runs = [r.pk for r in runs if not r.is_terminal]
        assert open_runs == [], (
            f"{proposal.title!r} claims {proposal.outcome} with {open_runs} open"
        )
        if proposal.outcome == Outcome.NOT_EVALUATED:
            continue
        latest = latest_runs(plan_id=plan_id)
        assert latest and all(r.state == RunState.FINISHED for r in latest), proposal.title
        launch = PlanLaunch.objects.get(plan_id=plan_id)
        assert launch.summary is not None, f"{proposal.title!r}: its plan was never summarised"
        assert launch.summary["suggested_verdict"] == proposal.outcome, (
            f"{proposal.title!r} records {proposal.outcome}, its runs say "
            f"{launch.summary['suggested_verdict']} ({launch.summary['verdict_reason']})"
        )
        judged += 1
    assert judged >= 5
    # Proposals still waiting for their runs claim nothing.
    waiting = Run.objects.exclude(state__in=["finished", "failed", "killed", "crashed"])
    assert not Proposal.objects.filter(plan__runs__in=waiting).exclude(outcome="").exists()


def test_the_demo_campaign_shows_interventions_mix_and_the_ladders_projection(
    settings: Any, client: Any
) -> None:
    """What a newcomer sees on bin/run (WALKTHROUGH step 10): the campaign's page with its
    two interventions, the data mix, and the projection of the ladder that predicted it."""
    settings.DEBUG = True
    call_command("seed_demo", stdout=StringIO())
    page = client.get("/campaigns/moe-535b-demo/")
    assert page.status_code == 200
    html = page.content.decode()
    assert html.count('class="intervention"') == 2
    assert 'data-chart-kind="mixture"' in html
    assert 'data-chart-kind="projection"' in html and 'id="projection-at-target"' in html
    found = json.loads(html.split('id="projection-data" type="application/json">')[1].split("<")[0])
    assert found["refusals"] == [] and found["fit"]["scales"] == 3
    assert found["fit"]["exponent"] < 0  # the loss falls with compute
    assert 2.0 < found["at_target"]["loss"] < 4.0
    assert client.get(f"/plans/{found['plan']}/runs/").status_code == 200


def test_the_demo_has_a_gate_style_proposal_beside_the_ladder(settings: Any) -> None:
    """A newcomer sees both kinds of verdict: the ladder's, and a preregistered gate's,
    computed from the demo's finished runs with its arithmetic."""
    settings.DEBUG = True
    call_command("seed_demo", stdout=StringIO())
    gate = Proposal.objects.get(title="Capacity factor 1.25 through gate 1")
    criteria: Any = gate.approved_criteria
    assert criteria["rule"]["kind"] == "effective_speedup"
    assert gate.plan is not None
    summary: Any = gate.plan.launch.summary
    (row,) = summary["verdicts"]["variants"]
    assert row["missing"] == [] and row["verdict"] is not None
    assert {s["name"] for s in row["verdict"]["result"]["scales"]} == {"small", "medium"}
    assert "Preregistered rule" in summary["markdown"] and "stepwise" in summary["markdown"]
    assert Proposal.objects.filter(
        ablation_spec__contains="scales: [small, medium, large]"
    ).exists()


def test_the_demo_board_has_two_tracks_of_finished_runs(settings: Any, client: Any) -> None:
    from runs.board.models import BoardEntry, BoardTrack

    settings.DEBUG = True
    out = StringIO()
    call_command("seed_demo", stdout=out)
    assert "/board/" in out.getvalue()
    lowest = BoardTrack.objects.get(slug="demo-tiny-moe-eval-loss")
    speedup = BoardTrack.objects.get(slug="demo-tiny-moe-speedup")
    assert speedup.rule == "effective_speedup" and speedup.parameters["baseline_loss"] > 1.6
    for track in (lowest, speedup):
        entries = BoardEntry.objects.filter(track=track)
        assert entries.count() >= 4
        assert not entries.exclude(run__state="finished").exists()
    # The baseline itself is at speedup 1; a variant that lowered the loss is above it.
    scores = sorted(BoardEntry.objects.filter(track=speedup).values_list("score", flat=True))
    assert scores[-1] > 1.0
    page = client.get("/board/?track=demo-tiny-moe-speedup")
    assert (
        page.status_code == 200
        and "effective speedup over the demo baseline" in page.content.decode()
    )
