"""The board as its pages read it: the active tracks, a page of a track's stored entries, the
points of its Pareto chart and its rank changes. Every read is of the stored tables
(``runs.board.models``) by an index, so a page of a track of 10,000 entries is a few
milliseconds; ``runs.board.rank`` keeps them current.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db.models import QuerySet

from runs.board.models import BoardEntry, BoardRankChange, BoardTrack

CHART_POINTS = 2000  # the chart draws the best ranks and the whole frontier
# The fragments of a track's pages carry its version ("board", track id): every ranking of
# the track bumps it (runs/invalidation.py), and nothing else does.
BOARD_VERSION = "board"


class TrackUnknown(LookupError):
    """No active track has this slug (the message says which)."""


def tracks_active() -> list[BoardTrack]:
    return list(BoardTrack.objects.filter(active=True))


def track_get(slug: str | None, tracks: list[BoardTrack]) -> BoardTrack | None:
    """The track named ``slug`` among ``tracks`` (the first one when no slug is given);
    ``TrackUnknown`` in words when there is none of that name."""
    if not slug:
        return tracks[0] if tracks else None
    for track in tracks:
        if track.slug == slug:
            return track
    shown = slug[:63]
    known = ", ".join(t.slug for t in tracks[:20]) or "none yet"
    raise TrackUnknown(f"track: no track is named {shown!r} (the tracks: {known})")


def entries(track: BoardTrack) -> QuerySet[BoardEntry]:
    return BoardEntry.objects.filter(track=track).order_by("rank")


def entries_page(track: BoardTrack, *, start: int, size: int) -> list[BoardEntry]:
    return list(entries(track)[start : start + size])


def entries_count(track: BoardTrack) -> int:
    return entries(track).count()


def entries_stream(track: BoardTrack, *, chunk: int = 1000) -> Iterator[list[BoardEntry]]:
    """The track's entries in rank order, ``chunk`` at a time (one query per chunk, by the
    (track, rank) index: the export never holds the whole board)."""
    after = 0
    while True:
        rows = list(entries(track).filter(rank__gt=after)[:chunk])
        if not rows:
            return
        yield rows
        after = rows[-1].rank


def pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The frontier of (flops, loss) points: each point no other beats on both (fewer or as
    many FLOPs and a lower loss), by FLOPs."""
    frontier: list[tuple[float, float]] = []
    best = float("inf")
    for flops, loss in sorted(points):
        if loss < best:
            frontier.append((flops, loss))
            best = loss
    return frontier


def chart_data(track: BoardTrack) -> dict[str, Any]:
    """The Pareto chart of a track: its metric against FLOPs for its best ``CHART_POINTS``
    ranks (verified and unverified apart) and the frontier over every entry."""
    every = list(
        entries(track)
        .filter(flops__isnull=False)
        .values_list("flops", "value", "verified", "run_id", "rank")
    )
    frontier = pareto([(f, v) for f, v, *_ in every if f is not None])
    shown = sorted((row for row in every if row[4] <= CHART_POINTS), key=lambda r: r[4])
    return {
        "track": track.slug,
        "metric": track.metric,
        "entries": len(every),
        "shown": len(shown),
        "points": [
            {"flops": f, "value": v, "verified": ok, "run": run, "rank": rank}
            for f, v, ok, run, rank in shown
        ],
        "frontier": [{"flops": f, "value": v} for f, v in frontier],
    }


def rank_changes(track: BoardTrack | None, *, limit: int = 50) -> QuerySet[BoardRankChange]:
    rows = BoardRankChange.objects.select_related("track").filter(track__active=True)
    if track is not None:
        rows = rows.filter(track=track)
    return rows.order_by("-created_at", "-pk")[:limit]
