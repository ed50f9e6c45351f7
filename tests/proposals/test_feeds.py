"""The Atom feeds, read by a feed parser: the right entries, per label, hostile text escaped,
and found from the home page's head."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import feedparser
import pytest
from django.test import Client
from django.utils import timezone

from proposals.models import Label, Outcome, Proposal, State
from runs.alerts.models import Alert
from runs.campaigns.models import Campaign, Intervention, InterventionKind
from runs.models import Run
from tests.factories import ProposalFactory
from tests.runs.runs_helpers import launched_plan

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _site_url(settings: Any) -> None:
    settings.SITE_URL = "http://site.test"


def parse(client: Client, url: str) -> Any:
    response = client.get(url)
    assert response.status_code == 200, url
    assert response["Content-Type"].startswith("application/atom+xml")
    feed = feedparser.parse(response.content)
    assert not feed.bozo, feed.get("bozo_exception")  # well-formed XML
    assert feed.version == "atom10"
    return feed


@pytest.fixture
def proposals(contributor: Any, recipe: Any) -> dict[str, Proposal]:
    moe, data = Label.objects.create(name="moe"), Label.objects.create(name="data")
    now = timezone.now()
    made = {
        "draft": ProposalFactory.create(author=contributor, recipe=recipe, title="A draft"),
        "router": ProposalFactory.create(
            author=contributor, recipe=recipe, title="Router z-loss", state=State.SUBMITTED
        ),
        "worked": ProposalFactory.create(
            author=contributor,
            recipe=recipe,
            title="Capacity 1.25",
            state=State.APPROVED,
            outcome=Outcome.WORKED,
            conclusion="Lower drop fraction.",
            concluded_at=now,
        ),
        "failed": ProposalFactory.create(
            author=contributor,
            recipe=recipe,
            title="Mix v3 <script>alert(1)</script> \x1b\x08 tricks",
            summary="bold <img src=x onerror=alert(1)>",
            state=State.APPROVED,
            outcome=Outcome.DID_NOT_WORK,
            conclusion="It did **not** help. <script>alert(2)</script>",
            concluded_at=now,
        ),
    }
    made["router"].labels.add(moe)
    made["worked"].labels.add(moe)
    made["failed"].labels.add(data)
    return made


def titles(feed: Any) -> list[str]:
    return sorted(entry.title for entry in feed.entries)


def test_proposals_feed_lists_submitted_proposals_not_drafts(
    client: Client, proposals: dict[str, Proposal]
) -> None:
    feed = parse(client, "/feeds/proposals/")
    assert titles(feed) == sorted(
        [
            "Router z-loss",
            "Capacity 1.25",
            "Mix v3 <script>alert(1)</script>  tricks",  # text, escaped; control chars dropped
        ]
    )
    router = next(e for e in feed.entries if e.title == "Router z-loss")
    assert router.link == f"http://site.test/proposals/{proposals['router'].pk}/"
    assert router.author == "carla"
    assert [t.term for t in router.tags] == ["moe"]
    assert "<strong>Hypothesis:</strong>" in router.summary


def test_outcome_feeds_and_what_did_not_work(
    client: Client, proposals: dict[str, Proposal]
) -> None:
    outcomes = parse(client, "/feeds/outcomes/")
    assert len(outcomes.entries) == 2
    failed = parse(client, "/feeds/did-not-work/")
    assert [e.link for e in failed.entries] == [
        f"http://site.test/proposals/{proposals['failed'].pk}/"
    ]
    entry = failed.entries[0]
    assert entry.title.startswith("Did not work: Mix v3")
    # The conclusion is the sanitized HTML the page shows: markdown kept, scripts gone.
    assert "<strong>not</strong>" in entry.summary
    assert "<script" not in entry.summary


def test_label_feeds_hold_only_that_labels_entries(
    client: Client, proposals: dict[str, Proposal]
) -> None:
    assert titles(parse(client, "/feeds/labels/moe/proposals/")) == [
        "Capacity 1.25",
        "Router z-loss",
    ]
    assert titles(parse(client, "/feeds/labels/moe/outcomes/")) == ["Worked: Capacity 1.25"]
    assert parse(client, "/feeds/labels/moe/did-not-work/").entries == []
    assert client.get("/feeds/labels/nosuch/proposals/").status_code == 404


def test_alerts_feed_and_its_label(
    client: Client, proposals: dict[str, Proposal], recipe: Any
) -> None:
    plan = launched_plan(recipe)
    Proposal.objects.filter(pk=proposals["worked"].pk).update(plan=plan)
    run = Run.objects.filter(plan=plan).first()
    assert run is not None
    Alert.objects.create(
        run=run, kind="spike", key="train/loss", message="train/loss spiked to 9 <b>at</b> step 5"
    )
    Alert.objects.create(
        run=run,
        kind="silence",
        key="",
        message="no heartbeat for 200 s",
        closed_at=timezone.now(),
        close_message="heartbeat heard again",
    )
    feed = parse(client, "/feeds/alerts/")
    assert titles(feed) == [
        f"[closed] silence on run {run.pk}",
        f"[open] spike train/loss on run {run.pk}",
    ]
    spike = next(e for e in feed.entries if "spike" in e.title)
    assert spike.link.startswith(f"http://site.test/runs/{run.pk}/#alert-")
    assert "<b>" not in spike.summary  # plain text, escaped
    assert "&lt;b&gt;at&lt;/b&gt;" in spike.summary
    assert len(parse(client, "/feeds/labels/moe/alerts/").entries) == 2
    assert parse(client, "/feeds/labels/data/alerts/").entries == []


def test_the_home_page_head_names_every_feed_and_a_labels_list_its_own(
    client: Client, proposals: dict[str, Proposal]
) -> None:
    head = client.get("/").content.decode().split("</head>")[0]
    links = re.findall(
        r'<link rel="alternate" type="application/atom\+xml" title="[^"]*" href="([^"]+)"', head
    )
    assert links == [
        "/feeds/proposals/",
        "/feeds/outcomes/",
        "/feeds/did-not-work/",
        "/feeds/alerts/",
        "/feeds/interventions/",
    ]
    for url in links:
        parse(client, url)
    head = client.get("/?label=moe").content.decode().split("</head>")[0]
    assert 'href="/feeds/labels/moe/alerts/"' in head
    head = client.get("/?label=%22%3E%3Cscript%3E").content.decode().split("</head>")[0]
    assert "/feeds/labels/" not in head and "<script" not in head


def test_interventions_feed_lists_every_campaigns_changes_newest_first(client: Client) -> None:
    big = Campaign.objects.create(
        slug="big", name="535B-A23B", target_tokens=1e12, target_flops=1e24
    )
    when = timezone.now()
    for step, title, before, after in (
        (1000, "Weight decay", "0.1", "0.05"),
        (2000, "New kernels <script>alert(1)</script>", "", ""),
    ):
        Intervention.objects.create(
            campaign=big,
            step=step,
            happened_at=when + timedelta(hours=step),
            kind=InterventionKind.choices[0][0],
            title=title,
            from_value=before,
            to_value=after,
            note="Read **off the data**. <script>alert(2)</script>",
        )

    feed = parse(client, "/feeds/interventions/")

    assert [entry.title for entry in feed.entries] == [
        "535B-A23B, step 2000: New kernels <script>alert(1)</script>",  # text, escaped in XML
        "535B-A23B, step 1000: Weight decay: 0.1 → 0.05",
    ]
    assert (
        feed.entries[1].link
        == "http://site.test" + Intervention.objects.get(step=1000).get_absolute_url()
    )
    summary = feed.entries[0].summary
    assert "<strong>off the data</strong>" in summary and "<script" not in summary
