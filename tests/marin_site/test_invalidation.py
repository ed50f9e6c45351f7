"""The one table of what a write makes stale (marin_site/invalidation.py): every table a kept
page reads has a rule, or a stated reason to need none; and the rules do what they say."""

from __future__ import annotations

import re
from io import StringIO
from typing import Any

import pytest
from django.apps import apps
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import resolve, reverse

from marin_site import fragments, invalidation, pagecache
from proposals.models import Comment, Proposal, State
from runs.board.models import BoardTrack
from runs.models import Campaign, Run

pytestmark = pytest.mark.django_db

# Tables a kept page reads whose writes need no rule, and why. Anything else a kept page
# reads must have a rule in an app's invalidation.py.
NO_RULE_NEEDED = {
    "sessions.Session": "the reader's session: a kept page is never a session's",
    "runs.PlanEntry": "written once, with its plan, which is frozen",
    "runs.MetricSummary": (
        "written by the ingest's bulk upserts while a run runs: a page showing a plan in "
        "flight is never kept (Cache-Control: private), and the run's end saves its Run"
    ),
    "runs.MetricSeries": "the same: chart data is read by the page's script, never kept",
    "runs.MetricPoint": "the same",
}

TABLE = re.compile(r'(?:FROM|JOIN)\s+"([a-z0-9_]+)"', re.IGNORECASE)


def _models_by_table() -> dict[str, str]:
    found: dict[str, str] = {}
    for model in apps.get_models(include_auto_created=True):
        found[model._meta.db_table] = model._meta.label
    return found


def _kept_page_urls() -> list[str]:
    """A URL of every view the page cache keeps, for proposals in every state, and the
    campaigns'."""
    urls = [
        reverse("proposals:list"),
        reverse("proposals:list") + "?state=approved",
        reverse("proposals:archive"),
        reverse("proposals:search") + "?q=loss",
        reverse("proposal-list"),
        reverse("campaigns:list"),
    ]
    for state in State.values:
        proposal = Proposal.objects.filter(state=state).first()
        if proposal is not None:
            urls.append(reverse("proposals:detail", args=[proposal.pk]))
            urls.append(reverse("proposal-detail", args=[proposal.pk]))
    urls += [reverse("campaigns:detail", args=[c.slug]) for c in Campaign.objects.all()]
    # The board, every demo track (seed_demo ranks them).
    for slug in BoardTrack.objects.filter(active=True).values_list("slug", flat=True):
        urls += [
            f"{reverse('board:board')}?track={slug}",
            f"{reverse('board:chart')}?track={slug}",
            f"{reverse('board-entries')}?track={slug}",
        ]
    urls.append(reverse("board-tracks"))
    return urls


def test_every_table_a_kept_page_reads_has_a_rule(client: Any, settings: Any) -> None:
    settings.DEBUG = True  # the demo's accounts
    call_command("seed_demo", stdout=StringIO())
    urls = _kept_page_urls()
    views = {resolve(url.split("?")[0]).view_name for url in urls}
    assert views == set(django_settings.PAGE_CACHE_VIEWS), "render every kept view here"
    tables: set[str] = set()
    for who in (None, "max"):  # anonymous (the page cache), a maintainer (the fragments)
        if who is not None:
            client.force_login(get_user_model().objects.get(username=who))
        for url in urls:
            with CaptureQueriesContext(connection) as queries:
                response = client.get(url)
            assert response.status_code == 200, url
            for query in queries.captured_queries:
                tables.update(TABLE.findall(query["sql"]))
    by_table = _models_by_table()
    read = {by_table[table] for table in tables if table in by_table}
    assert {"proposals.Proposal", "runs.Run", "runs.RunEvent", "proposals.Review"} <= read
    missing = sorted(
        label
        for label in read
        if label not in NO_RULE_NEEDED and not invalidation.rules_for(apps.get_model(label))
    )
    assert missing == []


def test_a_write_makes_stale_what_its_rule_says(
    django_capture_on_commit_callbacks: Any, proposal: Proposal, settings: Any
) -> None:
    settings.FRAGMENT_CACHE_SECONDS = 600
    cache.clear()
    before_generation = cache.get(pagecache.GENERATION_KEY, 0)
    key = fragments.version_key("proposal", proposal.pk)
    other = fragments.version_key("proposal", proposal.pk + 1000)
    cache.set_many({key: "old", other: "old"})
    with django_capture_on_commit_callbacks(execute=True):
        Comment.objects.create(proposal=proposal, author=proposal.author, body="a comment")
    assert cache.get(key) != "old"  # the proposal's fragments are stale
    assert cache.get(other) == "old"  # another proposal's are not
    assert cache.get(pagecache.GENERATION_KEY, 0) != before_generation


def test_a_bulk_write_applies_the_rule_through_rows_changed(
    django_capture_on_commit_callbacks: Any, proposal: Proposal
) -> None:
    key = fragments.version_key("proposal", proposal.pk)
    cache.set(key, "old")
    with django_capture_on_commit_callbacks(execute=True):
        Proposal.objects.filter(pk=proposal.pk).update(title="Renamed in bulk")
    assert cache.get(key) == "old"  # update() sends no signal
    with django_capture_on_commit_callbacks(execute=True):
        invalidation.rows_changed(Proposal, [proposal.pk])
    assert cache.get(key) != "old"


def test_every_rule_names_a_model_and_says_why() -> None:
    table = invalidation.rules()
    assert set(table) == {"proposals", "runs"}
    for found in table.values():
        for rule in found:
            assert apps.get_model(rule.model) is not None
            assert rule.why and (rule.page or rule.versions is not None)
    assert invalidation.rules_for(Run)  # runs' own pages
    assert len(invalidation.rules_for(apps.get_model("runs.Recipe"))) == 2  # and proposals'


def test_a_batch_of_run_transitions_tells_the_pages(
    django_capture_on_commit_callbacks: Any, recipe: Any
) -> None:
    """An agents' grant or a dispatch moves many runs in a few statements, past the signals
    (``runs_transition``, ``runs_save``): the page cache's generation is bumped as a save
    would bump it, so a kept page does not show the runs' old state."""
    from marin_site.doors import Door
    from runs.models import RunState
    from runs.services.runs import Move, runs_transition
    from tests.runs.runs_helpers import launched_plan

    def bumped(write: Any) -> bool:
        before = cache.get(pagecache.GENERATION_KEY, 0)
        with django_capture_on_commit_callbacks(execute=True):
            write()
        return cache.get(pagecache.GENERATION_KEY, 0) != before

    plan = launched_plan(recipe)
    moves = [Move(pk) for pk in Run.objects.filter(plan=plan).values_list("pk", flat=True)]
    assert moves
    assert not bumped(lambda: None)  # the check can fail
    assert bumped(lambda: runs_transition(moves=moves, to_state=RunState.RUNNING, door=Door.WORKER))


def test_rows_changed_reads_no_row_for_a_rule_that_needs_none(
    django_capture_on_commit_callbacks: Any, recipe: Any
) -> None:
    """A run's rule only bumps the page generation: ids given are not fetched for it."""
    from tests.runs.runs_helpers import launched_plan

    ids = list(Run.objects.filter(plan=launched_plan(recipe)).values_list("pk", flat=True))
    before = cache.get(pagecache.GENERATION_KEY, 0)
    with django_capture_on_commit_callbacks(execute=True), CaptureQueriesContext(connection) as q:
        invalidation.rows_changed(Run, ids)
    assert [query["sql"] for query in q.captured_queries] == []
    assert cache.get(pagecache.GENERATION_KEY, 0) != before
