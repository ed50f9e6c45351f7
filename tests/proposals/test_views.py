"""The web pages: public reads, forms that explain errors, doors that call the services."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from marin_site.doors import Door
from marin_site.events import Verb
from proposals import services
from proposals.models import Comment, Proposal, Review, State
from proposals.services import event_record
from runs.models import PlanLaunch, Run, RunEvent, RunState
from runs.services import dispatch
from runs.services import runs as run_writes
from tests.factories import (
    WALKTHROUGH_SPEC,
    CommentFactory,
    ProposalFactory,
    ReviewFactory,
    UserFactory,
)
from tests.runs.runs_helpers import launched_plan

pytestmark = pytest.mark.django_db


def _form(recipe: Any, **overrides: Any) -> dict[str, Any]:
    data = {
        "title": "Capacity factor ablation",
        "summary": "Does a higher capacity factor lower the drop fraction?",
        "recipe": recipe.pk,
        "description": "We vary the **capacity factor**.",
        "hypothesis": "A higher capacity factor lowers the drop fraction without hurting eval loss.",
        "success_metric": "eval/loss",
        "success_direction": "lower",
        "success_threshold": "0.01",
        "baseline": "",
        "ablation_spec": WALKTHROUGH_SPEC,
        "budget_accelerator_hours": "1",
        "labels": "moe, capacity",
    }
    return data | overrides


def _queries(client: Client, url: str) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx.captured_queries)


def test_list_is_public_and_shows_every_state(client: Client, recipe: Any) -> None:
    for state in State.values:
        ProposalFactory.create(recipe=recipe, state=state, title=f"Proposal in {state}")
    response = client.get("/")
    assert response.status_code == 200
    for state in State.values:
        assert f"Proposal in {state}".encode() in response.content


def test_list_filters_find_failures(client: Client, recipe: Any) -> None:
    ProposalFactory.create(
        recipe=recipe, state=State.APPROVED, outcome="did_not_work", title="Failed idea"
    )
    ProposalFactory.create(recipe=recipe, state=State.APPROVED, outcome="worked", title="Good idea")
    content = client.get("/?outcome=did_not_work").content
    assert b"Failed idea" in content
    assert b"Good idea" not in content


def test_list_paginates(client: Client, recipe: Any) -> None:
    ProposalFactory.create_batch(30, recipe=recipe)
    first = client.get("/")
    assert first.context["page"].paginator.num_pages == 2
    assert len(first.context["page"].object_list) == 25
    assert len(client.get("/?page=2").context["page"].object_list) == 5


def test_labels_link_to_the_list_filter_or_the_search(client: Client, recipe: Any) -> None:
    proposal = ProposalFactory.create(recipe=recipe, state=State.SUBMITTED)
    proposal.labels.create(name="moe-routing")
    link = '<a class="label" href="{}">moe-routing</a>'
    assert link.format("/?label=moe-routing") in client.get("/").content.decode()
    detail = client.get(proposal.get_absolute_url()).content.decode()
    assert link.format("/?label=moe-routing") in detail
    found = client.get("/search/?q=label%3Amoe-routing").content.decode()
    assert link.format("/search/?q=label:moe-routing") in found


@pytest.mark.parametrize(
    ("path", "kept"),
    [
        ("/?state=submitted&page=1", "state=submitted&amp;page=2"),
        ("/search/?q=state%3Asubmitted", "q=state%3Asubmitted&amp;page=2"),
    ],
)
def test_page_links_keep_the_filters_and_the_query(
    client: Client, recipe: Any, path: str, kept: str
) -> None:
    ProposalFactory.create_batch(30, recipe=recipe, state=State.SUBMITTED)
    page = client.get(path).content.decode()
    assert f'href="?{kept}" rel="next"' in page
    assert "Page 1 of 2" in page


def test_list_query_count_does_not_grow(client: Client, recipe: Any) -> None:
    for proposal in ProposalFactory.create_batch(2, recipe=recipe, state=State.SUBMITTED):
        ReviewFactory.create(proposal=proposal)
        proposal.labels.create(name=f"l{proposal.pk}")
    few = _queries(client, "/")
    for proposal in ProposalFactory.create_batch(10, recipe=recipe, state=State.SUBMITTED):
        ReviewFactory.create_batch(2, proposal=proposal)
        proposal.labels.create(name=f"l{proposal.pk}")
    assert _queries(client, "/") == few


def test_detail_is_public_and_shows_plan_reviews_timeline(
    client: Client, recipe: Any, contributor: Any
) -> None:
    proposal = ProposalFactory.create(recipe=recipe, state=State.SUBMITTED, author=contributor)
    ReviewFactory.create(proposal=proposal, text="Solid plan, cheap to run.")
    CommentFactory.create(proposal=proposal, body="Try top-2 as well?")
    event_record(
        proposal=proposal,
        actor=contributor,
        verb=Verb.SUBMITTED,
        door="web",
        from_state="draft",
        to_state="submitted",
    )
    response = client.get(proposal.get_absolute_url())
    assert response.status_code == 200
    content = response.content.decode()
    assert proposal.hypothesis in content
    assert "Solid plan, cheap to run." in content
    assert "Try top-2 as well?" in content
    assert "submitted" in content
    assert response.context["preview_plan"].run_count == 4


def test_detail_query_count_does_not_grow(client: Client, recipe: Any, contributor: Any) -> None:
    proposal = ProposalFactory.create(recipe=recipe, state=State.SUBMITTED, author=contributor)
    ReviewFactory.create(proposal=proposal)
    CommentFactory.create(proposal=proposal)
    event_record(proposal=proposal, actor=contributor, verb=Verb.EDITED, door="web")
    url = proposal.get_absolute_url()
    few = _queries(client, url)
    ReviewFactory.create_batch(4, proposal=proposal)
    CommentFactory.create_batch(5, proposal=proposal)
    for _ in range(5):
        event_record(proposal=proposal, actor=UserFactory.create(), verb=Verb.EDITED, door="api")
    assert _queries(client, url) == few


def test_detail_renders_markdown_sanitized(client: Client, recipe: Any) -> None:
    proposal = ProposalFactory.create(
        recipe=recipe,
        description='**bold** <script>alert("x")</script> [c](javascript:alert(1)) <img src=x onerror=alert(1)>',
    )
    content = client.get(proposal.get_absolute_url()).content.decode()
    assert "<strong>bold</strong>" in content
    assert '<script>alert("x")' not in content
    assert "javascript:alert" not in content
    assert "onerror" not in content


def test_the_proposals_path_leads_to_the_list_with_its_filters(client: Client) -> None:
    response = client.get("/proposals/?state=approved&q=moe")
    assert response.status_code == 302
    assert response["Location"] == "/?state=approved&q=moe"
    assert client.get("/proposals/", follow=True).status_code == 200


def test_detail_of_missing_proposal_is_404(client: Client) -> None:
    assert client.get("/proposals/999999/").status_code == 404


def test_form_needs_an_account(client: Client) -> None:
    response = client.get("/proposals/new/")
    assert response.status_code == 302
    assert "/accounts/login/" in response["Location"]


def test_form_preview_shows_plan_and_stores_nothing(
    client: Client, recipe: Any, contributor: Any
) -> None:
    client.force_login(contributor)
    response = client.post("/proposals/new/", {**_form(recipe), "preview": "1"})
    assert response.status_code == 200
    assert response.context["preview"]["plan"].run_count == 4
    assert b"<strong>capacity factor</strong>" in response.content
    assert Proposal.objects.count() == 0


def test_form_names_unknown_parameter_inline(client: Client, recipe: Any, contributor: Any) -> None:
    client.force_login(contributor)
    spec = "axes:\n  capacity_factr: [1.0, 1.25]\n"
    response = client.post("/proposals/new/", {**_form(recipe, ablation_spec=spec), "save": "1"})
    assert response.status_code == 400
    errors = response.context["form"].errors["ablation_spec"]
    assert any("capacity_factr" in e and "capacity_factor" in e for e in errors)
    assert b"capacity_factr" in response.content
    assert Proposal.objects.count() == 0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("ablation_spec", "- just\n- a list\n"),
        ("ablation_spec", "a: &x [1]\nb: *x\n"),
        ("baseline", "weight_decay: -1\n"),
        ("baseline", "[unclosed"),
        ("success_metric", "not a metric!"),
        ("pr_url", "javascript:alert(1)"),
        ("title", ""),
    ],
)
def test_form_refuses_bad_fields(
    client: Client, recipe: Any, contributor: Any, field: str, value: str
) -> None:
    client.force_login(contributor)
    response = client.post("/proposals/new/", {**_form(recipe, **{field: value}), "save": "1"})
    assert response.status_code == 400
    assert field in response.context["form"].errors
    assert Proposal.objects.count() == 0


def test_form_saves_a_draft_or_submits(client: Client, recipe: Any, contributor: Any) -> None:
    client.force_login(contributor)
    response = client.post("/proposals/new/", {**_form(recipe), "save": "1"})
    assert response.status_code == 302
    draft = Proposal.objects.get()
    assert (draft.state, draft.author) == (State.DRAFT, contributor)
    assert sorted(draft.labels.values_list("name", flat=True)) == ["capacity", "moe"]
    client.post("/proposals/new/", {**_form(recipe, title="Second"), "submit": "1"})
    assert Proposal.objects.get(title="Second").state == State.SUBMITTED


def test_edit_by_author_and_refused_for_others(
    client: Client, recipe: Any, contributor: Any, reviewer: Any
) -> None:
    proposal = ProposalFactory.create(recipe=recipe, author=contributor)
    client.force_login(reviewer)
    assert (
        client.post(f"/proposals/{proposal.pk}/edit/", _form(recipe, title="Hijack")).status_code
        == 403
    )
    client.force_login(contributor)
    assert client.get(f"/proposals/{proposal.pk}/edit/").status_code == 200
    response = client.post(
        f"/proposals/{proposal.pk}/edit/", {**_form(recipe, title="Sharper"), "save": "1"}
    )
    assert response.status_code == 302
    assert Proposal.objects.get(pk=proposal.pk).title == "Sharper"


def test_approve_button_for_maintainer(client: Client, recipe: Any, maintainer: Any) -> None:
    proposal = ProposalFactory.create(recipe=recipe, state=State.SUBMITTED)
    client.force_login(maintainer)
    assert "approve" in [
        name for name, _, _ in client.get(proposal.get_absolute_url()).context["actions"]
    ]
    response = client.post(f"/proposals/{proposal.pk}/transition/approve/", {"git_ref": "v1.2"})
    assert response.status_code == 302
    proposal.refresh_from_db()
    assert (proposal.state, proposal.git_ref) == (State.APPROVED, "v1.2")
    assert proposal.events.get(verb="approved").door == "web"


def test_the_approval_form_chooses_where_the_runs_go(
    client: Client, recipe: Any, maintainer: Any
) -> None:
    proposal = ProposalFactory.create(recipe=recipe, state=State.SUBMITTED)
    client.force_login(maintainer)
    page = client.get(proposal.get_absolute_url()).content.decode()
    assert 'name="executor"' in page
    url = f"/proposals/{proposal.pk}/transition/approve/"
    refused = client.post(url, {"executor": "pool:nowhere"})
    assert refused.status_code == 400
    assert b"there is no pool named" in refused.content
    assert client.post(url, {"executor": "local"}).status_code == 302
    proposal.refresh_from_db()
    assert proposal.state == State.APPROVED
    assert PlanLaunch.objects.get(plan__proposal=proposal).executor == "local"


def _launched(author: Any, maintainer: Any, recipe: Any) -> Proposal:
    """An approved proposal whose plan is expanded into queued runs."""
    proposal = ProposalFactory.create(recipe=recipe, author=author, state=State.SUBMITTED)
    services.proposal_transition(proposal_id=proposal.pk, action="approve", actor=maintainer)
    proposal.refresh_from_db()
    assert proposal.plan_id is not None
    dispatch.plan_expand(plan_id=proposal.plan_id)
    return proposal


def test_withdrawing_an_approved_proposal_on_the_site_stops_its_plan(
    client: Client, contributor: Any, maintainer: Any, recipe: Any
) -> None:
    proposal = _launched(contributor, maintainer, recipe)
    client.force_login(contributor)
    response = client.post(f"/proposals/{proposal.pk}/transition/withdraw/")
    assert response.status_code == 302
    assert Proposal.objects.get(pk=proposal.pk).state == State.WITHDRAWN
    launch = PlanLaunch.objects.get(plan__proposal=proposal)
    assert launch.canceled_at is not None
    runs = Run.objects.filter(plan__proposal=proposal)
    assert set(runs.values_list("state", flat=True)) == {RunState.KILLED}
    assert set(
        RunEvent.objects.filter(run__in=runs, verb="killed").values_list("door", flat=True)
    ) == {"web"}


def test_approve_refused_for_contributor_and_from_wrong_state(
    client: Client, recipe: Any, contributor: Any, maintainer: Any
) -> None:
    submitted = ProposalFactory.create(recipe=recipe, state=State.SUBMITTED)
    client.force_login(contributor)
    assert client.get(submitted.get_absolute_url()).context["actions"] == []
    assert client.post(f"/proposals/{submitted.pk}/transition/approve/").status_code == 403
    draft = ProposalFactory.create(recipe=recipe, state=State.DRAFT)
    client.force_login(maintainer)
    response = client.post(f"/proposals/{draft.pk}/transition/approve/")
    assert response.status_code == 409
    assert b"submitted" in response.content


def test_reject_needs_a_reason_on_the_web(client: Client, recipe: Any, maintainer: Any) -> None:
    proposal = ProposalFactory.create(recipe=recipe, state=State.SUBMITTED)
    client.force_login(maintainer)
    assert (
        client.post(f"/proposals/{proposal.pk}/transition/reject/", {"reason": ""}).status_code
        == 400
    )
    client.post(f"/proposals/{proposal.pk}/transition/reject/", {"reason": "Too costly."})
    assert Proposal.objects.get(pk=proposal.pk).state == State.REJECTED


def test_transitions_need_post_and_known_actions(
    client: Client, recipe: Any, maintainer: Any
) -> None:
    proposal = ProposalFactory.create(recipe=recipe, state=State.SUBMITTED)
    client.force_login(maintainer)
    assert client.get(f"/proposals/{proposal.pk}/transition/approve/").status_code == 405
    assert client.post(f"/proposals/{proposal.pk}/transition/explode/").status_code == 404


def test_review_on_the_web_and_never_own(client: Client, recipe: Any, reviewer: Any) -> None:
    other = ProposalFactory.create(recipe=recipe, state=State.SUBMITTED)
    own = ProposalFactory.create(recipe=recipe, state=State.SUBMITTED, author=reviewer)
    client.force_login(reviewer)
    body = {"score": "4", "recommendation": "approve", "text": "Good."}
    assert client.post(f"/proposals/{other.pk}/review/", body).status_code == 302
    assert client.post(f"/proposals/{own.pk}/review/", body).status_code == 403
    assert client.get(own.get_absolute_url()).context["can_review"] is False
    assert Review.objects.count() == 1


def test_comment_on_the_web(client: Client, proposal: Proposal, reviewer: Any) -> None:
    assert client.post(f"/proposals/{proposal.pk}/comment/", {"body": "hi"}).status_code == 302
    assert Comment.objects.count() == 0  # anonymous: sent to sign in
    client.force_login(reviewer)
    response = client.post(f"/proposals/{proposal.pk}/comment/", {"body": "Nice idea."})
    comment = Comment.objects.get()
    assert response["Location"].endswith(f"#comment-{comment.pk}")


def test_outcome_on_the_web(client: Client, recipe: Any, maintainer: Any, contributor: Any) -> None:
    proposal = ProposalFactory.create(recipe=recipe, state=State.APPROVED, author=contributor)
    body = {"outcome": "did_not_work", "confidence": "exploratory", "conclusion": "No gain."}
    client.force_login(contributor)
    assert client.post(f"/proposals/{proposal.pk}/outcome/", body).status_code == 403
    client.force_login(maintainer)
    assert client.post(f"/proposals/{proposal.pk}/outcome/", body).status_code == 302
    assert Proposal.objects.get(pk=proposal.pk).outcome == "did_not_work"


def _outcome_select(page: str) -> str:
    return page.split('name="outcome"')[1].split("</select>", maxsplit=1)[0]


def test_outcome_form_waits_for_the_runs_and_preselects_no_verdict(
    client: Client, recipe: Any, maintainer: Any, contributor: Any
) -> None:
    plan = launched_plan(recipe)  # two runs, queued
    proposal = ProposalFactory.create(
        recipe=recipe, state=State.APPROVED, author=contributor, plan=plan
    )
    client.force_login(maintainer)
    waiting = client.get(proposal.get_absolute_url()).content.decode()
    assert 'id="outcome-waits"' in waiting and "2 of 2 runs not terminal yet" in waiting
    assert "<summary>Record without results</summary>" in waiting
    assert 'name="without_results_reason"' in waiting
    reason_field = waiting.split('name="without_results_reason"')[1].split(">")[0]
    assert "required" in reason_field

    for run in Run.objects.filter(plan=plan):
        run_writes.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door="worker")
        run_writes.run_transition(run_id=run.pk, to_state=RunState.FINISHED, door="worker")
    ready = client.get(proposal.get_absolute_url()).content.decode()
    assert 'id="outcome-waits"' not in ready
    assert 'name="without_results_reason"' not in ready
    assert "<summary>Record the outcome</summary>" in ready
    select = _outcome_select(ready)
    assert '<option value="" selected>Choose a verdict…</option>' in select
    assert select.count("selected") == 1  # the prompt, never a verdict


def test_outcome_while_runs_are_queued_needs_an_explicit_reason(
    client: Client, api_as: Any, recipe: Any, maintainer: Any, contributor: Any
) -> None:
    plan = launched_plan(recipe)
    proposal = ProposalFactory.create(
        recipe=recipe, state=State.APPROVED, author=contributor, plan=plan
    )
    body = {"outcome": "worked", "confidence": "exploratory", "conclusion": "Looks good."}
    client.force_login(maintainer)
    refused = client.post(f"/proposals/{proposal.pk}/outcome/", body)
    assert refused.status_code == 400
    assert "record it without results and give a reason" in refused.content.decode()
    api = api_as(maintainer)
    answer = api.post(f"/api/v1/proposals/{proposal.pk}/outcome/", body, format="json")
    assert answer.status_code == 400 and "without_results_reason" in answer.json()
    assert Proposal.objects.get(pk=proposal.pk).outcome == ""

    body = {**body, "outcome": "not_evaluated", "without_results_reason": "Cluster reclaimed."}
    assert client.post(f"/proposals/{proposal.pk}/outcome/", body).status_code == 302
    proposal = Proposal.objects.get(pk=proposal.pk)
    assert proposal.outcome == "not_evaluated"
    event = proposal.events.get(verb="outcome_recorded")
    assert "Recorded without results (2 of 2 runs not terminal yet): Cluster reclaimed." in (
        event.message
    )


def test_outcome_form_without_a_choice_is_refused(
    client: Client, recipe: Any, maintainer: Any
) -> None:
    proposal = ProposalFactory.create(recipe=recipe, state=State.APPROVED)
    client.force_login(maintainer)
    body = {"outcome": "", "confidence": "exploratory", "conclusion": ""}
    response = client.post(f"/proposals/{proposal.pk}/outcome/", body)
    assert response.status_code == 400 and "outcome" in response.content.decode()
    assert Proposal.objects.get(pk=proposal.pk).outcome == ""


def test_review_queue(client: Client, recipe: Any, reviewer: Any, contributor: Any) -> None:
    waiting = ProposalFactory.create(recipe=recipe, state=State.SUBMITTED, title="Waiting")
    ProposalFactory.create(recipe=recipe, state=State.SUBMITTED, author=reviewer, title="Mine")
    ProposalFactory.create(recipe=recipe, state=State.DRAFT, title="Not yet")
    client.force_login(reviewer)
    response = client.get("/proposals/review-queue/")
    assert [p.pk for p in response.context["page"].object_list] == [waiting.pk]
    client.force_login(contributor)
    assert client.get("/proposals/review-queue/").status_code == 403


def test_amendments_are_shown_beside_the_approved_text(
    client: Client, recipe: Any, contributor: Any, maintainer: Any
) -> None:
    from proposals import services

    proposal = ProposalFactory.create(recipe=recipe, state=State.SUBMITTED, author=contributor)
    services.proposal_transition(proposal_id=proposal.pk, action="approve", actor=maintainer)
    services.proposal_update(
        proposal_id=proposal.pk, actor=contributor, data={"hypothesis": "Changed my mind."}
    )
    content = client.get(proposal.get_absolute_url()).content.decode()
    assert "A higher capacity factor lowers the drop fraction" in content
    assert "Changed my mind." in content
    assert content.count("Changed my mind.") >= 1


def test_recipe_pages(client: Client, recipe: Any, maintainer: Any, contributor: Any) -> None:
    assert b"tiny-moe" in client.get("/recipes/").content
    detail = client.get(recipe.get_absolute_url())
    assert detail.status_code == 200
    assert b"capacity_factor" in detail.content
    client.force_login(contributor)
    assert client.get("/recipes/new/").status_code == 403
    client.force_login(maintainer)
    assert client.get("/recipes/new/").status_code == 200


def test_a_run_finishing_and_a_run_canceled_show_on_the_proposal_timeline(
    client: Client, recipe: Any, contributor: Any, maintainer: Any
) -> None:
    plan = launched_plan(recipe)
    proposal = ProposalFactory.create(
        recipe=recipe, state=State.APPROVED, author=contributor, plan=plan
    )
    first, second = Run.objects.filter(plan=plan).order_by("entry__index")
    run_writes.run_transition(run_id=first.pk, to_state=RunState.RUNNING, door=Door.WORKER)
    run_writes.run_transition(run_id=first.pk, to_state=RunState.FINISHED, door=Door.RUNNER)
    run_writes.run_cancel(run_id=second.pk, actor=maintainer, door=Door.WEB)

    html = client.get(proposal.get_absolute_url()).content.decode()
    timeline = html.split('id="timeline-heading"')[1]
    finished = timeline.split(f'data-run-id="{first.pk}"')[-1].split("</li>")[0]
    assert "finished" in finished and f"run #{first.pk}" in finished and "Runner" in finished
    killed = timeline.split(f'data-run-id="{second.pk}"')[-1].split("</li>")[0]
    assert "killed" in killed and "max" in killed and "Web" in killed


def test_hold_and_unhold_buttons_on_the_web(
    client: Client, recipe: Any, maintainer: Any, contributor: Any
) -> None:
    proposal = ProposalFactory.create(recipe=recipe, state=State.SUBMITTED)
    client.force_login(contributor)
    assert client.post(f"/proposals/{proposal.pk}/hold/").status_code == 403
    client.force_login(maintainer)
    response = client.post(f"/proposals/{proposal.pk}/hold/", {"reason": "Budget review."})
    assert response.status_code == 302
    proposal.refresh_from_db()
    assert proposal.on_hold
    event = proposal.events.get(verb="held")
    assert (event.door, event.message) == ("web", "Budget review.")
    page = client.get(proposal.get_absolute_url()).content.decode()
    assert "action-unhold" in page and "action-approve" not in page
    assert "Put on hold: approval waits until a maintainer releases the hold." in page
    released = client.post(f"/proposals/{proposal.pk}/unhold/", follow=True)
    assert "Hold released: the proposal can be approved again." in released.content.decode()
    proposal.refresh_from_db()
    assert not proposal.on_hold


def test_the_plan_table_writes_values_as_the_run_table_does(client: Client, recipe: Any) -> None:
    proposal = ProposalFactory.create(
        recipe=recipe,
        baseline={"capacity_factor": 1.5},
        ablation_spec="axes:\n  capacity_factor: [1.0, 2.0]\n",
    )
    plan_section = (
        client.get(proposal.get_absolute_url()).content.decode().split('id="plan-heading"')[1]
    )
    assert "1.5 → <strong>1</strong>" in plan_section
    assert "<strong>1.0</strong>" not in plan_section
