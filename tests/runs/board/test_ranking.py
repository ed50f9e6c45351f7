"""The board's read model: finished runs only, ranked by the track's rule, with provenance."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from runs.board.models import BoardTrack
from runs.board.parameters import parameters_clean
from runs.board.ranking import track_ranking as track_entries
from runs.models import RunOrigin, RunState
from runs.pools.models import Lease
from runs.verdicts.rules import verdict_compute
from tests.runs.board.board_helpers import finish, four_runs, track
from tests.runs.pools.pool_helpers import make_agent, make_pool

pytestmark = pytest.mark.django_db


def test_threshold_ranks_by_flops_and_keeps_failed_runs_off(recipe: Any) -> None:
    a, b, c, d = four_runs(recipe)
    finish(a, bpb=1.25, flops=3e18)
    finish(b, bpb=1.29, flops=1e18)
    finish(c, bpb=1.10, flops=1e18, state=RunState.FAILED)  # the best figures, but failed
    finish(d, bpb=1.35, flops=1e17)  # above the threshold
    entries = track_entries(track())
    assert [(e.rank, e.run_id) for e in entries] == [(1, b.pk), (2, a.pk)]
    # The same order as the rule itself gives on these figures.
    verdict = verdict_compute(
        {
            "rule": {"kind": "speedrun_threshold", "threshold": 1.3},
            "entries": [
                {"name": f"run {r.pk}", "bpb": bpb, "flops": f}
                for r, bpb, f in ((a, 1.25, 3e18), (b, 1.29, 1e18), (d, 1.35, 1e17))
            ],
        }
    )
    ranked = sorted((e for e in verdict.result["entries"] if e["rank"]), key=lambda e: e["rank"])
    assert [e["name"] for e in ranked] == [f"run {b.pk}", f"run {a.pk}"]


def test_lowest_ranks_every_finished_run_and_falls_back_to_the_plans_flops(recipe: Any) -> None:
    a, b, c, _ = four_runs(recipe)
    finish(a, bpb=1.5)
    finish(b, bpb=1.2)
    finish(c, bpb=0.9, state=RunState.CRASHED)
    entries = track_entries(track(rule="lowest", parameters={}))
    assert [e.run_id for e in entries] == [b.pk, a.pk]
    assert entries[0].flops == b.entry.flops > 0


def test_a_track_of_one_recipe_reads_only_its_runs(recipe: Any) -> None:
    a, *_ = four_runs(recipe)
    finish(a, bpb=1.0, flops=1e18)
    assert track_entries(track(recipe_name=recipe.name))
    assert track_entries(track("other", recipe_name="marin-speedrun")) == []


def test_provenance_verified_and_unverified(recipe: Any, contributor: User) -> None:
    a, b, c, d = four_runs(recipe)
    finish(a, bpb=1.0, flops=1e18, executor="local")
    finish(b, bpb=1.0, flops=2e18, origin=RunOrigin.CLAIMED, claimed_by=contributor)
    finish(
        c,
        bpb=1.0,
        flops=3e18,
        origin=RunOrigin.IMPORTED,
        tracker_tags={"author": {"name": "Ada", "affiliation": "Marin"}},
        imported_from="wandb:marin/speedrun/abc",
    )
    finish(d, bpb=1.0, flops=4e18, git_sha="")  # launched, but with no pinned commit
    rows = {e.run_id: e for e in track_entries(track())}
    assert rows[a.pk].verified and rows[a.pk].label == "verified"
    assert rows[a.pk].ran_by == "the site" and rows[a.pk].executor == "local"
    assert rows[a.pk].git_sha.startswith("0123") and rows[a.pk].config_hash == a.config_hash
    assert rows[b.pk].label == "unverified" and rows[b.pk].ran_by == contributor.username
    assert rows[c.pk].label == "unverified" and rows[c.pk].ran_by == "Ada"
    assert rows[c.pk].imported_from == "wandb:marin/speedrun/abc"
    assert rows[d.pk].label == "unverified"


def test_where_names_the_pool_and_agent_of_the_last_lease(recipe: Any, maintainer: User) -> None:
    pool = make_pool(maintainer, "gpu")
    agent, _ = make_agent(pool, "host-b")
    a, *_ = four_runs(recipe)
    from django.utils import timezone

    now = timezone.now()
    Lease.objects.create(
        run=a, agent=agent, attempt=1, renewed_at=now, expires_at=now, ended_at=now
    )
    finish(a, bpb=1.0, flops=1e18, executor=pool.executor)
    (entry,) = track_entries(track())
    assert (entry.executor, entry.pool, entry.agent) == ("pool:gpu", "gpu", "host-b")


def test_imported_speedrun_runs_under_marins_keys(recipe: Any) -> None:
    a, *_ = four_runs(recipe)
    finish(
        a,
        bpb=1.12,
        flops=2.5e18,
        origin=RunOrigin.IMPORTED,
        git_sha="",
        metrics={"training_hardware_flops": 9e18, "training_time": 3600.0, "model_size": 1.5e8},
    )
    (entry,) = track_entries(track())
    assert entry.label == "unverified" and entry.origin == "imported"
    assert (entry.flops, entry.training_hardware_flops, entry.training_time, entry.model_size) == (
        2.5e18,
        9e18,
        3600.0,
        1.5e8,
    )


def test_the_seeded_speedrun_track(seeded_tracks: None) -> None:
    seeded = BoardTrack.objects.get(slug="c4-en-bpb-1-3")
    assert seeded.rule == "speedrun_threshold" and seeded.parameters == {"threshold": 1.3}
    assert seeded.metric == "eval/paloma/c4_en/bpb"


def test_parameters_are_checked_by_the_rule() -> None:
    assert parameters_clean("speedrun_threshold", {}) == {"threshold": 1.3}
    with pytest.raises(ValueError, match="threshold"):
        parameters_clean("speedrun_threshold", {"threshold": 11})
    with pytest.raises(ValueError, match="not a parameter"):
        parameters_clean("speedrun_threshold", {"cutoff": 1})
    with pytest.raises(ValueError, match="not a parameter of this rule"):
        parameters_clean("lowest", {"threshold": 1})


def test_a_dirty_checkout_or_another_config_is_unverified(recipe: Any) -> None:
    a, b, c, _ = four_runs(recipe)
    finish(a, bpb=1.0, flops=1e18, git_clean=False)
    finish(b, bpb=1.0, flops=2e18, reported_config_hash="f" * 64)
    finish(c, bpb=1.0, flops=3e18, git_clean=True)
    rows = {e.run_id: e.label for e in track_entries(track())}
    assert rows == {a.pk: "unverified", b.pk: "unverified", c.pk: "verified"}


def test_a_claimed_run_says_where_it_ran_by_hand(recipe: Any, contributor: User) -> None:
    a, *_ = four_runs(recipe)
    finish(
        a,
        bpb=1.0,
        flops=1e18,
        origin=RunOrigin.CLAIMED,
        claimed_by=contributor,
        claim_where="carla's A5000",
        executor="",
    )
    (entry,) = track_entries(track())
    assert entry.executor == "by hand: carla's A5000" and entry.ran_by == "carla"
    assert entry.label == "unverified"


def test_effective_speedup_over_a_pinned_baseline(recipe: Any) -> None:
    a, b, c, _ = four_runs(recipe)
    finish(a, bpb=3.71, flops=2.19e17)  # the baseline's own figures: speedup 1
    finish(b, bpb=3.69, flops=2.19e17)
    finish(c, bpb=1.5, flops=2.19e17)  # below the asymptote: the law cannot place it
    params = {"asymptote": 1.6, "alpha": 0.0941, "baseline_budget": 2.19e17, "baseline_loss": 3.71}
    entries = track_entries(track(rule="effective_speedup", parameters=params))
    assert [e.run_id for e in entries] == [b.pk, a.pk]
    # The gate's stepwise speedup at the baseline's budget (runs/verdicts/gates.py).
    assert entries[0].score == pytest.approx(((3.71 - 1.6) / (3.69 - 1.6)) ** (1 / 0.0941))
    assert entries[1].score == pytest.approx(1.0)
    assert "the baseline needs" in entries[0].note


def test_projected_loss_refits_each_plan_with_the_asymptote_pinned(recipe: Any) -> None:
    a, b, c, d = four_runs(recipe)
    law = lambda budget: 1.6 + 40.0 * budget**-0.1  # noqa: E731
    finish(a, bpb=law(1e17), flops=1e17)
    finish(b, bpb=law(1e18), flops=1e18)
    finish(c, bpb=law(1e19), flops=1e19)
    finish(d, bpb=9.0, flops=1e16, state=RunState.FAILED)  # failed: not in the fit
    (entry,) = track_entries(
        track(rule="projected_loss", parameters={"asymptote": 1.6, "budget": 1e21})
    )
    assert entry.run_id == c.pk  # the plan's largest budget stands for it
    assert entry.score == pytest.approx(law(1e21), rel=1e-4)
    assert "3 budgets" in entry.note and entry.verified


@pytest.mark.parametrize(
    ("rule", "given", "words"),
    [
        (
            "effective_speedup",
            {"alpha": 0.1},
            "baseline_budget: the rule effective_speedup needs it",
        ),
        (
            "effective_speedup",
            {"baseline_budget": 1e18, "baseline_loss": 1.0},
            "must be above the asymptote",
        ),
        ("projected_loss", {"budget": -1}, "outside"),
        ("nope", {}, "is not a rule"),
        ("lowest", [1, 2], "must be a JSON object"),
    ],
)
def test_parameters_are_refused_in_words(rule: str, given: Any, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parameters_clean(rule, given)


def test_the_admin_form_refuses_bad_parameters_in_words() -> None:
    from runs.admin import BoardTrackAdminForm

    data = {
        "slug": "t",
        "title": "T",
        "metric": "eval/loss",
        "rule": "speedrun_threshold",
        "parameters": '{"threshold": 11}',
        "top_n": 10,
        "position": 0,
        "active": True,
    }
    form = BoardTrackAdminForm(data=data)
    assert not form.is_valid()
    assert "threshold" in form.errors["parameters"][0] and "outside" in form.errors["parameters"][0]
    form = BoardTrackAdminForm(data=data | {"rule": "effective_speedup", "parameters": "{}"})
    assert not form.is_valid()
    assert "baseline_budget: the rule effective_speedup needs it" in form.errors["parameters"][0]
    form = BoardTrackAdminForm(data=data | {"parameters": "{}"})
    assert form.is_valid(), form.errors
    assert form.save().parameters == {"threshold": 1.3}  # the default, written down
