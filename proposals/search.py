"""Finding what has been tried: proposal search and the archive of what did not work.

``proposal_search`` turns a parsed query (``proposals/query_language.py``) into one filtered,
ordered queryset: fields and full text on the proposal, config parameters on the plan's
resolved configs or the baseline overrides, metrics on the runs' summaries.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.contrib.postgres.search import CombinedSearchQuery, SearchQuery, SearchRank
from django.db import connection
from django.db.models import Count, Expression, F, OuterRef, Prefetch, Q, QuerySet, Subquery
from django.db.models.fields import BooleanField
from django.db.models.fields.json import KeyTransform
from django.db.models.functions import Coalesce

from proposals.models import Label, Outcome, Proposal
from proposals.query_language import (
    And,
    Compare,
    FieldMatch,
    Node,
    Not,
    Or,
    ParsedQuery,
    Text,
)
from runs.models import MetricSummary, PlanEntry, Run, RunState

TEXT_CONFIG = "english"  # the trigger of migration 0003 builds the vectors with the same one


# --------------------------------------------------------------------------- to queries


class JSONIsNumber(Expression):
    """Whether a JSON column holds a number at ``path``: comparisons skip strings and
    booleans on both databases (PostgreSQL orders them around numbers, SQLite reads true
    as 1)."""

    output_field = BooleanField()

    def __init__(self, column: str, path: Sequence[str]) -> None:
        super().__init__()
        self.source: Any = F(column)
        self.path = tuple(path)

    def get_source_expressions(self) -> list[Any]:
        return [self.source]

    def set_source_expressions(self, exprs: Sequence[Any]) -> None:
        (self.source,) = exprs

    def as_sql(self, compiler: Any, connection: Any) -> Any:
        sql, params = compiler.compile(self.source)
        path = "$" + "".join("." + json.dumps(part) for part in self.path)
        return f"json_type({sql}, %s) IN ('integer', 'real')", (*params, path)

    def as_postgresql(self, compiler: Any, connection: Any) -> Any:
        sql, params = compiler.compile(self.source)
        return f"jsonb_typeof({sql} #> %s) = 'number'", (*params, list(self.path))


LOOKUPS = {"=": "exact", "<": "lt", "<=": "lte", ">": "gt", ">=": "gte"}


def _key(column: str, path: Sequence[str]) -> KeyTransform:
    expression: Any = column
    for part in path:
        expression = KeyTransform(part, expression)
    return expression


def _json_condition(alias: str, column: str, path: Sequence[str], node: Compare) -> Q:
    """``node`` on the JSON key at ``path`` of ``column``, aliased on the queryset as
    ``alias``; numbers compare only with numbers."""

    def one(op: str, value: Any) -> Q:
        if isinstance(value, bool | str):
            return Q(**{alias: value})
        return Q(JSONIsNumber(column, path)) & Q(**{f"{alias}__{LOOKUPS[op]}": value})

    # "The key is there" first: a missing key makes the condition false, never NULL, so
    # that NOT around it keeps the rows that lack the key.
    present = Q(**{f"{alias}__isnull": False})
    if node.op == "IN":
        condition = Q()
        for value in node.values:
            condition |= one("=", value)
        return present & condition
    if node.op == "!=":
        return present & ~one("=", node.values[0])
    return present & one(node.op, node.values[0])


def text_query(node: Text) -> SearchQuery:
    return SearchQuery(
        node.text, config=TEXT_CONFIG, search_type="phrase" if node.phrase else "plain"
    )


class _Compiler:
    def __init__(self, vendor: str, empty_texts: set[int]) -> None:
        self.vendor = vendor
        self.empty_texts = empty_texts
        self.aliases: dict[str, Any] = {}

    def q(self, node: Node | SearchQuery) -> Q | None:
        """The condition of ``node``; None when nothing is left of it (stop words only)."""
        if isinstance(node, SearchQuery | CombinedSearchQuery):
            return Q(search_vector=node)
        if isinstance(node, Text):
            return None if id(node) in self.empty_texts else self.text(node)
        if isinstance(node, Not):
            inner = self.q(node.child)
            return None if inner is None else ~inner
        if isinstance(node, And | Or):
            parts = [q for q in (self.q(c) for c in self.merge_texts(node)) if q is not None]
            if not parts:
                return None
            combined = parts[0]
            for part in parts[1:]:
                combined = combined & part if isinstance(node, And) else combined | part
            return combined
        if isinstance(node, FieldMatch):
            return self.field(node)
        return self.compare(node)

    def merge_texts(self, node: And | Or) -> list[Node | SearchQuery]:
        """On PostgreSQL, the words among ``node``'s children become one text query: one
        ``@@`` per row instead of one per word (a third of the time for three words)."""
        texts = [c for c in node.children if isinstance(c, Text)]
        words = [t for t in texts if id(t) not in self.empty_texts]
        if self.vendor != "postgresql" or len(words) < 2:
            return list(node.children)
        combined = text_query(words[0])
        for word in words[1:]:
            combined = (
                combined & text_query(word)
                if isinstance(node, And)
                else combined | text_query(word)
            )
        return [combined, *(c for c in node.children if not isinstance(c, Text))]

    def text(self, node: Text) -> Q:
        if self.vendor == "postgresql":
            return Q(search_vector=text_query(node))
        condition = Q()
        for column in ("title", "summary", "description", "hypothesis"):
            condition |= Q(**{f"{column}__icontains": node.text})
        return condition

    # Rows of other tables are matched with uncorrelated ``IN (SELECT ...)`` subqueries:
    # PostgreSQL hashes each once, and estimates them soundly. Correlated EXISTS joined by
    # OR were costed so high that JIT compilation alone added 75 ms to a query.

    def field(self, node: FieldMatch) -> Q:
        values = list(node.values)
        runs = Run.objects.order_by()
        if node.field == "state":
            return Q(state__in=values)
        if node.field in {"outcome", "confidence"}:
            return Q(**{f"{node.field}__in": ["" if v == "none" else v for v in values]})
        if node.field == "label":
            links = Proposal.labels.through.objects.filter(label__name__in=values)
            return Q(pk__in=links.values("proposal_id"))
        if node.field == "recipe":
            return Q(recipe__name__in=values)
        if node.field == "author":
            condition = Q()
            for value in values:
                condition |= Q(author__username__iexact=value)
            return condition
        if node.field == "run":
            return Q(plan_id__in=runs.filter(state__in=values).values("plan_id"))
        return Q(plan_id__in=runs.filter(failure_kind__in=values).values("plan_id"))

    def compare(self, node: Compare) -> Q:
        if node.kind == "parameter":
            # a resolved config of the frozen plan, or the proposal's own baseline overrides
            path = node.name.split(".")
            alias = f"_search_{len(self.aliases)}"
            self.aliases[alias] = _key("baseline", path)
            entries = PlanEntry.objects.order_by().alias(_value=_key("config", path))
            in_plan = entries.filter(_json_condition("_value", "config", path, node))
            in_baseline = _json_condition(alias, "baseline", path, node)
            return Q(plan_id__in=in_plan.values("plan_id")) | in_baseline
        # a metric: any run of the plan, by its running summary or its imported final metrics
        summaries = MetricSummary.objects.order_by().filter(key=node.name)
        if node.op == "IN":
            summaries = summaries.filter(last__in=list(node.values))
        elif node.op == "!=":
            summaries = summaries.exclude(last=node.values[0])
        else:
            summaries = summaries.filter(**{f"last__{LOOKUPS[node.op]}": node.values[0]})
        finals = Run.objects.order_by().alias(_value=_key("final_metrics", [node.name]))
        finals = finals.filter(_json_condition("_value", "final_metrics", [node.name], node))
        plans = summaries.values("run__plan_id").union(finals.values("plan_id"), all=True)
        return Q(plan_id__in=plans)


def _positive_texts(node: Node | None, negated: bool = False) -> list[Text]:
    if isinstance(node, Text):
        return [] if negated else [node]
    if isinstance(node, Not):
        return _positive_texts(node.child, not negated)
    if isinstance(node, And | Or):
        return [t for child in node.children for t in _positive_texts(child, negated)]
    return []


def _stop_word_texts(texts: list[Text], vendor: str) -> set[int]:
    """The texts PostgreSQL reads as no words at all (stop words such as 'the'), in one
    query: they are left out instead of matching nothing."""
    if vendor != "postgresql" or not texts:
        return set()
    selects = ", ".join(
        f"numnode({'phraseto_tsquery' if t.phrase else 'plainto_tsquery'}(%s::regconfig, %s))"
        for t in texts
    )
    params = [value for t in texts for value in (TEXT_CONFIG, t.text)]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {selects}", params)
        counts = cursor.fetchone()
    return {id(t) for t, count in zip(texts, counts, strict=True) if count == 0}


@dataclass
class SearchResult:
    proposals: QuerySet[Proposal]
    matched: QuerySet[Proposal]  # the same rows, unordered and unranked: for counting
    ignored: list[str]  # words left out (stop words, PostgreSQL only)
    ranked: bool  # ordered by text relevance rather than by date

    def count(self, *, cap: int) -> tuple[int, bool]:
        """How many match, counting no further than ``cap``; and whether there are more.
        Counting stops early, so a query matching most of the table stays cheap."""
        found = self.matched[: cap + 1].count()
        return min(found, cap), found > cap


CARD_FIELDS = (
    "id",
    "title",
    "summary",
    "state",
    "outcome",
    "confidence",
    "created_at",
    "concluded_at",
    "plan_id",
    "author__username",
    "recipe__name",
    "recipe__version",
)


def proposal_cards() -> QuerySet[Proposal]:
    """Proposals with only what a result card shows (no markdown bodies, no JSON)."""
    return (
        Proposal.objects.select_related("author", "recipe")
        .only(*CARD_FIELDS)
        .prefetch_related(Prefetch("labels", queryset=Label.objects.only("id", "name")))
    )


def proposal_search(
    *, query: ParsedQuery, queryset: QuerySet[Proposal] | None = None
) -> SearchResult:
    """Proposals matching ``query``: by relevance when it has free text (PostgreSQL), else
    newest first. ``queryset`` (default: ``proposal_cards()``) says what to load."""
    queryset = proposal_cards() if queryset is None else queryset
    vendor = connection.vendor
    stop_words = _stop_word_texts(query.texts, vendor)
    compiler = _Compiler(vendor, stop_words)
    condition = compiler.q(query.root) if query.root is not None else None
    if compiler.aliases:
        queryset = queryset.alias(**compiler.aliases)
    if condition is not None:
        queryset = queryset.filter(condition)
    matched = queryset.order_by()
    ranked_texts = [t for t in _positive_texts(query.root) if id(t) not in stop_words]
    ranked = vendor == "postgresql" and bool(ranked_texts)
    if ranked:
        rank_query = text_query(ranked_texts[0])
        for text in ranked_texts[1:]:
            rank_query = rank_query | text_query(text)
        queryset = queryset.annotate(rank=SearchRank(F("search_vector"), rank_query)).order_by(
            "-rank", "-created_at", "-id"
        )
    else:
        queryset = queryset.order_by("-created_at", "-id")
    ignored = [t.describe() for t in query.texts if id(t) in stop_words]
    return SearchResult(proposals=queryset, matched=matched, ignored=ignored, ranked=ranked)


# ----------------------------------------------------------------------------- archive

ARCHIVE_OUTCOMES = (Outcome.DID_NOT_WORK, Outcome.INCONCLUSIVE)
ARCHIVE_RUN_STATES = (RunState.FAILED, RunState.CRASHED)


def with_run_counts(queryset: QuerySet[Proposal]) -> QuerySet[Proposal]:
    """``runs_total``, ``runs_finished`` and ``runs_failed`` (failed or crashed) per proposal,
    as correlated subqueries: the cost follows the rows shown, not the whole table."""

    def count(**filters: Any) -> Any:
        runs = (
            Run.objects.filter(plan_id=OuterRef("plan_id"), **filters)
            .order_by()
            .values("plan_id")
            .annotate(n=Count("pk"))
            .values("n")[:1]
        )
        return Coalesce(Subquery(runs), 0)

    return queryset.annotate(
        runs_total=count(),
        runs_finished=count(state=RunState.FINISHED),
        runs_failed=count(state__in=ARCHIVE_RUN_STATES),
    )


def archive_proposals() -> QuerySet[Proposal]:
    """Concluded proposals that did not work or were inconclusive, latest verdict first."""
    return with_run_counts(
        proposal_cards()
        .only(*CARD_FIELDS, "conclusion")
        .filter(outcome__in=ARCHIVE_OUTCOMES)
        .order_by(F("concluded_at").desc(nulls_last=True), "-created_at", "-id")
    )


def archive_runs() -> QuerySet[Run]:
    """Failed and crashed runs with the proposal they belong to (if any), latest first."""
    return (
        Run.objects.filter(state__in=ARCHIVE_RUN_STATES)
        .select_related("plan__proposal")
        .only(
            "id",
            "state",
            "failure_kind",
            "state_reason",
            "attempt",
            "max_attempts",
            "recipe_name",
            "recipe_version",
            "executor",
            "queued_at",
            "finished_at",
            "plan__id",
            "plan__proposal__id",
            "plan__proposal__title",
            "plan__proposal__outcome",
        )
        .order_by(F("finished_at").desc(nulls_last=True), "-id")
    )
