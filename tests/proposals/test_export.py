"""The archive of what did not work, exports as CSV and JSON, and permanent URLs."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from proposals.export import COLUMN_NAMES, csv_cell
from proposals.models import Confidence, Label, Outcome, Proposal, State
from runs.models import FailureKind, MetricSummary, Plan, Run, RunState
from runs.services import plans as plan_services
from tests.factories import ProposalFactory

pytestmark = pytest.mark.django_db

EXPECTED_COLUMNS = [
    "id",
    "url",
    "api_url",
    "title",
    "summary",
    "state",
    "outcome",
    "confidence",
    "recipe",
    "recipe_version",
    "labels",
    "author",
    "created_at",
    "submitted_at",
    "decided_at",
    "concluded_at",
    "budget",
    "planned_accelerator_hours",
    "success_metric",
    "success_direction",
    "success_threshold",
    "best_value",
    "runs_total",
    "runs_finished",
    "runs_failed",
    "github_issue",
    "best_value_text",
]


def _approved_with_plan(proposal: Proposal) -> Plan:
    plan = plan_services.plan_freeze(
        recipe=proposal.recipe,
        baseline={},
        spec_text="axes:\n  weight_decay: [0.0, 0.1]\n",
        budget_accelerator_hours=None,
    )
    Proposal.objects.filter(pk=proposal.pk).update(plan=plan, state=State.APPROVED)
    return plan


def _run(plan: Plan, index: int, state: str, *, sequence: int = 0, **fields: Any) -> Run:
    entry = plan.entries.get(index=index)
    return Run.objects.create(
        plan=plan,
        entry=entry,
        sequence=sequence,
        recipe_name=plan.recipe.name,
        recipe_version=plan.recipe.version,
        config=entry.config,
        config_hash=entry.config_hash,
        state=state,
        **fields,
    )


@pytest.fixture
def tried(recipe: Any, contributor: Any) -> dict[str, Any]:
    now = timezone.now()
    failed = ProposalFactory.create(
        recipe=recipe,
        author=contributor,
        title="Top-2 routing",
        outcome=Outcome.DID_NOT_WORK,
        confidence=Confidence.REPLICATED,
        conclusion="Loss got **worse** at every scale.",
        concluded_at=now,
    )
    failed.labels.add(Label.objects.create(name="moe"))
    plan = _approved_with_plan(failed)
    finished = _run(plan, 0, RunState.FINISHED, finished_at=now)
    MetricSummary.objects.create(run=finished, key="eval/loss", last=3.25, min=3, max=6, step=9)
    oom = _run(
        plan,
        1,
        RunState.FAILED,
        failure_kind=FailureKind.OOM,
        state_reason="CUDA out of memory",
        finished_at=now,
    )
    crashed = _run(plan, 1, RunState.CRASHED, sequence=1, failure_kind=FailureKind.INFRA)
    unsure = ProposalFactory.create(
        recipe=recipe, author=contributor, title="Z-loss", outcome=Outcome.INCONCLUSIVE
    )
    worked = ProposalFactory.create(
        recipe=recipe, author=contributor, title="Longer warmup", outcome=Outcome.WORKED
    )
    draft = ProposalFactory.create(recipe=recipe, author=contributor, title="Untried idea")
    # a killed run is not a failure; a run of a plan without a proposal still shows
    worked_plan = _approved_with_plan(worked)
    _run(worked_plan, 0, RunState.KILLED)
    orphan_plan = plan_services.plan_freeze(
        recipe=recipe, baseline={}, spec_text="", budget_accelerator_hours=None
    )
    orphan = _run(orphan_plan, 0, RunState.FAILED, failure_kind=FailureKind.CODE)
    return {
        "failed": failed,
        "unsure": unsure,
        "worked": worked,
        "draft": draft,
        "oom": oom,
        "crashed": crashed,
        "orphan": orphan,
    }


# ------------------------------------------------------------------------------ archive


def test_archive_lists_proposals_that_did_not_work_or_were_inconclusive(
    client: Client, tried: dict[str, Any]
) -> None:
    response = client.get("/archive/")
    assert response.status_code == 200
    body = response.content.decode()
    assert "Top-2 routing" in body
    assert "Z-loss" in body
    assert "Longer warmup" not in body
    assert "Untried idea" not in body
    assert "Loss got worse at every scale." in body  # the conclusion's text, not its markdown
    assert "**worse**" not in body
    assert "3 runs: 1 finished, 2 failed" in body
    titles = [p.title for p in response.context["page"].object_list]
    assert titles == ["Top-2 routing", "Z-loss"]  # concluded most recently first
    assert response.context["proposal_count"] == 2
    assert response.context["run_count"] == 3


def test_archive_and_search_snippets_are_text_not_markdown(client: Client, recipe: Any) -> None:
    ProposalFactory.create(
        recipe=recipe,
        state=State.APPROVED,
        title="Snippet check",
        summary="Route with `top_k=2` and **no** [aux loss](https://example.org/aux)",
        outcome=Outcome.DID_NOT_WORK,
        confidence=Confidence.EXPLORATORY,
        conclusion="## Result\n\n- eval loss *rose* by 0.02 &amp; more\n- <script>x()</script>",
        concluded_at=timezone.now(),
    )
    archive = client.get("/archive/").content.decode()
    search = client.get("/search/?q=snippet").content.decode()
    for page in (archive, search):
        assert "Route with top_k=2 and no aux loss" in page
        assert "`" not in page.split("Route with")[1].split("<")[0]
    conclusion = archive.split("<strong>Conclusion:</strong>")[1].split("</p>")[0]
    assert conclusion.strip() == "Result eval loss rose by 0.02 &amp; more"  # the reader sees &
    assert "<script>" not in archive and "##" not in conclusion


def test_archive_lists_failed_and_crashed_runs_with_their_proposal(
    client: Client, tried: dict[str, Any]
) -> None:
    response = client.get("/archive/", {"show": "runs"})
    assert response.status_code == 200
    runs = list(response.context["page"].object_list)
    assert {r.pk for r in runs} == {tried["oom"].pk, tried["crashed"].pk, tried["orphan"].pk}
    body = response.content.decode()
    assert f'href="/runs/{tried["oom"].pk}/"' in body
    assert f'href="/proposals/{tried["failed"].pk}/"' in body
    assert "CUDA out of memory" in body
    assert "failure:oom" in body
    assert "no proposal" in body


def test_archive_is_in_the_main_navigation(client: Client) -> None:
    body = client.get("/").content.decode()
    assert 'href="/archive/"' in body
    assert 'href="/search/"' in body


def test_archive_paginates(client: Client, recipe: Any) -> None:
    for index in range(30):
        ProposalFactory.create(recipe=recipe, title=f"Dead end {index}", outcome="did_not_work")
    first = client.get("/archive/")
    assert len(first.context["page"].object_list) == 25
    second = client.get("/archive/", {"page": 2})
    assert len(second.context["page"].object_list) == 5
    assert client.get("/archive/", {"page": "junk"}).status_code == 200


@pytest.mark.parametrize("show", ["proposals", "runs"])
def test_archive_query_count_does_not_grow(
    client: Client, tried: dict[str, Any], recipe: Any, show: str
) -> None:
    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert client.get("/archive/", {"show": show}).status_code == 200
        return len(queries)

    before = count()
    for index in range(10):
        proposal = ProposalFactory.create(
            recipe=recipe, title=f"Dead end {index}", outcome="inconclusive"
        )
        proposal.labels.add(Label.objects.get(name="moe"))
        _run(_approved_with_plan(proposal), 0, RunState.CRASHED)
    assert count() == before <= 5


# ------------------------------------------------------------------------------- export


def _body(response: Any) -> bytes:
    assert response.streaming
    return b"".join(response.streaming_content)


def _csv(response: Any) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(_body(response).decode())))


def test_export_columns_are_stable() -> None:
    assert COLUMN_NAMES == EXPECTED_COLUMNS


def test_csv_export_of_a_search(client: Client, tried: dict[str, Any]) -> None:
    response = client.get("/export/proposals.csv", {"q": "label:moe"})
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    text = _body(response).decode()
    assert text.splitlines()[0] == ",".join(EXPECTED_COLUMNS)
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == 1
    row = rows[0]
    failed = tried["failed"]
    assert row["id"] == str(failed.pk)
    assert row["url"] == f"http://testserver/proposals/{failed.pk}/"
    assert row["api_url"] == f"http://testserver/api/v1/proposals/{failed.pk}/"
    assert row["state"] == "approved"
    assert row["outcome"] == "did_not_work"
    assert row["confidence"] == "replicated"
    assert row["recipe"] == "tiny-moe"
    assert row["labels"] == "moe"
    assert row["author"] == "carla"
    assert row["best_value"] == "3.25"
    assert row["best_value_text"] == "3.2500"  # eval/loss as the pages write it (nats)
    assert (row["runs_total"], row["runs_finished"], row["runs_failed"]) == ("3", "1", "2")
    assert row["concluded_at"].endswith("Z")
    assert row["github_issue"] == ""


def test_csv_export_is_safe_against_formula_injection(client: Client, recipe: Any) -> None:
    ProposalFactory.create(
        recipe=recipe, title='=HYPERLINK("http://evil.example","x")', summary="+1 -2 @SUM(A1)"
    )
    ProposalFactory.create(recipe=recipe, title="-cmd|' /C calc'!A0", summary="@x")
    rows = _csv(Client().get("/export/proposals.csv"))
    titles = {r["title"] for r in rows}
    assert titles == {'\'=HYPERLINK("http://evil.example","x")', "'-cmd|' /C calc'!A0"}
    assert {r["summary"] for r in rows} == {"'+1 -2 @SUM(A1)", "'@x"}
    assert csv_cell("\tx") == "'\tx"
    assert csv_cell("plain") == "plain"
    assert csv_cell(-0.5) == -0.5  # numbers stay numbers
    assert csv_cell(None) == ""


def test_json_export_and_search_format_parameter(client: Client, tried: dict[str, Any]) -> None:
    response = client.get(
        "/search/", {"q": "outcome:(did_not_work, inconclusive)", "format": "json"}
    )
    assert response.status_code == 200
    data = json.loads(_body(response))
    assert data["columns"] == EXPECTED_COLUMNS
    assert data["query"] == "outcome:(did_not_work, inconclusive)"
    assert {r["title"] for r in data["results"]} == {"Top-2 routing", "Z-loss"}
    first = next(r for r in data["results"] if r["title"] == "Top-2 routing")
    assert list(first) == EXPECTED_COLUMNS
    assert first["labels"] == ["moe"]
    assert first["best_value"] == 3.25
    unsure = next(r for r in data["results"] if r["title"] == "Z-loss")
    assert unsure["runs_total"] == 0
    assert unsure["best_value"] is None
    assert unsure["best_value_text"] is None
    csv_rows = _csv(client.get("/search/", {"q": "", "format": "csv"}))
    assert len(csv_rows) == 4


def test_export_refuses_bad_queries_and_formats(client: Client) -> None:
    bad = client.get("/export/proposals.json", {"q": "label:"})
    assert bad.status_code == 400
    assert bad.json()["column"] == 7
    bad_csv = client.get("/export/proposals.csv", {"q": "label:"})
    assert bad_csv.status_code == 400
    assert b"column 7" in bad_csv.content
    assert client.get("/export/proposals.xml").status_code == 404
    assert client.get("/search/", {"format": "xml"}).status_code == 400


def test_export_streams_every_row_in_bounded_queries(client: Client, recipe: Any) -> None:
    for index in range(40):
        ProposalFactory.create(recipe=recipe, title=f"Idea {index}")
    with CaptureQueriesContext(connection) as queries:
        rows = _csv(client.get("/export/proposals.csv"))
    assert len(rows) == 40
    assert len(queries) <= 4
    assert [int(r["id"]) for r in rows] == sorted((int(r["id"]) for r in rows), reverse=True)


def test_api_search_streams_csv(api: APIClient, tried: dict[str, Any]) -> None:
    response = api.get("/api/v1/search/", {"q": "label:moe", "format": "csv"})
    assert response.status_code == 200
    rows = _csv(response)
    assert [r["title"] for r in rows] == ["Top-2 routing"]


# ----------------------------------------------------------------------- permanent URLs


def test_every_proposal_and_run_has_a_permanent_url(client: Client, tried: dict[str, Any]) -> None:
    proposal = tried["failed"]
    assert proposal.get_absolute_url() == f"/proposals/{proposal.pk}/"
    assert client.get(f"/proposals/{proposal.pk}/").status_code == 200
    run = tried["oom"]
    assert run.get_absolute_url() == f"/runs/{run.pk}/"
    assert client.get(f"/runs/{run.pk}/").status_code == 200
