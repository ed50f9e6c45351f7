"""The board's doors: the page, the API, the runs.json export; refusals in words."""

from __future__ import annotations

import json
import re
from typing import Any

import feedparser
import pytest
from django.core.cache import cache
from django.test import Client

from proposals.models import Proposal
from runs.board.models import BoardTrack
from runs.board.rank import track_rank
from runs.models import RunOrigin, RunState
from runs.services import runs as run_writes
from tests.factories import UserFactory
from tests.runs.board.board_helpers import finish, four_runs
from tests.runs.board.board_helpers import track as new_track


def track(*args: Any, **kwargs: Any) -> BoardTrack:
    """A track, ranked (as the nudge after its save would)."""
    made = new_track(*args, **kwargs)
    track_rank(made)
    return made


pytestmark = pytest.mark.django_db

# The fields of Marin's speedrun leaderboard data (experiments/speedrun's runs.json).
RUNS_JSON_FIELDS = {
    "run_name",
    "results_filepath",
    "author",
    "model_size",
    "training_hardware_flops",
    "training_time",
    "model_flops",
    "eval_paloma_c4_en_bpb",
    "wandb_link",
    "run_completion_timestamp",
    "description",
}


def _board(recipe: Any, settings: Any) -> tuple[list[Any], Any]:
    settings.GITHUB_REPOSITORY = "marin-community/marin"
    a, b, c, d = four_runs(recipe)
    author = UserFactory.create(username="grace")
    proposal = Proposal.objects.create(
        title="Fewer FLOPs with a wider router",
        summary="s",
        description="d",
        hypothesis="h",
        recipe=recipe,
        author=author,
        plan=a.plan,
        github_issue_number=4242,
    )
    finish(a, bpb=1.2, flops=1e18, executor="local")
    finish(
        b,
        bpb=1.25,
        flops=2e18,
        origin=RunOrigin.IMPORTED,
        git_sha="",
        metrics={"training_hardware_flops": 5e18, "training_time": 120.0, "model_size": 30_000_000},
    )
    finish(c, bpb=1.0, flops=1e17, state=RunState.FAILED)
    return [a, b, c, d], proposal


def test_the_page_ranks_with_provenance_and_links(
    client: Client, recipe: Any, settings: Any
) -> None:
    (a, b, c, _), proposal = _board(recipe, settings)
    track()
    page = client.get("/board/")
    assert page.status_code == 200
    html = page.content.decode()
    assert f"run {a.pk}" in html and f"run {b.pk}" in html
    assert f"run {c.pk}<" not in html  # failed: never on the board
    assert "verified" in html and "unverified" in html
    assert "grace (launched by the site)" in html
    assert f'href="/proposals/{proposal.pk}/"' in html
    assert "https://github.com/marin-community/marin/issues/4242" in html
    assert html.index(f"run {a.pk}<") < html.index(f"run {b.pk}<")
    assert 'href="/board/"' in html and ">Board</a>" in html  # in the site's navigation
    # The failed attempt stays visible where it belongs: on its proposal's page.
    proposal_page = client.get(f"/proposals/{proposal.pk}/").content.decode()
    assert f"/runs/{c.pk}/" in proposal_page


@pytest.mark.parametrize(
    ("url", "status", "words"),
    [
        ("/board/?track=nope", 404, "no track is named &#x27;nope&#x27;"),
        ("/board/?page=abc", 400, "is not a whole number from 1"),
        ("/board/?page=0", 400, "is not a whole number from 1"),
        ("/board/?page=%C2%B2", 400, "is not a whole number from 1"),
        ("/board/?page=-1", 400, "is not a whole number from 1"),
        ("/board/?track=%00%F0%9F%92%A5" + "x" * 500, 404, "no track is named"),
        ("/board/?page=99999999", 400, "is not a whole number from 1"),
        ("/board/?page=7", 400, "past the last page of this track (1)"),
        ("/board/chart.json?track=nope", 404, "no track is named"),
        ("/board/runs.json?track=nope", 404, "no track is named"),
        ("/board/feed/?track=nope", 404, "no track is named"),
        ("/api/v1/board/?track=nope", 404, "no track is named"),
        ("/api/v1/board/?page=x", 404, "Invalid page"),
        ("/api/v1/board/?page=5", 404, "Invalid page"),
    ],
)
def test_bad_query_parameters_are_refused_in_words(
    client: Client, url: str, status: int, words: str
) -> None:
    track()
    response = client.get(url)
    assert response.status_code == status
    body = b"".join(response.streaming_content) if response.streaming else response.content  # type: ignore[attr-defined]
    assert words in body.decode()


def test_no_track_at_all_is_said_in_words(client: Client) -> None:
    BoardTrack.objects.all().delete()
    page = client.get("/board/")
    assert page.status_code == 200 and "No tracks yet" in page.content.decode()
    assert client.get("/api/v1/board/").json()["detail"] == "track: there are no tracks yet"
    assert client.get("/board/runs.json").status_code == 404


def test_the_api_is_paginated(client: Client, recipe: Any, settings: Any) -> None:
    (a, b, *_), _proposal = _board(recipe, settings)
    track()
    body = client.get("/api/v1/board/").json()
    assert body["count"] == 2 and body["track"]["rule"] == "speedrun_threshold"
    first, second = body["results"]
    assert (first["run_id"], first["rank"], first["label"]) == (a.pk, 1, "verified")
    assert first["proposal"]["issue"] == 4242 and first["proposal"]["author"] == "grace"
    assert (second["run_id"], second["label"], second["origin"]) == (b.pk, "unverified", "imported")


def test_the_export_is_streamed_in_the_speedrun_shape(
    client: Client, recipe: Any, settings: Any
) -> None:
    _board(recipe, settings)
    track()
    response = client.get("/board/runs.json")
    assert response.streaming and response["Content-Type"] == "application/json"
    rows = json.loads(b"".join(response.streaming_content))  # type: ignore[attr-defined]
    assert [set(r) for r in rows] == [RUNS_JSON_FIELDS, RUNS_JSON_FIELDS]
    assert rows[0]["author"] == {"name": "grace", "affiliation": "", "url": None}
    assert rows[0]["model_flops"] == 1e18 and rows[0]["eval_paloma_c4_en_bpb"] == 1.2
    assert rows[1]["training_hardware_flops"] == 5e18 and rows[1]["model_size"] == 30_000_000
    assert "unverified" in rows[1]["description"]


def test_a_newly_finished_run_refreshes_the_cached_page(
    client: Client,
    recipe: Any,
    settings: Any,
    django_capture_on_commit_callbacks: Any,
    eager: None,
) -> None:
    settings.PAGE_CACHE_SECONDS = 30
    cache.clear()
    a, b, *_ = four_runs(recipe)
    finish(a, bpb=1.2, flops=1e18)
    track()
    client.get("/board/")
    assert client.get("/board/")["X-Page-Cache"] == "hit"
    with django_capture_on_commit_callbacks(execute=True):
        run_writes.run_transition(run_id=b.pk, to_state=RunState.RUNNING, door="worker")
        finish(b, bpb=1.1, flops=5e17, state=RunState.RUNNING)
        run_writes.run_transition(run_id=b.pk, to_state=RunState.FINISHED, door="worker")
    fresh = client.get("/board/")
    assert fresh["X-Page-Cache"] == "miss" and f"run {b.pk}<" in fresh.content.decode()


def test_a_signed_in_reader_sees_the_same_board(
    client: Client, recipe: Any, settings: Any, contributor: Any
) -> None:
    settings.PAGE_CACHE_SECONDS = 30
    (a, b, *_), _proposal = _board(recipe, settings)
    track()
    client.force_login(contributor)
    page = client.get("/board/")
    assert page.status_code == 200 and "X-Page-Cache" not in page  # never the public cache
    html = page.content.decode()
    assert html.index(f"run {a.pk}<") < html.index(f"run {b.pk}<")
    assert "carla" in html  # the signed-in header


def test_the_chart_data_has_the_points_and_the_pareto_frontier(
    client: Client, recipe: Any, settings: Any
) -> None:
    a, b, c, _ = four_runs(recipe)
    finish(a, bpb=1.2, flops=1e18)
    finish(b, bpb=1.25, flops=2e18, origin=RunOrigin.IMPORTED, git_sha="")  # beaten by a
    finish(c, bpb=1.1, flops=3e18)
    track(rule="lowest", parameters={})
    page = client.get("/board/").content.decode()
    assert 'data-chart-url="/board/chart.json?track=bpb-1-3"' in page
    assert "/static/uplot/uPlot.iife.min.js" in page and "/static/js/board.js" in page
    data = client.get("/board/chart.json?track=bpb-1-3").json()
    assert [(p["run"], p["verified"]) for p in data["points"]] == [
        (c.pk, True),
        (a.pk, True),
        (b.pk, False),
    ]
    assert data["frontier"] == [{"flops": 1e18, "value": 1.2}, {"flops": 3e18, "value": 1.1}]


def test_the_feed_is_atom_with_the_rank_changes(
    client: Client, recipe: Any, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    settings.SITE_URL = "http://site.test"
    (a, *_), _proposal = _board(recipe, settings)
    t = track(title="Fastest <to> 1.3 & more")
    other = new_track("other", title="Other", position=5)
    BoardTrack.objects.filter(pk__in=[t.pk, other.pk]).update(active=True)
    for url, count in (("/board/feed/", 2), (f"/board/feed/?track={t.slug}", 2)):
        response = client.get(url)
        assert response["Content-Type"].startswith("application/atom+xml")
        feed = feedparser.parse(response.content)
        assert not feed.bozo and feed.version == "atom10"
        assert len(feed.entries) == count
        titles = [e.title for e in feed.entries]
        assert f"Run {a.pk} entered “Fastest <to> 1.3 & more” at rank 1" in titles
        assert all(e.link == "http://site.test/board/?track=bpb-1-3" for e in feed.entries)
    assert len(feedparser.parse(client.get("/board/feed/?track=other").content).entries) == 0
    page = client.get("/board/").content.decode()
    assert 'type="application/atom+xml" title="marin-site: rank changes on the board"' in page
    assert "Latest rank changes" in page


def test_the_api_lists_the_tracks_and_is_in_the_schema(
    client: Client, recipe: Any, settings: Any
) -> None:
    _board(recipe, settings)
    track()
    tracks = client.get("/api/v1/board/tracks/").json()
    assert [(t["slug"], t["entries"], t["rule"]) for t in tracks] == [
        ("bpb-1-3", 2, "speedrun_threshold")
    ]
    schema = client.get("/api/schema/?format=json")
    assert schema.status_code == 200
    document = json.loads(schema.content)
    board = document["paths"]["/api/v1/board/"]["get"]
    assert {"track", "page"} <= {p["name"] for p in board["parameters"]}
    assert "/api/v1/board/tracks/" in document["paths"]
    entry = document["components"]["schemas"]["BoardEntry"]["properties"]
    assert {"verified", "origin", "ran_by", "git_sha", "config_hash", "proposal"} <= set(entry)


def test_the_export_reads_back_through_the_speedrun_importer(
    client: Client, recipe: Any, settings: Any
) -> None:
    """What the board exports is what Marin's leaderboard data is: the site's own speedrun
    importer reads it back, entry by entry."""
    from runs.imports.speedrun import _results

    _board(recipe, settings)
    track()
    rows = json.loads(b"".join(client.get("/board/runs.json").streaming_content))  # type: ignore[attr-defined]
    read = _results(rows, "runs.json")
    assert [place for place, result in read if isinstance(result, str)] == ["entry 1"]
    # The launched run has no model_size, hardware FLOPs or training time: null, so the
    # importer refuses it rather than take made-up zeros; the imported one reads back whole.
    imported = read[1][1]
    assert not isinstance(imported, str)
    assert imported.figures["eval/paloma/c4_en/bpb"] == 1.25
    assert imported.figures["model_flops"] == 2e18
    assert rows[0]["model_size"] is None and rows[0]["run_completion_timestamp"] is None


def test_a_signed_in_reader_gets_the_kept_section_until_the_next_ranking(
    client: Client,
    recipe: Any,
    settings: Any,
    contributor: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    settings.FRAGMENT_CACHE_SECONDS = 600
    cache.clear()
    a, b, *_ = four_runs(recipe)
    finish(a, bpb=1.2, flops=1e18)
    t = track()
    client.force_login(contributor)
    first = client.get("/board/").content.decode()
    with CaptureQueriesContext(connection) as kept:
        again = client.get("/board/").content.decode()
    token = re.compile(r'name="csrfmiddlewaretoken" value="[^"]+"')
    assert token.sub("", again) == token.sub("", first)  # each response has its own token
    tables = " ".join(q["sql"] for q in kept.captured_queries)
    assert "runs_boardentry" not in tables and "proposals_proposal" not in tables
    api = client.get("/api/v1/board/").json()
    assert [r["run_id"] for r in api["results"]] == [a.pk]
    finish(b, bpb=1.1, flops=5e17)
    with django_capture_on_commit_callbacks(execute=True):
        track_rank(t)  # a ranking bumps the track's version once it commits

    fresh = client.get("/board/").content.decode()
    assert fresh.index(f"run {b.pk}<") < fresh.index(f"run {a.pk}<")
    assert [r["run_id"] for r in client.get("/api/v1/board/").json()["results"]] == [b.pk, a.pk]
    chart = client.get("/board/chart.json").json()
    assert [p["run"] for p in chart["points"]] == [b.pk, a.pk]
