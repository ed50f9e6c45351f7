"""The board's Atom feed: rank changes in the first ranks of every track (``/board/feed/``),
or of one (``/board/feed/?track=<slug>``), newest first. An unknown track is 404 in words.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.syndication.views import Feed
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.feedgenerator import Atom1Feed
from django.utils.html import escape

from proposals.feeds import ITEMS, xml_text
from runs.board.models import BoardRankChange, BoardTrack
from runs.board.read import TrackUnknown, rank_changes, track_get, tracks_active


class BoardFeed(Feed):
    feed_type = Atom1Feed

    def __call__(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            track_get(request.GET.get("track"), tracks_active())
        except TrackUnknown as problem:  # in words, not the site's bare 404 page
            return HttpResponse(str(problem), status=404, content_type="text/plain; charset=utf-8")
        return super().__call__(request, *args, **kwargs)

    def get_object(self, request: HttpRequest, *args: Any, **kwargs: Any) -> BoardTrack | None:
        slug = request.GET.get("track")
        if not slug:
            return None
        try:
            return track_get(slug, tracks_active())
        except TrackUnknown as problem:
            raise Http404(str(problem)) from problem

    def title(self, obj: BoardTrack | None) -> str:
        base = "marin-site: rank changes on the board"
        return base if obj is None else f"{base}, {xml_text(obj.title)}"

    def subtitle(self, obj: BoardTrack | None) -> str:
        return self.title(obj)

    def link(self, obj: BoardTrack | None) -> str:
        url = settings.SITE_URL + reverse("board:board")
        return url if obj is None else f"{url}?track={obj.slug}"

    def feed_url(self, obj: BoardTrack | None) -> str:
        url = settings.SITE_URL + reverse("board:feed")
        return url if obj is None else f"{url}?track={obj.slug}"

    def items(self, obj: BoardTrack | None) -> Any:
        return rank_changes(obj, limit=ITEMS)

    def item_title(self, item: BoardRankChange) -> str:
        return xml_text(f"Run {item.run_id} {item.message}")

    def item_description(self, item: BoardRankChange) -> str:
        value = f" with {item.track.metric} {item.value:.6g}" if item.value is not None else ""
        return xml_text(
            escape(f"Run {item.run_id} {item.message}{value}.")
            + f' <a href="{settings.SITE_URL}/runs/{item.run_id}/">The run</a>,'
            + f' <a href="{settings.SITE_URL}{item.track.get_absolute_url()}">the track</a>.'
        )

    def item_link(self, item: BoardRankChange) -> str:
        return settings.SITE_URL + item.track.get_absolute_url()

    def item_guid(self, item: BoardRankChange) -> str:
        return f"{settings.SITE_URL}/board/changes/{item.pk}"

    def item_categories(self, item: BoardRankChange) -> list[str]:
        return [xml_text(item.track.slug)]

    def item_pubdate(self, item: BoardRankChange) -> datetime:
        return item.created_at
