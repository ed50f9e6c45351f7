"""The board page and its export in the shape of Marin's speedrun leaderboard (``runs.json``).

Query parameters are checked and refused in words: an unknown ``track`` is 404, a ``page``
that is not a whole number from 1 is 400.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    StreamingHttpResponse,
)
from django.shortcuts import render

from proposals.github.client import issue_html_url
from proposals.models import Proposal
from runs.board.models import BoardTrack
from runs.board.read import Entry, track_entries, tracks_active

PAGE_ENTRIES = 50
MAX_PAGE = 10_000


class BadQuery(ValueError):
    pass


def page_number(raw: str | None) -> int:
    if raw is None or raw == "":
        return 1
    if len(raw) > 6 or not raw.isdigit() or int(raw) < 1 or int(raw) > MAX_PAGE:
        raise BadQuery(f"page: {raw[:20]!r} is not a whole number from 1 to {MAX_PAGE}")
    return int(raw)


def track_chosen(raw: str | None, tracks: list[BoardTrack]) -> BoardTrack | None:
    if raw is None or raw == "":
        return tracks[0] if tracks else None
    for track in tracks:
        if track.slug == raw:
            return track
    raise Http404(f"track: no track named {raw[:63]!r}")


def proposal_links(plan_ids: set[int]) -> dict[int, dict[str, Any]]:
    """The proposal of each plan (the plan -> proposal reverse relation), with its issue."""
    links: dict[int, dict[str, Any]] = {}
    for pk, plan_id, title, number, author in Proposal.objects.filter(
        plan_id__in=plan_ids
    ).values_list("pk", "plan_id", "title", "github_issue_number", "author__username"):
        links[plan_id] = {
            "id": pk,
            "title": title,
            "url": f"/proposals/{pk}/",
            "issue": number,
            "issue_url": issue_html_url(number) if number else "",
            "author": author or "",
        }
    return links


def entry_rows(entries: list[Entry]) -> list[dict[str, Any]]:
    links = proposal_links({e.plan_id for e in entries})
    rows = []
    for entry in entries:
        row = entry.as_dict()
        row["proposal"] = links.get(entry.plan_id)
        rows.append(row)
    return rows


def board(request: HttpRequest) -> HttpResponse:
    try:
        page = page_number(request.GET.get("page"))
    except BadQuery as problem:
        return HttpResponseBadRequest(str(problem), content_type="text/plain; charset=utf-8")
    tracks = tracks_active()
    track = track_chosen(request.GET.get("track"), tracks)
    rows: list[dict[str, Any]] = []
    total = 0
    if track is not None:
        entries = track_entries(track)
        total = len(entries)
        start = (page - 1) * PAGE_ENTRIES
        rows = entry_rows(entries[start : start + PAGE_ENTRIES])
    pages = max(1, -(-total // PAGE_ENTRIES))
    if page > pages:
        raise Http404(f"page: there are {pages} pages on this track")
    return render(
        request,
        "proposals/board/board.html",
        {
            "tracks": tracks,
            "track": track,
            "rows": rows,
            "total": total,
            "page": page,
            "pages": pages,
            "previous_page": page - 1 if page > 1 else None,
            "next_page": page + 1 if page < pages else None,
        },
    )


def speedrun_record(row: dict[str, Any]) -> dict[str, Any]:
    """One entry in the fields of Marin's speedrun leaderboard data (``runs.json``)."""
    proposal = row.get("proposal") or {}
    author = proposal.get("author") or row["ran_by"]
    return {
        "run_name": f"run-{row['run_id']}",
        "results_filepath": f"/runs/{row['run_id']}/",
        "author": {"name": author, "affiliation": "", "url": None},
        "model_size": int(row["model_size"] or 0),
        "training_hardware_flops": row["training_hardware_flops"] or 0.0,
        "training_time": row["training_time"] or 0.0,
        "model_flops": row["flops"],
        "eval_paloma_c4_en_bpb": row["value"],
        "wandb_link": row["wandb_url"] or None,
        "run_completion_timestamp": row["finished_at"],
        "description": (
            f"{row['recipe']}; {row['label']} ({row['origin']})"
            + (f"; {proposal['title']}" if proposal.get("title") else "")
        ),
    }


def _stream(track: BoardTrack) -> Iterator[str]:
    entries = track_entries(track)
    yield "["
    for start in range(0, len(entries), 500):
        rows = entry_rows(entries[start : start + 500])
        for i, row in enumerate(rows):
            yield ("," if start or i else "") + json.dumps(speedrun_record(row))
    yield "]"


def board_export(request: HttpRequest) -> StreamingHttpResponse:
    tracks = tracks_active()
    track = track_chosen(request.GET.get("track"), tracks)
    if track is None:
        raise Http404("track: there are no tracks")
    return StreamingHttpResponse(_stream(track), content_type="application/json")
