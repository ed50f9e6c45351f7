"""Reads for proposals: querysets that load what a page needs in a fixed number of queries."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import (
    Avg,
    BigIntegerField,
    CharField,
    Count,
    F,
    FloatField,
    IntegerField,
    Max,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
    Value,
)
from django.db.models.functions import Cast, Coalesce

from marin_site.doors import Door
from marin_site.events import verb_label
from marin_site.fragments import Fragments
from proposals.models import Comment, Event, Outcome, Proposal, Review, State
from runs.models import DryRun, Run, RunEvent, RunState
from runs.services.dry_runs import dry_run_line

# The proposal page shows this many of the latest timeline entries; the API has them all.
TIMELINE_PAGE_ROWS = 200


def _per_proposal(aggregate: Any, output_field: Any) -> Subquery:
    """An aggregate over one proposal's reviews, as a correlated subquery.

    A JOIN with GROUP BY would make the database group every proposal before it sorts and
    takes one page; the subquery runs for the rows of the page only.
    """
    reviews = (
        Review.objects.filter(proposal=OuterRef("pk"))
        .order_by()
        .values("proposal")
        .annotate(value=aggregate)
        .values("value")
    )
    return Subquery(reviews, output_field=output_field)


RECIPE_HEAVY = tuple(
    f"recipe__{name}"
    for name in (
        "description",
        "command_template",
        "default_config",
        "parameter_schema",
        "compute_model",
        "scales",
    )
)
PROPOSAL_HEAVY = (
    "description",
    "hypothesis",
    "baseline",
    "ablation_spec",
    "state_reason",
    "approved_hypothesis",
    "approved_criteria",
    "conclusion",
    "results",
    "github_sections",
)


def proposal_list() -> QuerySet[Proposal]:
    """Every proposal (all are public), with what the list page and the API show.

    A list row never needs its recipe's config and schema (JSON decoded per row otherwise)
    nor the search vector."""
    return (
        Proposal.objects.select_related("author", "recipe")
        .defer("search_vector", *RECIPE_HEAVY)
        .prefetch_related("labels")
        .annotate(
            review_count=Coalesce(
                _per_proposal(Count("pk"), IntegerField()), Value(0), output_field=IntegerField()
            ),
            average_score=_per_proposal(Avg("score"), FloatField()),
        )
        .order_by("-created_at", "-id")
    )


# The version (``marin_site.fragments``) of what the list finds: which proposals each filter
# or search matches, in which order, and how many. Replaced after any write that can change
# that (``proposals.receivers``), so a cached page of the list is never older than a write.
LIST_VERSION = ("proposal-list", 0)


class CachedListing:
    """What a filtered list matches, as a paginator's object list: its count and the slices
    asked for come from one fragment (``marin_site.fragments``, under ``LIST_VERSION``) when
    it is current, else from ``ids()`` (a query of ids, built only then) and are kept by
    ``save()``. Both the list page and the API's list page through it."""

    def __init__(self, ids: Callable[[], QuerySet[Any]], fragments: Fragments, name: str) -> None:
        self._ids, self._fragments, self._name = ids, fragments, name
        found = fragments.get(name)
        self._found: dict[Any, Any] = dict(found) if isinstance(found, dict) else {}
        self._changed = False

    def count(self) -> int:
        if "count" not in self._found:
            self._found["count"] = self._ids().count()
            self._changed = True
        return int(self._found["count"])

    def __len__(self) -> int:
        return self.count()

    def __getitem__(self, item: slice) -> list[int]:
        key = (item.start, item.stop)
        if key not in self._found:
            self._found[key] = list(self._ids()[item])
            self._changed = True
        return list(self._found[key])

    def save(self) -> None:
        if self._changed:
            self._fragments.put(self._name, self._found)


def proposal_ids() -> QuerySet[Proposal]:
    """Every proposal in the list's order, nothing joined or annotated: to filter and take a
    page of ids (the rows themselves then come from fragments or ``proposal_list``)."""
    return Proposal.objects.order_by("-created_at", "-id")


def proposal_rows() -> QuerySet[Proposal]:
    """The list page's rows: ``proposal_list`` without the long texts a row never shows."""
    return proposal_list().defer(*PROPOSAL_HEAVY)


def proposal_page_prefetches() -> dict[str, Any]:
    """What the proposal page's sections show besides the proposal, by section, prefetched
    in one query each (a section that comes from the fragment cache needs none)."""
    return {
        "head": ["labels"],
        "body": ["amendments__author"],
        "reviews": [Prefetch("reviews", queryset=Review.objects.select_related("reviewer"))],
        "comments": [Prefetch("comments", queryset=Comment.objects.select_related("author"))],
        "details": [],
    }


# What a proposal's page reads of the row besides its kept sections (detail.html: the title,
# badges and callouts, the outcome, what the reader may do, the keys of the sections); the
# sections that show the rest ("head", "body", "details") load it when they are rendered.
PAGE_FIELDS = (
    "title",
    "state",
    "state_reason",
    "on_hold",
    "author_id",
    "plan_id",
    "outcome",
    "confidence",
    "concluded_at",
    "conclusion",
    "results",
    "github_issue_number",
    "updated_at",
)
PAGE_ROW_SECTIONS = ("head", "body", "details")


def proposal_detail(
    *, pk: int, prefetch: bool = True, related: bool = True, page_fields: bool = False
) -> Proposal:
    """One proposal with its labels, reviews, comments and amendments prefetched (without
    them when ``prefetch`` is False: ``proposal_page_prefetches`` says what each section
    needs; the timeline: ``proposal_timeline``), and its author, recipe and plan joined
    (loaded on first use instead when ``related`` is False: a page whose sections come
    from the fragment cache never uses them). With ``page_fields``, only ``PAGE_FIELDS``
    (``proposal_rest_load`` loads the others in one query)."""
    queryset = (
        Proposal.objects.only(*PAGE_FIELDS)
        if page_fields
        else Proposal.objects.defer("search_vector")
    )
    if related:
        queryset = queryset.select_related("author", "recipe", "plan")
    if prefetch:
        queryset = queryset.prefetch_related(
            *(lookup for lookups in proposal_page_prefetches().values() for lookup in lookups)
        )
    return queryset.get(pk=pk)


def proposal_rest_load(proposal: Proposal) -> None:
    """Load the fields ``proposal_detail(page_fields=True)`` left out, in one query (read
    one by one on first use, they would cost a query each)."""
    rest = proposal.get_deferred_fields() - {"search_vector"}
    if rest:
        proposal.refresh_from_db(fields=sorted(rest))


def proposal_own_review(*, proposal: Proposal, reviewer: Any) -> Review | None:
    """The reviewer's own review of the proposal, if any (from the prefetch when there is one)."""
    if "reviews" in getattr(proposal, "_prefetched_objects_cache", {}):
        return next((r for r in proposal.reviews.all() if r.reviewer_id == reviewer.pk), None)
    return Review.objects.filter(proposal=proposal, reviewer=reviewer.pk).first()


def review_queue(*, reviewer: Any) -> QuerySet[Proposal]:
    """Submitted proposals waiting for review, never the reviewer's own, oldest first."""
    return (
        proposal_list()
        .filter(state=State.SUBMITTED)
        .exclude(author=reviewer)
        .annotate(reviewed_by_me=Count("reviews", filter=Q(reviews__reviewer=reviewer)))
        .order_by("reviewed_by_me", "submitted_at", "id")
    )


def author_choices() -> QuerySet[Any]:
    user_model = get_user_model()
    return user_model.objects.filter(proposals__isnull=False).distinct().order_by("username")


def plan_run_progress(*, plan_id: int) -> str:
    """How many runs of the plan are in each state, e.g. "1 running, 2 finished"."""
    counts = dict(
        Run.objects.filter(plan_id=plan_id)
        .order_by()
        .values("state")
        .annotate(n=Count("pk"))
        .values_list("state", "n")
    )
    return ", ".join(f"{counts[state]} {state}" for state in RunState.values if state in counts)


def proposal_status_text(proposal: Proposal) -> str:
    """A proposal's status in one line of markdown: state, hold, outcome and run progress.

    Written once, here, and used wherever the status is said: the answer to a slash
    command, the status comment and the managed block of the GitHub issue.
    """
    parts = [f"state: **{proposal.get_state_display()}**"]
    if proposal.on_hold:
        parts.append("on hold")
    if proposal.outcome:
        parts.append(f"outcome **{proposal.get_outcome_display()}**")
    text = ", ".join(parts)
    if proposal.plan_id is not None:
        progress = plan_run_progress(plan_id=proposal.plan_id)
        if progress:
            text += f"; runs: {progress}"
    elif latest := DryRun.objects.filter(subject=f"proposal-{proposal.pk}").order_by("-pk").first():
        text += f"; {dry_run_line(latest)}"
    return text


# ----------------------------------------------------------------------------- timeline

TIMELINE_COLUMNS = (
    "id",
    "created_at",
    "actor_label",
    "verb",
    "from_state",
    "to_state",
    "message",
    "door",
)


# A state or an outcome a timeline row names, in words: "Changes requested", "Did not work"
# (a run's states are words already).
_STATE_LABELS = {**dict(State.choices), **dict(Outcome.choices)}


def state_label(code: str) -> str:
    """A proposal state, an outcome or a run state as the page writes it, never its code."""
    return str(_STATE_LABELS.get(code, code.replace("_", " ")))


@dataclass(frozen=True)
class TimelineEntry:
    """One row of a proposal's timeline: its own event, or an event of one of its runs."""

    kind: str  # "proposal" or "run"
    id: int
    created_at: datetime
    actor: str  # the name shown: the label, else the username, else "system"
    verb: str
    from_state: str
    to_state: str
    message: str
    door: str
    run: int | None  # the run, for a run's event

    @property
    def door_label(self) -> str:
        return Door(self.door).label if self.door in Door.values else self.door

    @property
    def verb_label(self) -> str:
        return verb_label(self.verb)

    @property
    def from_label(self) -> str:
        return state_label(self.from_state)

    @property
    def to_label(self) -> str:
        return state_label(self.to_state)

    @classmethod
    def of_row(cls, row: dict[str, Any]) -> TimelineEntry:
        return cls(
            kind=row["kind"],
            id=row["id"],
            created_at=row["created_at"],
            actor=row["actor_label"] or row["actor_name"] or "system",
            verb=row["verb"],
            from_state=row["from_state"],
            to_state=row["to_state"],
            message=row["message"],
            door=row["door"],
            run=row["run_ref"],
        )


def proposal_timeline(*, proposal: Proposal) -> QuerySet[Any]:
    """The proposal's timeline: its own events and the events of its plan's runs, oldest
    first, as one query (rows are dicts: ``TimelineEntry.of_row`` reads them). ``runs``
    keeps its events; they meet here, where proposals may read runs."""
    own = (
        Event.objects.filter(proposal_id=proposal.pk)
        .order_by()
        .annotate(
            kind=Value("proposal", output_field=CharField()),
            actor_name=F("actor__username"),
            run_ref=Cast(Value(None), output_field=BigIntegerField()),
        )
        .values(*TIMELINE_COLUMNS, "kind", "actor_name", "run_ref")
    )
    if proposal.plan_id is None:
        return own.order_by("created_at", "id")
    of_runs = (
        RunEvent.objects.filter(run__plan_id=proposal.plan_id)
        .order_by()
        .annotate(
            kind=Value("run", output_field=CharField()),
            actor_name=F("actor__username"),
            run_ref=F("run_id"),
        )
        .values(*TIMELINE_COLUMNS, "kind", "actor_name", "run_ref")
    )
    return own.union(of_runs, all=True).order_by("created_at", "id")


def plan_last_run_event(*, plan_id: int | None) -> int | None:
    """The id of the latest event of the plan's runs (events are only ever added)."""
    if plan_id is None:
        return None
    return RunEvent.objects.filter(run__plan_id=plan_id).aggregate(last=Max("id"))["last"]


def timeline_entries(rows: Iterable[dict[str, Any]]) -> list[TimelineEntry]:
    return [TimelineEntry.of_row(row) for row in rows]


def proposal_timeline_recent(
    *, proposal: Proposal, limit: int = TIMELINE_PAGE_ROWS
) -> tuple[list[TimelineEntry], bool]:
    """The latest ``limit`` entries of the timeline, oldest first, and whether there are
    older ones (the page shows these; the API pages through all)."""
    rows = list(proposal_timeline(proposal=proposal).order_by("-created_at", "-id")[: limit + 1])
    return timeline_entries(reversed(rows[:limit])), len(rows) > limit
