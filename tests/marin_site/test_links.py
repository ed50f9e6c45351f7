"""Links kept as canonical ids and shown from settings (marin_site/links.py), and
``manage.py links_rewrite`` (runs/management/commands/links_rewrite.py)."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from marin_site import links
from proposals.models import Comment, Event, Proposal
from runs.models import Recipe
from tests.factories import CommentFactory, ProposalFactory


@pytest.mark.parametrize(
    ("url", "canonical"),
    [
        (
            "https://wandb.ai/marin-community/marin/runs/llama_130m-ab2740",
            "wandb:marin-community/marin/llama_130m-ab2740",
        ),
        ("https://wandb.ai/marin-community/marin/runs/abc?nw=x", "wandb:marin-community/marin/abc"),
        (
            "https://wandb.ai/team/proj/reports/Loss-curves--VmlldzoxMjM",
            "wandb-report:team/proj/Loss-curves--VmlldzoxMjM",
        ),
        ("https://github.com/marin-community/marin/issues/1234", "gh:marin-community/marin#1234"),
        ("https://github.com/marin-community/marin/pull/99", "gh:marin-community/marin#99"),
        ("wandb:a/b/c", "wandb:a/b/c"),
        ("https://example.org/wandb/a/b/runs/c", None),
        ("https://github.com/marin-community/marin/tree/main", None),
        ("ftp://wandb.ai/a/b/runs/c", None),
    ],
)
def test_link_canonical(url: str, canonical: str | None) -> None:
    assert links.link_canonical(url) == canonical


def test_ids_are_shown_on_the_hosts_of_the_settings(settings: Any) -> None:
    settings.WANDB_BASE_URL = "https://wandb.example.org"
    settings.GITHUB_BASE_URL = "https://git.example.org"
    settings.DATA_BROWSER_URL = "https://data.example.org/browse"
    assert links.link_url("wandb:a/b/c") == "https://wandb.example.org/a/b/runs/c"
    assert links.link_url("wandb-report:a/b/slug") == "https://wandb.example.org/a/b/reports/slug"
    assert links.link_url("gh:o/r#7") == "https://git.example.org/o/r/issues/7"
    assert (
        links.link_url("data:gs/bucket/x.jsonl")
        == "https://data.example.org/browse/gs/bucket/x.jsonl"
    )
    assert links.link_url("https://elsewhere.org/") is None
    assert links.link_shown("https://elsewhere.org/") == "https://elsewhere.org/"
    # an address on the configured hosts reads back as the id
    assert links.link_canonical("https://wandb.example.org/a/b/runs/c") == "wandb:a/b/c"
    assert links.link_canonical("https://data.example.org/browse/gs/x") == "data:gs/x"


def test_rewrite_text_moves_whole_hosts_only() -> None:
    text = (
        "See https://old.example.org/a and (http://old.example.org) but not "
        "https://old.example.org.evil.net/x nor https://myold.example.org/y."
    )
    new, moved = links.links_rewrite_text(
        text, old_host="old.example.org", new_host="new.example.org"
    )
    assert moved == 2
    assert new == (
        "See https://new.example.org/a and (http://new.example.org) but not "
        "https://old.example.org.evil.net/x nor https://myold.example.org/y."
    )


@pytest.mark.django_db
@pytest.mark.sqlite  # JSON fields cast to text, on both databases
def test_links_rewrite_moves_bodies_and_links_and_reports_counts() -> None:
    proposal = ProposalFactory.create(
        description="Curves: https://old.example.org/team/p/runs/1 and https://old.example.org/x",
        wandb_url="https://old.example.org/team/p/reports/r",
    )
    comment = CommentFactory.create(proposal=proposal, body="also https://old.example.org/y")
    untouched = ProposalFactory.create(description="nothing here")
    event_count = Event.objects.count()
    out = io.StringIO()
    call_command(
        "links_rewrite", "--from", "old.example.org", "--to", "new.example.org", stdout=out
    )
    proposal.refresh_from_db()
    assert (
        proposal.description
        == "Curves: https://new.example.org/team/p/runs/1 and https://new.example.org/x"
    )
    assert proposal.wandb_url == "https://new.example.org/team/p/reports/r"
    assert Comment.objects.get(pk=comment.pk).body == "also https://new.example.org/y"
    assert Proposal.objects.get(pk=untouched.pk).description == "nothing here"
    assert Event.objects.count() == event_count  # a moved link is no edit on the timeline
    lines = out.getvalue().splitlines()
    assert "proposals.Proposal.description: 1 rows, 2 addresses" in lines
    assert "proposals.Comment.body: 1 rows, 1 addresses" in lines
    assert (
        lines[-1]
        == "moved 4 addresses in 3 fields of rows from old.example.org to new.example.org."
    )


@pytest.mark.django_db
@pytest.mark.sqlite  # JSON fields cast to text, on both databases
def test_links_rewrite_reaches_json_fields_and_dry_runs(recipe: Any) -> None:
    from runs.models import Run
    from tests.runs.runs_helpers import launched_plan

    run = Run.objects.filter(plan=launched_plan(recipe)).first()
    assert run is not None
    Run.objects.filter(pk=run.pk).update(
        tracker_artifacts=[{"uri": "https://old.example.org/a", "name": "c"}]
    )
    Recipe.objects.filter(pk=recipe.pk).update(description="docs at https://old.example.org/d")
    out = io.StringIO()
    call_command(
        "links_rewrite",
        "--from",
        "old.example.org",
        "--to",
        "new.example.org",
        "--dry-run",
        stdout=out,
    )
    assert "would move 2 addresses" in out.getvalue()
    run.refresh_from_db()
    assert run.tracker_artifacts[0]["uri"] == "https://old.example.org/a"
    call_command(
        "links_rewrite",
        "--from",
        "old.example.org",
        "--to",
        "new.example.org",
        stdout=io.StringIO(),
    )
    run.refresh_from_db()
    assert run.tracker_artifacts == [{"uri": "https://new.example.org/a", "name": "c"}]
    assert Recipe.objects.get(pk=recipe.pk).description == "docs at https://new.example.org/d"


@pytest.mark.django_db
@pytest.mark.sqlite  # JSON fields cast to text, on both databases
def test_links_rewrite_refuses_what_is_not_a_host() -> None:
    with pytest.raises(CommandError, match="is not a host name"):
        call_command("links_rewrite", "--from", "https://old.example.org/", "--to", "new.org")
    with pytest.raises(CommandError, match="the same host"):
        call_command("links_rewrite", "--from", "a.org", "--to", "A.org")
