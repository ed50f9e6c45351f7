"""The board's writes: entries stored from the ranking, rank changes on the run's timeline
and in the feed's table, a finished run or a saved track ranking again, an import filling
the speedrun track."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.management import call_command

from marin_site.doors import Door
from marin_site.events import Verb
from marin_site.importing import Outcome
from runs.board.models import BoardEntry, BoardRankChange, BoardTrack
from runs.board.rank import track_rank
from runs.imports.speedrun import speedrun_import
from runs.models import RunEvent, RunState
from runs.services import runs as run_writes
from tests.runs.board.board_helpers import finish, four_runs, track

pytestmark = pytest.mark.django_db


def _ranks(t: BoardTrack) -> list[tuple[int, int]]:
    return list(BoardEntry.objects.filter(track=t).values_list("rank", "run_id"))


def test_entries_are_stored_and_the_first_ranking_is_recorded_as_entered(recipe: Any) -> None:
    a, b, c, _ = four_runs(recipe)
    finish(a, bpb=1.2, flops=2e18)
    finish(b, bpb=1.1, flops=1e18)
    finish(c, bpb=1.0, flops=5e17, state=RunState.KILLED)
    t = track(top_n=1)
    report = track_rank(t)
    assert (report.entries, report.changes) == (2, 1)
    assert _ranks(t) == [(1, b.pk), (2, a.pk)]
    stored = BoardEntry.objects.get(track=t, run=b)
    assert (stored.value, stored.flops, stored.verified, stored.plan_id) == (
        1.1,
        1e18,
        True,
        b.plan_id,
    )
    (change,) = BoardRankChange.objects.all()
    assert (change.run_id, change.from_rank, change.to_rank) == (b.pk, None, 1)
    event = RunEvent.objects.get(run=b, verb=Verb.BOARD_RANK_CHANGED)
    assert "entered “Fastest to 1.3 BPB” at rank 1" in event.message
    assert event.actor_label == "the board" and event.door == Door.SYSTEM
    # Ranked again with nothing new: nothing recorded.
    assert track_rank(t).changes == 0


def test_a_run_that_finishes_ahead_moves_the_others_on_their_timelines(
    client: Any, recipe: Any, eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    a, b, c, _ = four_runs(recipe)
    finish(a, bpb=1.2, flops=2e18)
    finish(b, bpb=1.1, flops=3e18)
    t = track(top_n=2)
    track_rank(t)
    assert _ranks(t) == [(1, a.pk), (2, b.pk)]
    with django_capture_on_commit_callbacks(execute=True):
        run_writes.run_transition(run_id=c.pk, to_state=RunState.RUNNING, door=Door.WORKER)
        finish(c, bpb=1.25, flops=1e18, state=RunState.RUNNING)
    with django_capture_on_commit_callbacks(execute=True):
        # The worker reports it finished: the receiver nudges runs.board_rank (eager here).
        run_writes.run_transition(run_id=c.pk, to_state=RunState.FINISHED, door=Door.WORKER)
    assert _ranks(t) == [(1, c.pk), (2, a.pk), (3, b.pk)]
    latest = {
        e.run_id: e.message
        for e in RunEvent.objects.filter(verb=Verb.BOARD_RANK_CHANGED).order_by("pk")
    }
    assert latest[c.pk].startswith("entered “Fastest to 1.3 BPB” at rank 1")
    assert latest[a.pk].startswith("moved down on “Fastest to 1.3 BPB”: rank 1 → 2")
    assert latest[b.pk].startswith("left the first 2 of “Fastest to 1.3 BPB” (was rank 2)")
    moves = list(
        BoardRankChange.objects.filter(track=t, from_rank__isnull=False).values_list(
            "run_id", "from_rank", "to_rank"
        )
    )
    assert sorted(moves) == sorted([(a.pk, 1, 2), (b.pk, 2, None)])
    # On the run's own page, in its timeline, in words.
    page = client.get(f"/runs/{c.pk}/").content.decode()
    assert "changed rank on the board" in page and "entered “Fastest to 1.3 BPB” at rank 1" in page


def test_a_failed_run_never_ranks_and_stays_off_the_board(
    recipe: Any, eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    a, *_ = four_runs(recipe)
    t = track()
    track_rank(t)
    with django_capture_on_commit_callbacks(execute=True):
        run_writes.run_transition(run_id=a.pk, to_state=RunState.RUNNING, door=Door.WORKER)
        finish(a, bpb=0.5, flops=1e15, state=RunState.RUNNING)
        run_writes.run_transition(run_id=a.pk, to_state=RunState.FAILED, door=Door.WORKER)
    assert _ranks(t) == []
    assert not RunEvent.objects.filter(verb=Verb.BOARD_RANK_CHANGED).exists()


def test_a_saved_track_is_ranked_at_once(
    recipe: Any, eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    a, *_ = four_runs(recipe)
    finish(a, bpb=1.2, flops=2e18)
    with django_capture_on_commit_callbacks(execute=True):
        t = track()
    assert _ranks(t) == [(1, a.pk)]
    t.parameters = {"threshold": 1.1}  # a stricter threshold: the run is off
    with django_capture_on_commit_callbacks(execute=True):
        t.save()
    assert _ranks(t) == []


SPEEDRUN_RUNS_JSON = [
    {
        "run_name": "llama_130m_adamw/130m",
        "results_filepath": "experiments/speedrun/llama_130m_adamw/130m/speedrun_results.json",
        "author": {"name": "Ada", "affiliation": "Marin", "url": "https://example.org/ada"},
        "model_size": 130_000_000,
        "training_hardware_flops": 4.2e18,
        "training_time": 3600.0,
        "model_flops": 2.1e18,
        "eval_paloma_c4_en_bpb": 1.21,
        "wandb_link": "https://wandb.ai/marin/speedrun/runs/abc123",
        "run_completion_timestamp": "2025-06-27 06:41:56 UTC",
        "description": "130M Llama, AdamW",
    },
    {
        "run_name": "llama_300m_muon/300m",
        "results_filepath": "experiments/speedrun/llama_300m_muon/300m/speedrun_results.json",
        "author": {"name": "Bo", "affiliation": "", "url": None},
        "model_size": 300_000_000,
        "training_hardware_flops": 9.9e18,
        "training_time": 7200.0,
        "model_flops": 6.0e18,
        "eval_paloma_c4_en_bpb": 1.12,
        "wandb_link": "https://wandb.ai/marin/speedrun/runs/def456",
        "run_completion_timestamp": "2025-07-01 10:00:00 UTC",
        "description": "300M Llama, Muon",
    },
]


def test_imported_speedruns_land_on_the_seeded_speedrun_track(
    eager: None, seeded_tracks: None, django_capture_on_commit_callbacks: Any
) -> None:
    seeded = BoardTrack.objects.get(slug="speedrun-c4-en-bpb")
    with django_capture_on_commit_callbacks(execute=True):
        report = speedrun_import(
            io.StringIO(json.dumps(SPEEDRUN_RUNS_JSON)), by=None, dry_run=False
        )
    assert report.counts[Outcome.REFUSED] == 0, report.lines
    entries = list(BoardEntry.objects.filter(track=seeded).order_by("rank"))
    assert [(e.run_name, e.value, e.label, e.origin) for e in entries] == [
        ("llama_300m_muon/300m", 1.12, "unverified", "imported"),
        ("llama_130m_adamw/130m", 1.21, "unverified", "imported"),
    ]
    assert entries[1].ran_by == "Ada" and entries[1].author_affiliation == "Marin"
    assert entries[1].imported_from == "wandb:marin/speedrun/abc123"
    # The threshold track (any recipe, at most 1.3 BPB) has them too, by FLOPs.
    threshold = BoardTrack.objects.get(slug="c4-en-bpb-1-3")
    assert [e.run_name for e in threshold.entries.order_by("rank")] == [
        "llama_130m_adamw/130m",
        "llama_300m_muon/300m",
    ]


def test_manage_board_rank(recipe: Any) -> None:
    a, *_ = four_runs(recipe)
    finish(a, bpb=1.2, flops=2e18)
    t = track()
    out = io.StringIO()
    call_command("board_rank", track=t.slug, stdout=out)
    assert f"{t.slug}: 1 entries, 1 rank changes" in out.getvalue()
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="no track is named 'nope'"):
        call_command("board_rank", track="nope")


def test_runs_finishing_together_ask_for_one_ranking(monkeypatch: Any) -> None:
    from runs.board import rank
    from runs.tasks import board_rank_task

    sent: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(rank, "task_send", lambda name, **kw: sent.append((name, kw)))
    for _ in range(5):  # five runs of one plan finish in the same second
        rank.board_rank_soon("tiny-moe")
    rank.board_rank_soon("marin-moe")
    assert sent == [
        ("runs.board_rank", {"countdown": rank.RANK_DELAY_SECONDS, "recipe_name": "tiny-moe"}),
        ("runs.board_rank", {"countdown": rank.RANK_DELAY_SECONDS, "recipe_name": "marin-moe"}),
    ]
    board_rank_task(recipe_name="tiny-moe")  # the ranking starts: the ask is forgotten
    rank.board_rank_soon("tiny-moe")  # so a run finishing now asks for the next one
    assert len(sent) == 3
