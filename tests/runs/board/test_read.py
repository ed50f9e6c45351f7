"""The board's read model: finished runs only, ranked by the track's rule, with provenance."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from runs.board.models import BoardTrack
from runs.board.read import parameters_clean, track_entries
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


def test_the_seeded_speedrun_track() -> None:
    seeded = BoardTrack.objects.get(slug="c4-en-bpb-1-3")
    assert seeded.rule == "speedrun_threshold" and seeded.parameters == {"threshold": 1.3}
    assert seeded.metric == "eval/paloma/c4_en/bpb"


def test_parameters_are_checked_by_the_rule() -> None:
    assert parameters_clean("speedrun_threshold", {}) == {"threshold": 1.3}
    with pytest.raises(ValueError, match="threshold"):
        parameters_clean("speedrun_threshold", {"threshold": 11})
    with pytest.raises(ValueError, match="not a parameter"):
        parameters_clean("speedrun_threshold", {"cutoff": 1})
    with pytest.raises(ValueError, match="no parameters"):
        parameters_clean("lowest", {"threshold": 1})
