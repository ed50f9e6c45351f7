"""The board's writes: a track's entries stored from its ranking, and its rank changes recorded.

``track_rank`` computes a track's ranking (``runs.board.ranking``), replaces its stored
entries in one transaction and, for every run whose place within the track's first
``top_n`` changed (it entered, moved, or left them), records a ``BoardRankChange`` (the
board's feed) and a ``board_rank_changed`` event on the run's timeline (so the proposal's
merged timeline shows it too). A track ranked for the first time records its first
``top_n`` as entered.

``boards_rank_for`` ranks every active track that reads a recipe's runs: the task
``runs.board_rank`` calls it when a run finishes (``runs.receivers``) and after an import;
``manage.py board_rank`` ranks every track again.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from django.core.cache import cache
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from marin_site.doors import Door
from marin_site.events import Verb
from marin_site.invalidation import rows_changed
from marin_site.nudges import task_send
from runs.board.models import BoardEntry, BoardRankChange, BoardTrack
from runs.board.ranking import Ranked, track_ranking
from runs.models import RunEvent

logger = logging.getLogger(__name__)
WRITE_BATCH = 2000


@dataclass
class RankReport:
    track: str
    entries: int
    changes: int


def _change_message(track: BoardTrack, before: int | None, after: int | None) -> str:
    name = f"“{track.title}”"
    if before is None:
        return f"entered {name} at rank {after}"
    if after is None:
        return f"left the first {track.top_n} of {name} (was rank {before})"
    direction = "up" if after < before else "down"
    return f"moved {direction} on {name}: rank {before} → {after}"


def _entry(track: BoardTrack, row: Ranked) -> BoardEntry:
    fields = asdict(row)
    fields.pop("run_id")
    fields.pop("plan_id")
    return BoardEntry(track=track, run_id=row.run_id, plan_id=row.plan_id, **fields)


@transaction.atomic
def track_rank(track: BoardTrack, *, door: str = Door.SYSTEM) -> RankReport:
    """Store ``track``'s ranking and record what changed in its first ``top_n``."""
    track = BoardTrack.objects.select_for_update().get(pk=track.pk)
    ranked = track_ranking(track)
    first_time = track.ranked_at is None
    before = dict(
        BoardEntry.objects.filter(track=track, rank__lte=track.top_n).values_list("run_id", "rank")
    )
    after = {row.run_id: row.rank for row in ranked if row.rank <= track.top_n}
    values = {row.run_id: row.value for row in ranked}
    # Replace the entries: one DELETE, then INSERTs in batches (ranks shift for every run
    # below a newcomer, so most rows change anyway).
    BoardEntry.objects.filter(track=track).delete()
    for start in range(0, len(ranked), WRITE_BATCH):
        BoardEntry.objects.bulk_create(
            [_entry(track, r) for r in ranked[start : start + WRITE_BATCH]]
        )
    changes: list[BoardRankChange] = []
    events: list[RunEvent] = []
    for run_id in sorted(set(before) | set(after), key=lambda r: (after.get(r, 10**9), r)):
        old, new = before.get(run_id), after.get(run_id)
        if old == new and not first_time:
            continue
        if first_time and new is None:
            continue
        message = _change_message(track, None if first_time else old, new)
        changes.append(
            BoardRankChange(
                track=track,
                run_id=run_id,
                from_rank=None if first_time else old,
                to_rank=new,
                value=values.get(run_id),
                message=message,
            )
        )
        events.append(
            RunEvent.build(
                run_id=run_id,
                verb=Verb.BOARD_RANK_CHANGED,
                door=door,
                actor_label="the board",
                message=f"{message} ({track.get_absolute_url()})",
            )
        )
    BoardRankChange.objects.bulk_create(changes)
    RunEvent.objects.bulk_create(events)
    # An UPDATE, not a save: a saved track is ranked again (runs.receivers). Its page rule
    # (runs/invalidation.py) is applied by hand: the board's pages are stale.
    BoardTrack.objects.filter(pk=track.pk).update(ranked_at=timezone.now())
    rows_changed(BoardTrack, [track])
    if events:
        rows_changed(RunEvent, events)
    return RankReport(track=track.slug, entries=len(ranked), changes=len(changes))


RANK_DELAY_SECONDS = 5  # the runs of a plan that finish together are ranked once


def _pending_key(recipe_name: str) -> str:
    return f"board:rank-pending:{recipe_name}"


def board_rank_soon(recipe_name: str) -> None:
    """Ask for the tracks reading ``recipe_name`` to be ranked in a few seconds, once: a run
    finishing while a ranking is already asked for joins it (the task forgets the ask as
    it starts, so a run finishing during a ranking asks for the next one)."""
    if cache.add(_pending_key(recipe_name), 1, timeout=600):
        task_send("runs.board_rank", countdown=RANK_DELAY_SECONDS, recipe_name=recipe_name)


def rank_asked_forget(recipe_name: str) -> None:
    cache.delete(_pending_key(recipe_name))


def tracks_reading(recipe_name: str | None) -> list[BoardTrack]:
    """The active tracks that read runs of ``recipe_name`` (every active track for None)."""
    tracks = BoardTrack.objects.filter(active=True)
    if recipe_name is not None:
        tracks = tracks.filter(Q(recipe_name="") | Q(recipe_name=recipe_name))
    return list(tracks)


def boards_rank_for(recipe_name: str | None = None) -> list[RankReport]:
    """Rank every active track that reads ``recipe_name``'s runs; a track whose stored
    parameters no longer check is logged and left as it was."""
    reports = []
    for track in tracks_reading(recipe_name):
        try:
            reports.append(track_rank(track))
        except ValueError:
            logger.warning("board track %s not ranked: its parameters do not check", track.slug)
    return reports
