"""The board's pages: ``/board/`` (a track's ranked entries, its Pareto chart, its latest rank
changes), ``/board/chart.json`` (the chart's points) and ``/board/runs.json`` (a track's
entries in the fields of Marin's speedrun leaderboard data, streamed).

Query parameters are checked and refused in words: an unknown ``track`` is 404, a ``page``
that is not a whole number from 1, or past the last page, is 400; the page says which.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import render
from django.utils.functional import cached_property

from marin_site.fragments import Dependency, Fragments
from marin_site.roles import roles_kept
from proposals.github.client import issue_html_url
from proposals.models import Proposal
from proposals.pages import site_header, site_header_refine
from runs.board.models import BPB_KEY, BoardEntry, BoardTrack
from runs.board.read import (
    BOARD_VERSION,
    TrackUnknown,
    chart_data,
    entries_count,
    entries_page,
    entries_stream,
    rank_changes,
    track_get,
    tracks_active,
)

PAGE_ENTRIES = 50
MAX_PAGE = 100_000


class BadQuery(ValueError):
    """A query parameter the board cannot read; the message names it."""


def page_number(raw: str | None) -> int:
    if raw is None or raw == "":
        return 1
    # ASCII digits only: "²" is a digit to str.isdigit, and not a number to int().
    if len(raw) > 6 or not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_PAGE:
        raise BadQuery(f"page: {raw[:20]!r} is not a whole number from 1 to {MAX_PAGE}")
    return int(raw)


def _refused(request: HttpRequest, problem: str, status: int) -> HttpResponse:
    if request.path.endswith(".json"):
        return JsonResponse({"detail": problem}, status=status)
    return render(
        request, "refused.html", {"problems": [problem], "back": "/board/"}, status=status
    )


def proposal_links(plan_ids: set[int]) -> dict[int, dict[str, Any]]:
    """The proposal of each plan, with its GitHub issue and its author (one query)."""
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


def entry_row(entry: BoardEntry, proposal: dict[str, Any] | None) -> dict[str, Any]:
    """One entry as the page, the API and the export read it."""
    return {
        "rank": entry.rank,
        "run_id": entry.run_id,
        "run_url": f"/runs/{entry.run_id}/",
        "plan_id": entry.plan_id,
        "score": entry.score,
        "value": entry.value,
        "flops": entry.flops,
        "label": entry.label,
        "verified": entry.verified,
        "origin": entry.origin,
        "ran_by": entry.ran_by,
        "executor": entry.executor,
        "pool": entry.pool,
        "agent": entry.agent,
        "git_sha": entry.git_sha,
        "config_hash": entry.config_hash,
        "recipe": entry.recipe,
        "run_name": entry.run_name,
        "description": entry.description,
        "finished_at": entry.finished_at.isoformat() if entry.finished_at else None,
        "wandb_url": entry.wandb_url,
        "imported_from": entry.imported_from,
        "model_size": entry.model_size,
        "training_time": entry.training_time,
        "training_hardware_flops": entry.training_hardware_flops,
        "note": entry.note,
        "proposal": proposal,
    }


def entry_rows(entries: list[BoardEntry]) -> list[dict[str, Any]]:
    links = proposal_links({e.plan_id for e in entries})
    return [entry_row(e, links.get(e.plan_id)) for e in entries]


class _TrackSection:
    """What the track's section shows (its count, a page of entries with their proposals, its
    latest changes), read only when the section is rendered, not when it is a kept fragment."""

    def __init__(self, track: BoardTrack, page: int) -> None:
        self.track = track
        self.page = page

    @cached_property
    def total(self) -> int:
        return entries_count(self.track)

    @cached_property
    def pages(self) -> int:
        return max(1, -(-self.total // PAGE_ENTRIES))

    @cached_property
    def rows(self) -> list[dict[str, Any]]:
        start = (self.page - 1) * PAGE_ENTRIES
        return entry_rows(entries_page(self.track, start=start, size=PAGE_ENTRIES))

    @cached_property
    def changes(self) -> list[Any]:
        return list(rank_changes(self.track, limit=10))

    @property
    def previous_page(self) -> int | None:
        return self.page - 1 if self.page > 1 else None

    @property
    def next_page(self) -> int | None:
        return self.page + 1 if self.page < self.pages else None


def board(request: HttpRequest) -> HttpResponse:
    """The board page. The track's section is one fragment for every reader (named by track
    and page, versioned by the track's ``("board", pk)``, which each ranking bumps), so a
    signed-in reader's page is their header plus the kept section."""
    try:
        page = page_number(request.GET.get("page"))
        tracks = tracks_active()
        track = track_get(request.GET.get("track"), tracks)
    except BadQuery as problem:
        return _refused(request, str(problem), 400)
    except TrackUnknown as problem:
        return _refused(request, str(problem), 404)
    header = site_header(request)
    body = f"board-track:{track.pk}:{page}" if track is not None else ""
    wanted: dict[str, list[Dependency]] = {header: [], "site-footer": []}
    if track is not None:
        wanted[body] = [(BOARD_VERSION, track.pk)]
    fragments = Fragments(wanted, shared=roles_kept(request.user))
    site_header_refine(fragments, header, request)
    section = _TrackSection(track, page) if track is not None else None
    # A kept section was a page that existed under the same version; else check it now.
    if section is not None and fragments.get(body) is None and page > section.pages:
        return _refused(
            request, f"page: {page} is past the last page of this track ({section.pages})", 400
        )
    response = render(
        request,
        "proposals/board/board.html",
        {
            "tracks": tracks,
            "track": track,
            "section": section,
            "fragments": fragments,
            "site_header": header,
            "board_fragment": body,
        },
    )
    fragments.save()
    return response


def board_chart(request: HttpRequest) -> HttpResponse:
    try:
        track = track_get(request.GET.get("track"), tracks_active())
    except TrackUnknown as problem:
        return _refused(request, str(problem), 404)
    if track is None:
        return _refused(request, "track: there are no tracks yet", 404)
    name = f"board-chart:{track.pk}"
    fragments = Fragments({name: [(BOARD_VERSION, track.pk)]})
    data = fragments.get_or_render(name, lambda: chart_data(track))
    fragments.save()
    return JsonResponse(data)


def _when(entry: BoardEntry) -> str | None:
    """Marin's format of ``run_completion_timestamp`` (``2025-06-27 06:41:56 UTC``)."""
    return entry.finished_at.strftime("%Y-%m-%d %H:%M:%S UTC") if entry.finished_at else None


def speedrun_record(
    entry: BoardEntry, proposal: dict[str, Any] | None, *, bpb: bool = True
) -> dict[str, Any]:
    """One entry in the fields of Marin's speedrun leaderboard data (``runs.json``). A figure
    the run does not have is null, never made up (so is the BPB of a track that reads another
    metric, ``bpb=False``); the description says where the entry comes from and whether the
    site verified it."""
    author = entry.ran_by
    if entry.origin == "launched" and proposal and proposal.get("author"):
        author = proposal["author"]
    provenance = f"{entry.label}: {entry.origin}" + (
        f" from {entry.imported_from}" if entry.imported_from else ""
    )
    if entry.git_sha:
        provenance += f", commit {entry.git_sha[:12]}"
    parts = [entry.description or entry.recipe, f"[{provenance}]"]
    if proposal:
        parts.append(f"proposal: {proposal['title']}")
    return {
        "run_name": entry.run_name,
        "results_filepath": entry.results_filepath or f"{settings.SITE_URL}/runs/{entry.run_id}/",
        "author": {
            "name": author,
            "affiliation": entry.author_affiliation,
            "url": entry.author_url or None,
        },
        "model_size": int(entry.model_size) if entry.model_size is not None else None,
        "training_hardware_flops": entry.training_hardware_flops,
        "training_time": entry.training_time,
        "model_flops": entry.flops,
        "eval_paloma_c4_en_bpb": entry.value if bpb else None,
        "wandb_link": entry.wandb_url or None,
        "run_completion_timestamp": _when(entry),
        "description": " ".join(parts),
    }


def _export(track: BoardTrack) -> Iterator[str]:
    bpb = track.metric == BPB_KEY
    yield "["
    first = True
    for chunk in entries_stream(track):
        links = proposal_links({e.plan_id for e in chunk})
        for entry in chunk:
            record = speedrun_record(entry, links.get(entry.plan_id), bpb=bpb)
            yield ("\n" if first else ",\n") + json.dumps(record)
            first = False
    yield "\n]\n"


def board_export(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    try:
        track = track_get(request.GET.get("track"), tracks_active())
    except TrackUnknown as problem:
        return _refused(request, str(problem), 404)
    if track is None:
        return _refused(request, "track: there are no tracks yet", 404)
    response = StreamingHttpResponse(_export(track), content_type="application/json")
    response["Content-Disposition"] = f'inline; filename="runs-{track.slug}.json"'
    return response
