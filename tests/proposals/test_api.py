"""The proposals API: public reads, writes through the services, status codes for refusals."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from proposals import services
from proposals.models import Event, Proposal, Review, State
from runs.models import PlanLaunch, Run, RunEvent, RunState
from runs.services import dispatch
from tests.factories import (
    WALKTHROUGH_SPEC,
    CommentFactory,
    ProposalFactory,
    ReviewFactory,
    UserFactory,
)
from tests.runs.runs_helpers import launched_plan

pytestmark = pytest.mark.django_db


def _payload(recipe_row: Any, **overrides: Any) -> dict[str, Any]:
    body = {
        "title": "Capacity factor ablation",
        "summary": "Does a higher capacity factor lower the drop fraction?",
        "description": "We vary it.",
        "hypothesis": "A higher capacity factor lowers the drop fraction.",
        "success_metric": "moe/drop_fraction",
        "success_direction": "lower",
        "success_threshold": 0.01,
        "recipe": recipe_row.pk,
        "baseline": {"learning_rate": 0.002},
        "ablation_spec": WALKTHROUGH_SPEC,
        "budget_accelerator_hours": 1.0,
        "labels": ["moe"],
    }
    return body | overrides


def test_list_is_public_and_paginated(api: APIClient, recipe: Any) -> None:
    ProposalFactory.create_batch(3, recipe=recipe)
    response = api.get("/api/v1/proposals/")
    assert response.status_code == 200
    assert response.json()["count"] == 3
    assert {"next", "previous", "results"} <= set(response.json())


def test_list_query_count_does_not_grow(api: APIClient, recipe: Any) -> None:
    def count_queries() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert api.get("/api/v1/proposals/").status_code == 200
        return len(ctx.captured_queries)

    for proposal in ProposalFactory.create_batch(2, recipe=recipe, state=State.SUBMITTED):
        ReviewFactory.create(proposal=proposal)
    few = count_queries()
    for proposal in ProposalFactory.create_batch(8, recipe=recipe, state=State.SUBMITTED):
        ReviewFactory.create_batch(2, proposal=proposal)
    assert count_queries() == few


def test_list_query_count_is_fixed(
    api: APIClient, recipe: Any, django_assert_num_queries: Any
) -> None:
    ProposalFactory.create_batch(5, recipe=recipe)
    # count, the page's ids, then the rows the fragment cache lacks (all: it is off) and their
    # labels; tests/proposals/test_views_fragments.py counts a warm fragment cache's two
    with django_assert_num_queries(4):
        api.get("/api/v1/proposals/")


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("state=submitted", 1),
        ("state=draft&state=submitted", 2),
        ("author=alice", 1),
        ("label=moe", 1),
    ],
)
def test_list_filters(api: APIClient, recipe: Any, query: str, expected: int) -> None:
    alice = UserFactory.create(username="alice")
    ProposalFactory.create(recipe=recipe, state=State.SUBMITTED, author=alice).labels.create(
        name="moe"
    )
    ProposalFactory.create(recipe=recipe, state=State.DRAFT)
    ProposalFactory.create(recipe=recipe, state=State.REJECTED)
    assert api.get(f"/api/v1/proposals/?{query}").json()["count"] == expected


def test_filter_by_outcome_finds_failures(api: APIClient, recipe: Any) -> None:
    failed = ProposalFactory.create(recipe=recipe, state=State.APPROVED, outcome="did_not_work")
    ProposalFactory.create(recipe=recipe, state=State.APPROVED, outcome="worked")
    results = api.get("/api/v1/proposals/?outcome=did_not_work").json()["results"]
    assert [r["id"] for r in results] == [failed.pk]


def test_invalid_filter_value_is_a_400(api: APIClient) -> None:
    response = api.get("/api/v1/proposals/?state=bogus")
    assert response.status_code == 400
    assert "state" in response.json()


def test_create_with_token(api: APIClient, contributor: Any, recipe: Any) -> None:
    token = Token.objects.create(user=contributor)
    api.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    response = api.post("/api/v1/proposals/", _payload(recipe), format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["state"], body["author"], body["labels"]) == ("draft", "carla", ["moe"])
    assert Event.objects.get().door == "api"


def test_create_anonymous_is_401(api: APIClient, recipe: Any) -> None:
    response = api.post("/api/v1/proposals/", _payload(recipe), format="json")
    assert response.status_code == 401
    assert Proposal.objects.count() == 0


@pytest.mark.parametrize(
    ("overrides", "field", "fragment"),
    [
        ({"title": ""}, "title", "blank"),
        ({"title": "x" * 201}, "title", "200"),
        ({"success_metric": "eval loss!"}, "success_metric", "metric key"),
        ({"pr_url": "javascript:alert(1)"}, "pr_url", "valid URL"),
        ({"budget_accelerator_hours": -1}, "budget_accelerator_hours", "greater than or equal"),
        ({"ablation_spec": "- a\n- b\n"}, "ablation_spec", "must be a mapping"),
        ({"ablation_spec": "axis:\n  x: [1]\n"}, "ablation_spec", "unknown top-level key 'axis'"),
        ({"ablation_spec": "axes:\n  capacity_factr: [1.0]\n"}, "ablation_spec", "capacity_factr"),
        ({"ablation_spec": "axes:\n  weight_decay: [-0.1]\n"}, "ablation_spec", "weight_decay"),
        ({"baseline": {"top_k": "two"}}, "baseline", "top_k"),
        ({"recipe": 99999}, "recipe", "object does not exist"),
        ({"labels": ["a" * 60]}, "labels", "50"),
    ],
)
def test_create_refuses_bad_fields_naming_them(
    api_as: Any, contributor: Any, recipe: Any, overrides: dict[str, Any], field: str, fragment: str
) -> None:
    response = api_as(contributor).post(
        "/api/v1/proposals/", _payload(recipe, **overrides), format="json"
    )
    assert response.status_code == 400
    assert fragment in json.dumps(response.json()[field])
    assert Proposal.objects.count() == 0


def test_billion_laughs_spec_is_refused(api_as: Any, contributor: Any, recipe: Any) -> None:
    laughs = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    for i in range(1, 10):
        laughs += f"{chr(97 + i)}: &{chr(97 + i)} [{','.join(['*' + chr(96 + i)] * 9)}]\n"
    response = api_as(contributor).post(
        "/api/v1/proposals/", _payload(recipe, ablation_spec=laughs), format="json"
    )
    assert response.status_code == 400
    assert "anchors and aliases" in json.dumps(response.json())


def test_spec_over_64_kib_is_refused(api_as: Any, contributor: Any, recipe: Any) -> None:
    spec = "axes:\n  seed: [" + ",".join(["1"] * 40_000) + "]\n"
    response = api_as(contributor).post(
        "/api/v1/proposals/", _payload(recipe, ablation_spec=spec), format="json"
    )
    assert response.status_code == 400
    assert "ablation_spec" in response.json()


def test_spec_over_1024_runs_is_refused(api_as: Any, contributor: Any, recipe: Any) -> None:
    spec = "axes:\n  seed: [" + ",".join(str(i) for i in range(40)) + "]\n"
    spec += "  learning_rate: [" + ",".join(f"0.00{i + 1}" for i in range(9)) + "]\n"
    spec += "seeds: [0, 1, 2]\n"
    response = api_as(contributor).post(
        "/api/v1/proposals/", _payload(recipe, ablation_spec=spec), format="json"
    )
    assert response.status_code == 400
    assert "1080 runs; the limit is 1024" in json.dumps(response.json())


def test_malformed_json_is_a_400(api_as: Any, contributor: Any) -> None:
    response = api_as(contributor).post(
        "/api/v1/proposals/", data='{"title": ', content_type="application/json"
    )
    assert response.status_code == 400
    assert "JSON parse error" in response.json()["detail"]


def test_body_over_cap_is_413(api_as: Any, contributor: Any, recipe: Any, settings: Any) -> None:
    settings.REQUEST_BODY_CAP = 10_000
    body = json.dumps(_payload(recipe, description="x" * 20_000))
    response = api_as(contributor).post(
        "/api/v1/proposals/", data=body, content_type="application/json"
    )
    assert response.status_code == 413
    assert Proposal.objects.count() == 0


def test_submit_endpoint(api_as: Any, proposal: Proposal, contributor: Any) -> None:
    response = api_as(contributor).post(f"/api/v1/proposals/{proposal.pk}/submit/")
    assert response.status_code == 200
    assert response.json()["state"] == "submitted"


def test_approve_by_contributor_is_403(api_as: Any, recipe: Any, contributor: Any) -> None:
    proposal = ProposalFactory.create(recipe=recipe, state=State.SUBMITTED)
    response = api_as(contributor).post(f"/api/v1/proposals/{proposal.pk}/approve/")
    assert response.status_code == 403
    assert Proposal.objects.get(pk=proposal.pk).state == State.SUBMITTED


def test_approve_from_draft_is_409_with_allowed_states(
    api_as: Any, proposal: Proposal, maintainer: Any
) -> None:
    response = api_as(maintainer).post(f"/api/v1/proposals/{proposal.pk}/approve/")
    assert response.status_code == 409
    assert response.json()["allowed_states"] == ["submitted"]
    assert response.json()["current_state"] == "draft"


def test_approve_by_maintainer_freezes_the_plan(api_as: Any, recipe: Any, maintainer: Any) -> None:
    proposal = ProposalFactory.create(recipe=recipe, state=State.SUBMITTED)
    client = api_as(maintainer)
    response = client.post(f"/api/v1/proposals/{proposal.pk}/approve/", {"git_ref": "deadbeef"})
    assert response.status_code == 200
    assert (response.json()["state"], response.json()["git_ref"]) == ("approved", "deadbeef")
    plan = client.get(f"/api/v1/proposals/{proposal.pk}/plan/").json()
    assert plan["frozen"] is True
    assert plan["run_count"] == 4


def test_reject_needs_reason(api_as: Any, recipe: Any, maintainer: Any) -> None:
    proposal = ProposalFactory.create(recipe=recipe, state=State.SUBMITTED)
    client = api_as(maintainer)
    response = client.post(f"/api/v1/proposals/{proposal.pk}/reject/")
    assert response.status_code == 400
    assert "reason" in response.json()
    response = client.post(f"/api/v1/proposals/{proposal.pk}/reject/", {"reason": "Too costly."})
    assert response.json()["state"] == "rejected"


def test_request_changes_endpoint(api_as: Any, recipe: Any, reviewer: Any) -> None:
    proposal = ProposalFactory.create(recipe=recipe, state=State.SUBMITTED)
    response = api_as(reviewer).post(
        f"/api/v1/proposals/{proposal.pk}/request-changes/", {"reason": "Add a seed."}
    )
    assert response.status_code == 200
    assert response.json()["state"] == "changes_requested"


def test_withdraw_and_cancel_endpoints(
    api_as: Any, recipe: Any, contributor: Any, maintainer: Any
) -> None:
    mine = ProposalFactory.create(recipe=recipe, state=State.SUBMITTED, author=contributor)
    assert (
        api_as(contributor).post(f"/api/v1/proposals/{mine.pk}/withdraw/").json()["state"]
        == "withdrawn"
    )
    approved = ProposalFactory.create(recipe=recipe, state=State.APPROVED)
    assert api_as(contributor).post(f"/api/v1/proposals/{approved.pk}/cancel/").status_code == 403
    assert (
        api_as(maintainer).post(f"/api/v1/proposals/{approved.pk}/cancel/").json()["state"]
        == "canceled"
    )


def _launched(author: Any, maintainer: Any, recipe: Any) -> Proposal:
    """An approved proposal whose plan is expanded into queued runs."""
    proposal = ProposalFactory.create(recipe=recipe, author=author, state=State.SUBMITTED)
    services.proposal_transition(proposal_id=proposal.pk, action="approve", actor=maintainer)
    proposal.refresh_from_db()
    assert proposal.plan_id is not None
    dispatch.plan_expand(plan_id=proposal.plan_id)
    return proposal


@pytest.mark.parametrize(("action", "who"), [("withdraw", "author"), ("cancel", "maintainer")])
def test_withdraw_or_cancel_through_the_api_stops_the_plan(
    api_as: Any, recipe: Any, contributor: Any, maintainer: Any, action: str, who: str
) -> None:
    proposal = _launched(contributor, maintainer, recipe)
    actor = contributor if who == "author" else maintainer
    response = api_as(actor).post(f"/api/v1/proposals/{proposal.pk}/{action}/")
    assert response.status_code == 200, response.content
    launch = PlanLaunch.objects.get(plan__proposal=proposal)
    assert launch.canceled_at is not None
    runs = Run.objects.filter(plan__proposal=proposal)
    assert set(runs.values_list("state", flat=True)) == {RunState.KILLED}
    assert set(
        RunEvent.objects.filter(run__in=runs, verb="killed").values_list("door", flat=True)
    ) == {"api"}


def test_plan_preview_before_approval(api: APIClient, proposal: Proposal) -> None:
    plan = api.get(f"/api/v1/proposals/{proposal.pk}/plan/").json()
    assert plan["frozen"] is False
    assert plan["run_count"] == 4
    assert sum(run["is_baseline"] for run in plan["runs"]) == 1
    assert all(len(run["config_hash"]) == 64 for run in plan["runs"])


def test_update_by_author_and_refused_for_others(
    api_as: Any, proposal: Proposal, reviewer: Any
) -> None:
    response = api_as(reviewer).patch(
        f"/api/v1/proposals/{proposal.pk}/", {"title": "Mine now"}, format="json"
    )
    assert response.status_code == 403
    response = api_as(proposal.author).patch(
        f"/api/v1/proposals/{proposal.pk}/",
        {"title": "Sharper title", "labels": ["a", "b"]},
        format="json",
    )
    assert response.status_code == 200
    assert (response.json()["title"], response.json()["labels"]) == ("Sharper title", ["a", "b"])


def test_review_endpoint_allowed_and_refused_for_own(
    api_as: Any, recipe: Any, reviewer: Any
) -> None:
    other = ProposalFactory.create(recipe=recipe, state=State.SUBMITTED)
    own = ProposalFactory.create(recipe=recipe, state=State.SUBMITTED, author=reviewer)
    client = api_as(reviewer)
    body = {"score": 4, "recommendation": "approve", "text": "Good."}
    assert client.post("/api/v1/reviews/", {**body, "proposal": other.pk}).status_code == 201
    assert client.post("/api/v1/reviews/", {**body, "proposal": own.pk}).status_code == 403
    assert (
        client.post("/api/v1/reviews/", {**body, "proposal": other.pk, "score": 9}).status_code
        == 400
    )
    assert Review.objects.count() == 1


def test_reviews_and_comments_lists_are_public(api: APIClient, recipe: Any) -> None:
    proposal = ProposalFactory.create(recipe=recipe, state=State.SUBMITTED)
    ReviewFactory.create(proposal=proposal)
    CommentFactory.create(proposal=proposal, body="<script>alert(1)</script> **hi**")
    assert api.get(f"/api/v1/reviews/?proposal={proposal.pk}").json()["count"] == 1
    comment = api.get(f"/api/v1/comments/?proposal={proposal.pk}").json()["results"][0]
    assert "<script" not in comment["body_html"]
    assert "<strong>hi</strong>" in comment["body_html"]


def test_reviews_list_query_count_is_fixed(
    api: APIClient, recipe: Any, django_assert_num_queries: Any
) -> None:
    proposal = ProposalFactory.create(recipe=recipe, state=State.SUBMITTED)
    ReviewFactory.create_batch(4, proposal=proposal)
    CommentFactory.create_batch(4, proposal=proposal)
    with django_assert_num_queries(2):
        api.get("/api/v1/reviews/")
    with django_assert_num_queries(2):
        api.get("/api/v1/comments/")


def test_comment_endpoint(api_as: Any, api: APIClient, proposal: Proposal, reviewer: Any) -> None:
    assert api.post("/api/v1/comments/", {"proposal": proposal.pk, "body": "hi"}).status_code == 401
    response = api_as(reviewer).post("/api/v1/comments/", {"proposal": proposal.pk, "body": "hi"})
    assert response.status_code == 201
    assert response.json()["author"] == "rita"


def test_timeline_endpoint(
    api_as: Any, api: APIClient, proposal: Proposal, contributor: Any
) -> None:
    api_as(contributor).post(f"/api/v1/proposals/{proposal.pk}/submit/")
    api.force_authenticate(None)
    events = api.get(f"/api/v1/proposals/{proposal.pk}/timeline/").json()["results"]
    assert [(e["verb"], e["from_state"], e["to_state"], e["door"]) for e in events] == [
        ("submitted", "draft", "submitted", "api")
    ]


def test_outcome_endpoint(api_as: Any, recipe: Any, maintainer: Any, contributor: Any) -> None:
    proposal = ProposalFactory.create(recipe=recipe, state=State.APPROVED, author=contributor)
    body = {"outcome": "did_not_work", "conclusion": "No gain.", "confidence": "replicated"}
    assert (
        api_as(contributor).post(f"/api/v1/proposals/{proposal.pk}/outcome/", body).status_code
        == 403
    )
    response = api_as(maintainer).post(f"/api/v1/proposals/{proposal.pk}/outcome/", body)
    assert response.json()["outcome"] == "did_not_work"
    bad = api_as(maintainer).post(
        f"/api/v1/proposals/{proposal.pk}/outcome/", {**body, "outcome": "great"}
    )
    assert bad.status_code == 400


def test_schema_and_docs_are_served_without_cdn(api: APIClient) -> None:
    schema = api.get("/api/schema/")
    assert schema.status_code == 200
    assert b"/api/v1/proposals/{id}/approve/" in schema.content
    docs = api.get("/api/docs/")
    assert docs.status_code == 200
    html = docs.content.decode()
    assert "swagger-ui" in html
    for cdn in ("cdn.", "unpkg", "jsdelivr"):
        assert cdn not in html


def test_deeply_nested_json_is_a_400(api_as: Any, contributor: Any) -> None:
    body = "[" * 100_000 + "]" * 100_000
    response = api_as(contributor).post(
        "/api/v1/proposals/", data=body, content_type="application/json"
    )
    assert response.status_code == 400
    assert "nested too deeply" in response.json()["detail"]


def test_timeline_endpoint_has_the_runs_events(
    api_as: Any, recipe: Any, contributor: Any, maintainer: Any
) -> None:
    plan = launched_plan(recipe)
    proposal = ProposalFactory.create(
        recipe=recipe, state=State.APPROVED, author=contributor, plan=plan
    )
    run = Run.objects.filter(plan=plan).order_by("entry__index").first()
    assert run is not None
    api_as(maintainer).post(f"/api/v1/runs/{run.pk}/cancel/")
    api_as(contributor).post("/api/v1/comments/", {"proposal": proposal.pk, "body": "Why?"})
    entries = APIClient().get(f"/api/v1/proposals/{proposal.pk}/timeline/").json()["results"]
    rows = [(e["kind"], e["run"], e["verb"], e["to_state"], e["door"], e["actor"]) for e in entries]
    assert ("run", run.pk, "cancel_requested", "", "api", "max") in rows
    assert ("run", run.pk, "killed", "killed", "api", "max") in rows
    assert ("proposal", None, "commented", "", "api", "carla") in rows
    assert [e["created_at"] for e in entries] == sorted(e["created_at"] for e in entries)
