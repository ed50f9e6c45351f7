"""The board's doors: the page, the API, the runs.json export; refusals in words."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.cache import cache
from django.test import Client

from proposals.models import Proposal
from runs.models import RunOrigin, RunState
from runs.services import runs as run_writes
from tests.factories import UserFactory
from tests.runs.board.board_helpers import finish, four_runs, track

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


def test_bad_query_parameters_are_refused_in_words(client: Client) -> None:
    track()
    unknown = client.get("/board/?track=nope")
    assert unknown.status_code == 404
    bad = client.get("/board/?page=abc")
    assert bad.status_code == 400 and b"page" in bad.content and b"whole number" in bad.content
    assert client.get("/board/?page=0").status_code == 400
    assert client.get("/board/?page=7").status_code == 404  # no entries: one page
    api = client.get("/api/v1/board/?track=nope")
    assert api.status_code == 404 and "track" in api.json()["detail"]
    assert client.get("/api/v1/board/?page=x").status_code == 404
    assert client.get("/board/runs.json?track=nope").status_code == 404


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
    client: Client, recipe: Any, settings: Any, django_capture_on_commit_callbacks: Any
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
