"""The search query language: parsing, errors with positions, and queries against real rows."""

from __future__ import annotations

import random
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from proposals import query_language, search
from proposals.models import Label, Outcome, Proposal, State
from proposals.query_language import (
    And,
    Compare,
    FieldMatch,
    Not,
    Or,
    QuerySyntaxError,
    Text,
    parse_query,
)
from runs.models import FailureKind, MetricSummary, Plan, Run, RunState
from runs.services import plans as plan_services
from tests.factories import ProposalFactory, UserFactory

ON_POSTGRES = connection.vendor == "postgresql"


def root(text: str) -> Any:
    return parse_query(text).root


def error(text: str) -> QuerySyntaxError:
    with pytest.raises(QuerySyntaxError) as info:
        parse_query(text)
    return info.value


# ------------------------------------------------------------------------------ parsing


def test_empty_query_matches_everything() -> None:
    assert root("") is None
    assert root("   ") is None


def test_side_by_side_terms_are_and_and_and_binds_tighter_than_or() -> None:
    tree = root("a b OR c")
    assert isinstance(tree, Or)
    first = tree.children[0]
    assert isinstance(first, And)
    assert [c.describe() for c in first.children] == ["a", "b"]
    assert tree.children[1] == Text("c", False, 7)
    assert parse_query("a OR b c").describe() == "a OR b AND c"
    assert parse_query("a AND b OR c AND d").describe() == "a AND b OR c AND d"


def test_explicit_and_is_the_same_as_side_by_side() -> None:
    assert (
        parse_query("a AND b AND c").describe()
        == parse_query("a b c").describe()
        == "a AND b AND c"
    )


def test_parentheses_group() -> None:
    tree = root("(a OR b) c")
    assert isinstance(tree, And)
    assert isinstance(tree.children[0], Or)
    assert parse_query("(a OR b) c").describe() == "(a OR b) AND c"
    assert parse_query("a (b (c OR d))").describe() == "a AND b AND (c OR d)"


def test_not_and_minus_bind_tightest() -> None:
    tree = root("NOT a b")
    assert isinstance(tree, And)
    assert tree.children[0] == Not(Text("a", False, 4))
    assert root("-label:moe") == Not(FieldMatch("label", ("moe",), 1))
    assert parse_query("-(a OR b)").describe() == "NOT (a OR b)"
    assert root("NOT NOT a") == Text("a", False, 8)


def test_lower_case_and_or_are_words() -> None:
    assert parse_query("rock and roll").describe() == "rock AND and AND roll"


def test_in_lists_for_fields_parameters_and_metrics() -> None:
    assert root("state IN (approved, submitted)") == FieldMatch(
        "state", ("approved", "submitted"), 0
    )
    assert root("state in (approved)") == FieldMatch("state", ("approved",), 0)
    assert root("label:(moe, data)") == FieldMatch("label", ("moe", "data"), 0)
    assert root("top_k IN (1, 2)") == Compare("parameter", "top_k", "IN", (1, 2), 0)
    assert root("eval/loss IN (3, 3.5)") == Compare("metric", "eval/loss", "IN", (3, 3.5), 0)


def test_quoting() -> None:
    assert root('"capacity factor"') == Text("capacity factor", True, 0)
    assert root(r'"say \"hi\" \\ there"') == Text('say "hi" \\ there', True, 0)
    assert root('label:"area:moe"') == FieldMatch("label", ("area:moe",), 0)
    assert root("label:area:moe") == FieldMatch("label", ("area:moe",), 0)
    assert root('author:"Carla"') == FieldMatch("author", ("Carla",), 0)
    assert parse_query('"a b" OR c').describe() == '"a b" OR c'


def test_comparisons_type_their_values() -> None:
    assert root("weight_decay>0.05") == Compare("parameter", "weight_decay", ">", (0.05,), 0)
    assert root("weight_decay >= 1e-3") == Compare("parameter", "weight_decay", ">=", (0.001,), 0)
    assert root("lr=-0.5") == Compare("parameter", "lr", "=", (-0.5,), 0)
    assert root("top_k=2") == Compare("parameter", "top_k", "=", (2,), 0)
    assert root("optimizer=adamw") == Compare("parameter", "optimizer", "=", ("adamw",), 0)
    assert root("use_bias=true") == Compare("parameter", "use_bias", "=", (True,), 0)
    assert root('name="12"') == Compare("parameter", "name", "=", ("12",), 0)
    assert root("data_mix.docs>0.5") == Compare("parameter", "data_mix.docs", ">", (0.5,), 0)
    assert root("eval/loss<3.2") == Compare("metric", "eval/loss", "<", (3.2,), 0)
    assert root("eval/paloma/macro_loss<=3") == Compare(
        "metric", "eval/paloma/macro_loss", "<=", (3,), 0
    )


def test_field_values_are_normalised() -> None:
    assert root("outcome:Did-Not-Work") == FieldMatch("outcome", ("did_not_work",), 0)
    assert root("STATE:Approved") == FieldMatch("state", ("approved",), 0)
    assert root("label:MoE") == FieldMatch("label", ("moe",), 0)
    assert root("state!=draft") == Not(FieldMatch("state", ("draft",), 0))
    assert root("state=draft") == FieldMatch("state", ("draft",), 0)


def test_the_example_of_the_issue() -> None:
    query = parse_query(
        "outcome:did_not_work label:moe recipe:tiny-moe weight_decay>0.05 eval/loss<3.2"
    )
    assert query.describe() == (
        "outcome:did_not_work AND label:moe AND recipe:tiny-moe AND weight_decay>0.05 "
        "AND eval/loss<3.2"
    )


@pytest.mark.parametrize(
    ("text", "position", "words"),
    [
        ("label:", 6, "expected a value after 'label:'"),
        ("label: OR", 7, "expected a value"),
        ("(moe", 4, "expected ')' to close the '(' at column 1"),
        ("a (b OR c", 9, "expected ')'"),
        ("moe)", 3, "closes no '('"),
        ('routing "capacity', 8, "never closed"),
        ("stat:approved", 0, "Did you mean state?"),
        ("colour:red", 0, "unknown field 'colour'"),
        ("outcome:did_not_wrk", 8, "Did you mean did_not_work?"),
        ("state:running", 6, "It takes: draft"),
        ("weight_decay>abc", 13, "'>' compares with a number, not 'abc'"),
        ("eval/loss=low", 10, "a metric compares with a number"),
        ("lr>1e999", 3, "too large"),
        ("state>approved", 5, "state takes ':', '=', '!=' or IN"),
        ("a AND", 5, "expected a term after 'AND', found the end of the query"),
        ("OR a", 0, "expected a term, found 'OR'"),
        ("a ! b", 2, "'!' must be followed by '='"),
        ("state IN (approved", 18, "expected ',' or ')'"),
        ("state IN approved", 9, "expected '(' after 'IN'"),
        ("label:(moe data)", 11, "expected ',' or ')'"),
        ("()", 1, "empty parentheses"),
        ("x IN ()", 6, "expected a value after '('"),
        ("a\x00b", 1, "control character"),
        ("9lives>1", 0, "is not a field, a config parameter"),
        ("a__b>1", 0, "is not a field, a config parameter"),
        ("eval//loss<1", 0, "is not a metric key"),
        (":b", 0, "expected a term, found ':'"),
        ("a :b", 0, "unknown field 'a'"),
        ("IN", 0, "expected a term"),
        ("a , b", 2, "unexpected ','"),
    ],
)
def test_errors_name_the_position_and_what_was_expected(
    text: str, position: int, words: str
) -> None:
    exc = error(text)
    assert exc.position == position, exc
    assert exc.column == position + 1
    assert words in str(exc)
    assert exc.query == text
    assert exc.as_dict()["column"] == position + 1


def test_errors_list_what_was_expected() -> None:
    exc = error("label:")
    assert exc.expected == ["a value", "a quoted phrase"]
    assert exc.found == "the end of the query"
    assert "state" in error("stat:x").expected


def test_hostile_queries_are_capped() -> None:
    assert "too long" in str(error("a " * 300))
    assert error("a " * 300).position == query_language.MAX_QUERY_LENGTH
    deep = "(" * (query_language.MAX_DEPTH + 1) + "a" + ")" * (query_language.MAX_DEPTH + 1)
    assert error(deep).position == query_language.MAX_DEPTH
    assert "deeper" in str(error(deep))
    assert (
        parse_query("(" * query_language.MAX_DEPTH + "a" + ")" * query_language.MAX_DEPTH).root
        is not None
    )
    many = " ".join(["w"] * (query_language.MAX_TERMS + 1))
    assert "too many terms" in str(error(many))
    assert error(many).position == 2 * query_language.MAX_TERMS
    long_list = "label:(" + ", ".join(f"l{i}" for i in range(query_language.MAX_LIST + 1)) + ")"
    assert "at most" in str(error(long_list))
    # a long chain of NOTs is read without recursion
    assert parse_query("- " * 240 + "a").root == Text("a", False, 480)


def test_random_input_never_raises_anything_but_a_syntax_error() -> None:
    alphabet = 'ab:()" ,<>=!-/.\\AND OR NOT IN1e5\t_'
    rng = random.Random(5)  # noqa: S311 (reproducible fuzzing, not secrets)
    positions = []
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        try:
            parse_query(text)
        except QuerySyntaxError as exc:
            positions.append((exc.position, len(text)))
    assert positions
    assert all(0 <= position <= length for position, length in positions)


# ------------------------------------------------------------------------- real rows


def _plan(proposal: Proposal, *, spec: str, baseline: dict[str, Any] | None = None) -> Plan:
    plan = plan_services.plan_freeze(
        recipe=proposal.recipe,
        baseline=baseline or {},
        spec_text=spec,
        budget_accelerator_hours=None,
    )
    Proposal.objects.filter(pk=proposal.pk).update(plan=plan, state=State.APPROVED)
    return plan


def _run(plan: Plan, index: int, *, state: str = RunState.FINISHED, **fields: Any) -> Run:
    entry = plan.entries.get(index=index)
    return Run.objects.create(
        plan=plan,
        entry=entry,
        recipe_name=plan.recipe.name,
        recipe_version=plan.recipe.version,
        config=entry.config,
        config_hash=entry.config_hash,
        state=state,
        **fields,
    )


@pytest.fixture
def rows(recipe: Any, contributor: Any) -> dict[str, Proposal]:
    """Three proposals: an MoE ablation that did not work (plan, runs, metrics), a data-mix
    one that worked (final metrics imported), and a draft with only baseline overrides."""
    other = UserFactory.create(username="olga")
    moe = ProposalFactory.create(
        recipe=recipe,
        author=contributor,
        title="Capacity factor for the router",
        summary="Does a higher capacity factor lower the drop fraction?",
        description="We vary the capacity factor of the **router**.",
        hypothesis="Fewer dropped tokens give a lower eval loss.",
        outcome=Outcome.DID_NOT_WORK,
    )
    moe.labels.add(Label.objects.create(name="moe"), Label.objects.create(name="routing"))
    plan = _plan(moe, spec="axes:\n  weight_decay: [0.0, 0.1]\n")
    first = _run(plan, 0)
    second = _run(plan, 1)
    MetricSummary.objects.create(run=first, key="eval/loss", last=3.0, min=3.0, max=6, step=9)
    MetricSummary.objects.create(run=second, key="eval/loss", last=3.5, min=3.4, max=6, step=9)
    _run(plan, 1, sequence=1, state=RunState.FAILED, failure_kind=FailureKind.OOM)

    data = ProposalFactory.create(
        recipe=recipe,
        author=other,
        title="More code in the data mix",
        summary="Raise the share of code.",
        description="A data ablation: the mixture of sources.",
        hypothesis="Code helps reasoning.",
        outcome=Outcome.WORKED,
    )
    data.labels.add(Label.objects.create(name="data"))
    data_plan = _plan(data, spec="axes:\n  data_mix: [{code: 0.9, docs: 0.1}]\n")
    _run(data_plan, 0, final_metrics={"eval/loss": 3.4, "throughput/mfu": 0.41})

    draft = ProposalFactory.create(
        recipe=recipe,
        author=contributor,
        title="Routing with two experts per token",
        summary="Top-2 routing.",
        description="Nothing about the capacity of experts.",
        hypothesis="Top-2 beats top-1 at equal compute.",
        baseline={"weight_decay": 0.2, "top_k": 2, "optimizer": "lion", "use_bias": True},
        state=State.DRAFT,
    )
    return {"moe": moe, "data": data, "draft": draft}


def found(text: str) -> set[str]:
    result = search.proposal_search(query=parse_query(text))
    return {p.title.split()[0] + " " + p.title.split()[1] for p in result.proposals}


MOE, DATA, DRAFT = "Capacity factor", "More code", "Routing with"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", {MOE, DATA, DRAFT}),
        ("weight_decay>0.05", {MOE, DRAFT}),
        ("weight_decay>0.15", {DRAFT}),
        ("weight_decay<0.05", {MOE, DATA}),
        ("weight_decay=0.1", {MOE}),
        ("weight_decay IN (0.1, 0.2)", {MOE, DRAFT}),
        ("weight_decay!=0", {MOE, DRAFT}),
        ("optimizer=lion", {DRAFT}),
        ("optimizer>1", set()),
        ("use_bias=true", {DRAFT}),
        ("use_bias>0", set()),
        ("top_k=2", {DRAFT}),
        ("data_mix.code>=0.8", {DATA}),
        ("data_mix.docs<0.2", {DATA}),
        ("data_mix.docs>0.2", {MOE, DATA}),
        ("no_such_parameter>0", set()),
        ("eval/loss<3.2", {MOE}),
        ("eval/loss<3.45", {MOE, DATA}),
        ("eval/loss>=3.5", {MOE}),
        ("eval/loss=3.4", {DATA}),
        ("eval/loss IN (3.0, 9)", {MOE}),
        ("throughput/mfu>0.4", {DATA}),
        ("label:moe", {MOE}),
        ("label:moe label:routing", {MOE}),
        ("label:moe label:data", set()),
        ("label:(moe, data)", {MOE, DATA}),
        ("label:moe OR label:data", {MOE, DATA}),
        ("-label:moe", {DATA, DRAFT}),
        ("outcome:did_not_work", {MOE}),
        ("outcome:(did_not_work, worked)", {MOE, DATA}),
        ("outcome:none", {DRAFT}),
        ("state IN (approved)", {MOE, DATA}),
        ("state!=approved", {DRAFT}),
        ("run:failed", {MOE}),
        ("failure:oom", {MOE}),
        ("failure:timeout", set()),
        ("run:finished -run:failed", {DATA}),
        ("-run:failed", {DATA, DRAFT}),
        ("-eval/loss<3.2", {DATA, DRAFT}),
        ("-weight_decay>0.05", {DATA}),
        ("-optimizer=lion", {MOE, DATA}),
        ("NOT use_bias=true", {MOE, DATA}),
        ("-data_mix.docs<0.2", {MOE, DRAFT}),
        ("-optimizer IN (lion, adamw)", {MOE, DATA}),
        ("-failure:oom OR label:moe", {MOE, DATA, DRAFT}),
        ("author:OLGA", {DATA}),
        ("recipe:tiny-moe", {MOE, DATA, DRAFT}),
        ("recipe:marin-moe", set()),
        (
            "outcome:did_not_work label:moe recipe:tiny-moe weight_decay>0.05 eval/loss<3.2",
            {MOE},
        ),
        ("(label:data OR weight_decay>0.15) outcome:none", {DRAFT}),
        ("NOT (label:data OR label:moe)", {DRAFT}),
    ],
)
def test_queries_against_real_rows(
    rows: dict[str, Proposal], text: str, expected: set[str]
) -> None:
    assert found(text) == expected


@pytest.mark.django_db
def test_free_words_match_title_summary_description_and_hypothesis(
    rows: dict[str, Proposal],
) -> None:
    assert found("router") == {MOE}  # title
    assert found("share") == {DATA}  # summary
    assert found("mixture") == {DATA}  # description
    assert found("reasoning") == {DATA}  # hypothesis
    assert found('"capacity factor"') == {MOE}
    assert found('"factor capacity"') == set()
    assert found("routing OR reasoning") == {DRAFT, DATA}
    assert found("capacity label:routing") == {MOE}
    assert found("-router capacity") == {DRAFT}


@pytest.mark.django_db
@pytest.mark.skipif(not ON_POSTGRES, reason="PostgreSQL full-text search")
def test_postgres_full_text_stems_ranks_and_ignores_stop_words(rows: dict[str, Proposal]) -> None:
    assert found("routed") == {DRAFT}  # "routing" and "routed": one stem
    assert found("routers") == {MOE}
    assert found("rout") == {DRAFT}
    assert found("rou") == set()  # stems, not substrings
    result = search.proposal_search(query=parse_query("the capacity"))
    assert result.ignored == ["the"]
    assert result.ranked
    # in the MoE proposal's title (weight A), it outranks the newer draft's description (D)
    assert [p.title for p in result.proposals] == [rows["moe"].title, rows["draft"].title]
    assert found("the") == {MOE, DATA, DRAFT}
    assert found("outcome:worked the") == {DATA}
    assert found("the capacity of the router") == {MOE}  # words merged into one query
    assert found("capacity router OR reasoning") == {MOE, DATA}
    # the vector follows edits, bulk writes included (a database trigger keeps it)
    Proposal.objects.filter(pk=rows["data"].pk).update(title="Sparse upcycling")
    assert found("upcycling") == {"Sparse upcycling"}


@pytest.mark.django_db
@pytest.mark.skipif(ON_POSTGRES, reason="the SQLite fallback")
def test_sqlite_fallback_matches_substrings_in_any_case(rows: dict[str, Proposal]) -> None:
    assert found("rout") == {MOE, DRAFT}
    assert found("ROUTER") == {MOE}
    assert found("routers") == set()
    assert found("the") == {MOE, DATA, DRAFT}
    result = search.proposal_search(query=parse_query("routing"))
    assert not result.ranked
    assert result.ignored == []


@pytest.mark.django_db
def test_query_count_is_bounded(rows: dict[str, Proposal], recipe: Any) -> None:
    query = parse_query("routing label:moe weight_decay>0.05 eval/loss<4 failure:oom")
    with CaptureQueriesContext(connection) as few:
        list(search.proposal_search(query=query).proposals)
    for index in range(20):
        proposal = ProposalFactory.create(recipe=recipe, title=f"Routing {index}")
        proposal.labels.add(Label.objects.get(name="moe"))
    with CaptureQueriesContext(connection) as many:
        list(search.proposal_search(query=query).proposals)
    assert len(many) == len(few) <= 3


# ------------------------------------------------------------------------------- doors


@pytest.mark.django_db
def test_search_page_lists_matches_and_explains_the_syntax(
    client: Client, rows: dict[str, Proposal]
) -> None:
    response = client.get("/search/", {"q": "label:moe OR label:data"})
    assert response.status_code == 200
    body = response.content.decode()
    assert rows["moe"].title in body
    assert rows["data"].title in body
    assert rows["draft"].title not in body
    assert "Understood as: <code>label:moe OR label:data</code>" in body
    assert 'id="syntax"' in body
    assert "/export/proposals.csv?q=label%3Amoe%20OR%20label%3Adata" in body


@pytest.mark.django_db
def test_search_page_counts_no_further_than_its_cap(
    client: Client, recipe: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from proposals import views

    monkeypatch.setattr(views, "SEARCH_PAGE_CAP", 3)
    for index in range(5):
        ProposalFactory.create(recipe=recipe, title=f"Router idea {index}")
    response = client.get("/search/", {"q": "router"})
    assert response.status_code == 200
    assert "More than 3 proposals" in response.content.decode()
    assert len(response.context["page"].object_list) == 3
    exported: Any = client.get("/export/proposals.csv", {"q": "router"})
    assert b"".join(exported.streaming_content).count(b"Router idea") == 5


@pytest.mark.django_db
def test_search_page_explains_a_syntax_error_with_a_400(client: Client) -> None:
    response = client.get("/search/", {"q": "label:moe (routing"})
    assert response.status_code == 400
    body = response.content.decode()
    assert "could not be read" in body
    assert "at column 19" in body
    assert "label:moe (routing\n" + " " * 18 + "^" in body
    assert 'aria-invalid="true"' in body


@pytest.mark.django_db
@pytest.mark.parametrize(
    "text",
    [
        "moe " * 200,
        "(" * 50 + "a" + ")" * 50,
        "a\x00b",
        "colour:red",
        "weight_decay>'; DROP TABLE proposals_proposal; --",
        "lr>1e400",
        '"unterminated',
        ")",
        "x --",
    ],
)
def test_hostile_queries_answer_400_never_500(client: Client, api: APIClient, text: str) -> None:
    assert client.get("/search/", {"q": text}).status_code == 400
    assert client.get("/export/proposals.csv", {"q": text}).status_code == 400
    response = api.get("/api/v1/search/", {"q": text})
    assert response.status_code == 400
    assert response.json()["column"] >= 1


@pytest.mark.django_db
def test_odd_but_valid_queries_run(client: Client, rows: dict[str, Proposal]) -> None:
    for text in [
        "'; DROP TABLE proposals_proposal;",
        '"\'; DROP TABLE proposals_proposal; --"',
        '"%" OR "_"',
        'weight_decay="\'"',
        "label:(" + ", ".join(f"l{i}" for i in range(20)) + ")",
        "- " * 200 + "x",
    ]:
        assert client.get("/search/", {"q": text, "page": "999"}).status_code == 200, text
    assert Proposal.objects.count() == 3


@pytest.mark.django_db
def test_search_page_escapes_the_query(client: Client) -> None:
    response = client.get("/search/", {"q": '<script>alert(1)</script> "<b>'})
    assert b"<script>alert(1)" not in response.content
    assert b"&lt;script&gt;" in response.content


@pytest.mark.django_db
def test_search_page_query_count_does_not_grow(
    client: Client, rows: dict[str, Proposal], recipe: Any
) -> None:
    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            response = client.get("/search/", {"q": "label:moe capacity"})
            assert response.status_code == 200
            assert response.context["page"].object_list
        return len(queries)

    before = count()
    for index in range(30):
        proposal = ProposalFactory.create(recipe=recipe, title=f"Capacity again {index}")
        proposal.labels.add(Label.objects.get(name="moe"))
    assert count() == before <= 5


@pytest.mark.django_db
def test_api_search_answers_rows_and_400_on_syntax_error(
    api: APIClient, rows: dict[str, Proposal]
) -> None:
    response = api.get("/api/v1/search/", {"q": "label:moe"})
    assert response.status_code == 200
    data = response.json()
    assert data["count"] == 1
    assert data["results"][0]["id"] == rows["moe"].pk
    assert data["results"][0]["url"] == f"http://testserver/proposals/{rows['moe'].pk}/"
    bad = api.get("/api/v1/search/", {"q": "stat:approved"})
    assert bad.status_code == 400
    body = bad.json()
    assert body["column"] == 1
    assert "Did you mean state?" in body["detail"]
    assert "state" in body["expected"]
    bad_csv = api.get("/api/v1/search/", {"q": "(", "format": "csv"})
    assert bad_csv.status_code == 400
    assert bad_csv.json()["column"] == 2


@pytest.mark.django_db
def test_api_search_query_count_does_not_grow(
    api: APIClient, rows: dict[str, Proposal], recipe: Any
) -> None:
    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert api.get("/api/v1/search/", {"q": "routing OR label:moe"}).status_code == 200
        return len(queries)

    # stop words, count, page; then labels, run counts and best values of the page's rows,
    # and how their recipes show the best values (runs.metrics.display)
    most = 7 if ON_POSTGRES else 6  # SQLite has no stop words to look up
    assert count() == most
    for index in range(30):
        proposal = ProposalFactory.create(recipe=recipe, title=f"Routing again {index}")
        proposal.labels.add(Label.objects.get(name="moe"))
    assert count() <= most
