"""Atom feeds (Django's syndication framework): new proposals, recorded outcomes, what did
not work, and alerts on runs; each for the whole site or for one label.

Feed readers find them from any page: ``base.html`` names them in ``<link rel="alternate"
type="application/atom+xml">``, and a list filtered by one label names that label's too.

User-written text goes into a feed as text (titles, names) or as the same sanitized HTML the
pages show (``render_markdown``); the XML writer escapes both. Characters XML 1.0 cannot
carry (control characters, lone surrogates) are dropped first: Django's writer would refuse
the whole feed for one of them.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.syndication.views import Feed
from django.db.models import QuerySet
from django.http import Http404, HttpRequest
from django.urls import reverse
from django.utils.feedgenerator import Atom1Feed
from django.utils.html import linebreaks

from proposals.markdown import render_markdown
from proposals.models import LABEL_NAME, Label, Outcome, Proposal, State
from runs.alerts.models import Alert
from runs.campaigns.models import Intervention

ITEMS = 50
NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")
FEED_KINDS = {
    "proposals": "New proposals",
    "outcomes": "Recorded outcomes",
    "did-not-work": "What did not work",
    "alerts": "Alerts on runs",
}


def xml_text(text: Any) -> str:
    return NOT_XML.sub("", str(text or ""))


def feed_links(label: str | None = None) -> list[tuple[str, str]]:
    """(title, URL) of every feed, of one label's when a label is given."""
    site = "marin-site"
    if label is None:
        return [
            (f"{site}: {title}", reverse(f"proposals:feed-{kind}"))
            for kind, title in FEED_KINDS.items()
        ]
    return [
        (
            f"{site}: {title} labelled {label}",
            reverse(f"proposals:label-feed-{kind}", kwargs={"label": label}),
        )
        for kind, title in FEED_KINDS.items()
    ]


def label_or_none(name: Any) -> str | None:
    """A label name that can name a feed (it exists and fits the label pattern)."""
    if not isinstance(name, str) or not name:
        return None
    try:
        LABEL_NAME(name)
    except Exception:
        return None
    return name if Label.objects.filter(name=name).exists() else None


class _SiteFeed(Feed):
    feed_type = Atom1Feed
    kind = ""
    page = "proposals:list"

    def get_object(self, request: HttpRequest, label: str | None = None) -> Label | None:
        if label is None:
            return None
        found = Label.objects.filter(name=label).first()
        if found is None:
            raise Http404("No such label.")
        return found

    def title(self, obj: Label | None) -> str:
        base = f"marin-site: {FEED_KINDS[self.kind]}"
        return base if obj is None else f"{base} labelled {xml_text(obj.name)}"

    def subtitle(self, obj: Label | None) -> str:
        return self.title(obj)

    # Links are made absolute with SITE_URL (the syndication framework would otherwise use
    # the sites framework's domain, which this site does not keep).
    def link(self, obj: Label | None) -> str:
        url = settings.SITE_URL + reverse(self.page)
        return url if obj is None else f"{url}?label={obj.name}"

    def feed_url(self, obj: Label | None) -> str:
        if obj is None:
            return settings.SITE_URL + reverse(f"proposals:feed-{self.kind}")
        return settings.SITE_URL + reverse(
            f"proposals:label-feed-{self.kind}", kwargs={"label": obj.name}
        )


class _ProposalFeed(_SiteFeed):
    def proposals(self, obj: Label | None) -> QuerySet[Proposal]:
        rows = Proposal.objects.select_related("author").prefetch_related("labels")
        return rows if obj is None else rows.filter(labels=obj)

    def item_title(self, item: Proposal) -> str:
        return xml_text(item.title)

    def item_link(self, item: Proposal) -> str:
        return settings.SITE_URL + item.get_absolute_url()

    def item_guid(self, item: Proposal) -> str:
        return f"{settings.SITE_URL}{item.get_absolute_url()}#{self.kind}"

    def item_author_name(self, item: Proposal) -> str:
        return xml_text(item.submitter_name or item.author.get_username())

    def item_categories(self, item: Proposal) -> list[str]:
        return [xml_text(label.name) for label in item.labels.all()]

    def item_updateddate(self, item: Proposal) -> datetime:
        return item.updated_at


class ProposalsFeed(_ProposalFeed):
    kind = "proposals"

    def items(self, obj: Label | None) -> Any:
        return self.proposals(obj).exclude(state=State.DRAFT).order_by("-created_at", "-pk")[:ITEMS]

    def item_description(self, item: Proposal) -> str:
        text = (
            f"{item.summary}\n\n**Hypothesis:** {item.hypothesis}"
            if item.hypothesis
            else item.summary
        )
        return xml_text(render_markdown(text))

    def item_pubdate(self, item: Proposal) -> datetime:
        return item.submitted_at or item.created_at


class OutcomesFeed(_ProposalFeed):
    kind = "outcomes"
    page = "proposals:list"

    def items(self, obj: Label | None) -> Any:
        return (
            self.proposals(obj)
            .filter(concluded_at__isnull=False)
            .exclude(outcome="")
            .order_by("-concluded_at", "-pk")[:ITEMS]
        )

    def item_title(self, item: Proposal) -> str:
        return xml_text(f"{item.get_outcome_display()}: {item.title}")

    def item_description(self, item: Proposal) -> str:
        confidence = f" ({item.get_confidence_display()})" if item.confidence else ""
        text = f"**Outcome: {item.get_outcome_display()}**{confidence}\n\n{item.conclusion}"
        return xml_text(render_markdown(text))

    def item_pubdate(self, item: Proposal) -> datetime:
        assert item.concluded_at is not None
        return item.concluded_at

    def item_guid(self, item: Proposal) -> str:  # a changed verdict is a new entry
        stamp = item.concluded_at.isoformat() if item.concluded_at else ""
        return f"{settings.SITE_URL}{item.get_absolute_url()}#outcome-{stamp}"


class DidNotWorkFeed(OutcomesFeed):
    kind = "did-not-work"
    page = "proposals:archive"

    def items(self, obj: Label | None) -> Any:
        return (
            self.proposals(obj)
            .filter(concluded_at__isnull=False, outcome=Outcome.DID_NOT_WORK)
            .order_by("-concluded_at", "-pk")[:ITEMS]
        )


class AlertsFeed(_SiteFeed):
    kind = "alerts"

    def items(self, obj: Label | None) -> Any:
        rows = Alert.objects.order_by("-opened_at", "-pk")
        if obj is not None:
            rows = rows.filter(run__plan__proposal__labels=obj)
        return rows[:ITEMS]

    def item_title(self, item: Alert) -> str:
        state = "open" if item.is_open else "closed"
        what = f" {item.key}" if item.key and item.key != "*" else ""
        return xml_text(f"[{state}] {item.kind}{what} on run {item.run_id}")

    def item_description(self, item: Alert) -> str:
        text = item.message
        if not item.is_open:
            text += f"\n\nClosed: {item.close_message}"
        return xml_text(linebreaks(text, autoescape=True))  # Atom's summary is HTML: escape

    def item_link(self, item: Alert) -> str:
        return settings.SITE_URL + item.get_absolute_url()

    def item_guid(self, item: Alert) -> str:
        return f"{settings.SITE_URL}/alerts/{item.pk}"

    def item_pubdate(self, item: Alert) -> datetime:
        return item.opened_at

    def item_updateddate(self, item: Alert) -> datetime:
        return item.closed_at or item.opened_at


FEEDS: dict[str, type[_SiteFeed]] = {
    "proposals": ProposalsFeed,
    "outcomes": OutcomesFeed,
    "did-not-work": DidNotWorkFeed,
    "alerts": AlertsFeed,
}


class InterventionsFeed(_SiteFeed):
    """The interventions recorded on every campaign (a dated, stepped change of a long run),
    newest first. Campaigns carry no labels, so there is no labelled variant."""

    kind = "interventions"
    page = "campaigns:list"

    def get_object(self, request: HttpRequest, label: str | None = None) -> Label | None:
        return None

    def title(self, obj: Label | None) -> str:
        return "marin-site: interventions on campaigns"

    def feed_url(self, obj: Label | None) -> str:
        return settings.SITE_URL + reverse("proposals:feed-interventions")

    def items(self, obj: Label | None) -> Any:
        return Intervention.objects.select_related("campaign").order_by("-happened_at", "-pk")[
            :ITEMS
        ]

    def item_title(self, item: Intervention) -> str:
        change = (
            f": {item.from_value} → {item.to_value}" if item.from_value or item.to_value else ""
        )
        return xml_text(f"{item.campaign.name}, step {item.step}: {item.title}{change}")

    def item_description(self, item: Intervention) -> str:
        return xml_text(render_markdown(item.note))  # the page's sanitized HTML

    def item_link(self, item: Intervention) -> str:
        return settings.SITE_URL + item.get_absolute_url()

    def item_guid(self, item: Intervention) -> str:
        return f"{settings.SITE_URL}/interventions/{item.pk}"

    def item_pubdate(self, item: Intervention) -> datetime:
        return item.happened_at
