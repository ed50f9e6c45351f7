"""Proposal services: every transition allowed and refused, reviews, amendments, outcomes."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError

from marin_site.doors import Door
from marin_site.errors import ActionForbidden, DomainError, TransitionNotAllowed
from proposals import services
from proposals.models import Amendment, Event, Proposal, Review, State
from runs.models import Plan, PlanEntry, PlanLaunch, Run, RunEvent, RunState
from runs.services import dispatch, reconcile
from runs.services import runs as run_writes
from runs.services.recipes import recipe_update
from tests.concurrency import race
from tests.factories import ProposalFactory, UserFactory

pytestmark = pytest.mark.django_db


def _data(recipe: Any, **overrides: Any) -> dict[str, Any]:
    data = {
        "title": "Capacity factor",
        "summary": "Does a higher capacity factor help?",
        "description": "Body",
        "hypothesis": "It lowers the drop fraction.",
        "success_metric": "eval/loss",
        "success_direction": "lower",
        "success_threshold": 0.01,
        "recipe": recipe,
        "baseline": {},
        "ablation_spec": "axes:\n  capacity_factor: [1.0, 1.25]\n",
        "budget_accelerator_hours": 1.0,
    }
    return data | overrides


def _at(state: str, author: Any, recipe: Any, **fields: Any) -> Proposal:
    return ProposalFactory.create(author=author, recipe=recipe, state=state, **fields)


def test_create_records_a_created_event(contributor: Any, recipe: Any) -> None:
    proposal = services.proposal_create(
        author=contributor, data=_data(recipe), labels=["MoE", "moe", " capacity "]
    )
    assert proposal.state == State.DRAFT
    assert sorted(proposal.labels.values_list("name", flat=True)) == ["capacity", "moe"]
    event = proposal.events.get()
    assert (event.verb, event.to_state, event.actor) == ("created", "draft", contributor)


def test_create_with_unknown_parameter_stores_nothing(contributor: Any, recipe: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        services.proposal_create(
            author=contributor,
            data=_data(recipe, ablation_spec="axes:\n  capacity_factr: [1.0]\n"),
            labels=["moe"],
        )
    assert "capacity_factr" in str(caught.value.message_dict["ablation_spec"])
    assert Proposal.objects.count() == 0
    assert Event.objects.count() == 0


def test_create_with_bad_label_stores_nothing(contributor: Any, recipe: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        services.proposal_create(author=contributor, data=_data(recipe), labels=["<script>"])
    assert "labels" in caught.value.message_dict
    assert Proposal.objects.count() == 0


def test_anonymous_cannot_create(recipe: Any) -> None:
    from django.contrib.auth.models import AnonymousUser

    with pytest.raises(ActionForbidden):
        services.proposal_create(author=AnonymousUser(), data=_data(recipe))


def test_submit_by_author(proposal: Proposal, contributor: Any) -> None:
    result = services.proposal_transition(
        proposal_id=proposal.pk, action="submit", actor=contributor
    )
    assert result.state == State.SUBMITTED
    assert result.submitted_at is not None
    event = result.events.get(verb="submitted")
    assert (event.from_state, event.to_state, event.door) == ("draft", "submitted", "web")


def test_submit_refused_for_someone_else(proposal: Proposal, reviewer: Any) -> None:
    with pytest.raises(ActionForbidden):
        services.proposal_transition(proposal_id=proposal.pk, action="submit", actor=reviewer)
    proposal.refresh_from_db()
    assert proposal.state == State.DRAFT


def test_submit_refused_without_hypothesis(proposal: Proposal, contributor: Any) -> None:
    Proposal.objects.filter(pk=proposal.pk).update(hypothesis="", success_threshold=None)
    with pytest.raises(ValidationError) as caught:
        services.proposal_transition(proposal_id=proposal.pk, action="submit", actor=contributor)
    message = str(caught.value)
    assert "hypothesis is empty" in message
    assert "no threshold" in message
    assert Proposal.objects.get(pk=proposal.pk).state == State.DRAFT


def test_resubmit_after_changes_requested(contributor: Any, recipe: Any) -> None:
    proposal = _at(State.CHANGES_REQUESTED, contributor, recipe)
    result = services.proposal_transition(
        proposal_id=proposal.pk, action="submit", actor=contributor
    )
    assert result.state == State.SUBMITTED


def test_request_changes_by_reviewer_needs_reason(
    contributor: Any, reviewer: Any, recipe: Any
) -> None:
    proposal = _at(State.SUBMITTED, contributor, recipe)
    with pytest.raises(ValidationError):
        services.proposal_transition(
            proposal_id=proposal.pk, action="request_changes", actor=reviewer
        )
    result = services.proposal_transition(
        proposal_id=proposal.pk, action="request_changes", actor=reviewer, reason="Add seeds."
    )
    assert (result.state, result.state_reason) == (State.CHANGES_REQUESTED, "Add seeds.")


def test_request_changes_refused_for_contributor(contributor: Any, recipe: Any) -> None:
    proposal = _at(State.SUBMITTED, UserFactory.create(), recipe)
    with pytest.raises(ActionForbidden):
        services.proposal_transition(
            proposal_id=proposal.pk, action="request_changes", actor=contributor, reason="x"
        )


def test_approve_by_maintainer_freezes_plan_and_preregistration(
    contributor: Any, maintainer: Any, recipe: Any
) -> None:
    proposal = _at(State.SUBMITTED, contributor, recipe)
    result = services.proposal_transition(
        proposal_id=proposal.pk, action="approve", actor=maintainer, git_ref="abc123"
    )
    assert result.state == State.APPROVED
    assert result.git_ref == "abc123"
    assert result.approved_hypothesis == proposal.hypothesis
    assert result.approved_criteria == {
        "metric": "eval/loss",
        "direction": "lower",
        "threshold": 0.01,
    }
    assert result.plan is not None
    assert result.plan.run_count == 4 == result.plan.entries.count()


def test_approve_refused_for_reviewer(contributor: Any, reviewer: Any, recipe: Any) -> None:
    proposal = _at(State.SUBMITTED, contributor, recipe)
    with pytest.raises(ActionForbidden):
        services.proposal_transition(proposal_id=proposal.pk, action="approve", actor=reviewer)
    assert Plan.objects.count() == 0


def test_approve_refused_from_draft_names_allowed_states(
    proposal: Proposal, maintainer: Any
) -> None:
    with pytest.raises(TransitionNotAllowed) as caught:
        services.proposal_transition(proposal_id=proposal.pk, action="approve", actor=maintainer)
    assert caught.value.allowed == ["submitted"]
    assert "allowed from: submitted" in caught.value.message
    assert Plan.objects.count() == 0


def test_approving_twice_changes_nothing(contributor: Any, maintainer: Any, recipe: Any) -> None:
    proposal = _at(State.SUBMITTED, contributor, recipe)
    services.proposal_transition(proposal_id=proposal.pk, action="approve", actor=maintainer)
    services.proposal_transition(proposal_id=proposal.pk, action="approve", actor=maintainer)
    assert Plan.objects.count() == 1
    assert proposal.events.filter(verb="approved").count() == 1


def test_approval_commits_the_plan_launch_with_it(
    contributor: Any, maintainer: Any, recipe: Any
) -> None:
    """The launch row is part of the approval's transaction (only its expansion waits for
    the commit): a process dying just after the commit cannot lose it."""
    proposal = _at(State.SUBMITTED, contributor, recipe)
    approved = services.proposal_transition(
        proposal_id=proposal.pk, action="approve", actor=maintainer
    )
    launch = PlanLaunch.objects.get(plan__proposal=approved)
    assert launch.criteria == approved.approved_criteria
    assert launch.canceled_at is None


@pytest.mark.django_db(transaction=True)
def test_two_approvals_at_once_freeze_and_launch_one_plan(
    contributor: Any, maintainer: Any, recipe: Any
) -> None:
    """The second approval waits for the first one's lock on the proposal, then finds it
    approved and changes nothing."""
    proposal = _at(State.SUBMITTED, contributor, recipe)

    def approve() -> Proposal:
        return services.proposal_transition(
            proposal_id=proposal.pk, action="approve", actor=maintainer
        )

    first, second = race(approve, approve)

    assert first.plan_id == second.plan_id
    assert Plan.objects.count() == 1 == PlanLaunch.objects.count()
    assert Proposal.objects.get(pk=proposal.pk).plan_id == first.plan_id
    assert proposal.events.filter(verb="approved").count() == 1


def test_reject_by_maintainer_needs_reason(contributor: Any, maintainer: Any, recipe: Any) -> None:
    proposal = _at(State.SUBMITTED, contributor, recipe)
    with pytest.raises(ValidationError):
        services.proposal_transition(proposal_id=proposal.pk, action="reject", actor=maintainer)
    result = services.proposal_transition(
        proposal_id=proposal.pk, action="reject", actor=maintainer, reason="Out of budget."
    )
    assert result.state == State.REJECTED
    assert result.decided_at is not None


def test_reject_refused_for_author(contributor: Any, recipe: Any) -> None:
    proposal = _at(State.SUBMITTED, contributor, recipe)
    with pytest.raises(ActionForbidden):
        services.proposal_transition(
            proposal_id=proposal.pk, action="reject", actor=contributor, reason="x"
        )


@pytest.mark.parametrize(
    "state", [State.DRAFT, State.SUBMITTED, State.CHANGES_REQUESTED, State.APPROVED]
)
def test_withdraw_by_author_from_each_allowed_state(
    contributor: Any, recipe: Any, state: str
) -> None:
    proposal = _at(state, contributor, recipe)
    result = services.proposal_transition(
        proposal_id=proposal.pk, action="withdraw", actor=contributor
    )
    assert result.state == State.WITHDRAWN


@pytest.mark.parametrize("state", [State.REJECTED, State.CANCELED])
def test_withdraw_refused_from_final_states(contributor: Any, recipe: Any, state: str) -> None:
    proposal = _at(state, contributor, recipe)
    with pytest.raises(TransitionNotAllowed) as caught:
        services.proposal_transition(proposal_id=proposal.pk, action="withdraw", actor=contributor)
    assert set(caught.value.allowed) == {"approved", "changes_requested", "draft", "submitted"}


def test_withdraw_refused_for_maintainer_who_is_not_author(
    contributor: Any, maintainer: Any, recipe: Any
) -> None:
    proposal = _at(State.SUBMITTED, contributor, recipe)
    with pytest.raises(ActionForbidden):
        services.proposal_transition(proposal_id=proposal.pk, action="withdraw", actor=maintainer)


def test_cancel_by_maintainer(contributor: Any, maintainer: Any, recipe: Any) -> None:
    proposal = _at(State.APPROVED, contributor, recipe)
    result = services.proposal_transition(
        proposal_id=proposal.pk, action="cancel", actor=maintainer
    )
    assert result.state == State.CANCELED


def test_cancel_refused_for_author_and_from_submitted(
    contributor: Any, maintainer: Any, recipe: Any
) -> None:
    approved = _at(State.APPROVED, contributor, recipe)
    with pytest.raises(ActionForbidden):
        services.proposal_transition(proposal_id=approved.pk, action="cancel", actor=contributor)
    submitted = _at(State.SUBMITTED, contributor, recipe)
    with pytest.raises(TransitionNotAllowed):
        services.proposal_transition(proposal_id=submitted.pk, action="cancel", actor=maintainer)


def _launched(contributor: Any, maintainer: Any, recipe: Any, **fields: Any) -> Proposal:
    """An approved proposal whose plan is expanded into queued runs."""
    proposal = _at(State.SUBMITTED, contributor, recipe, **fields)
    services.proposal_transition(proposal_id=proposal.pk, action="approve", actor=maintainer)
    proposal.refresh_from_db()
    assert proposal.plan_id is not None
    dispatch.plan_expand(plan_id=proposal.plan_id)
    return proposal


def _start(run: Run) -> None:
    run_writes.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door="worker")


@pytest.mark.parametrize(("action", "who"), [("cancel", "maintainer"), ("withdraw", "author")])
def test_cancel_or_withdrawal_stops_the_plan_with_the_proposal(
    contributor: Any, maintainer: Any, recipe: Any, action: str, who: str
) -> None:
    """In the same transaction: queued runs killed, running ones asked to stop, nothing more
    dispatched; a maintainer's cancel after a withdrawal has nothing left to stop."""
    proposal = _launched(contributor, maintainer, recipe)
    running = Run.objects.filter(plan__proposal=proposal).order_by("pk").first()
    assert running is not None
    _start(running)
    actor = maintainer if who == "maintainer" else contributor

    services.proposal_transition(proposal_id=proposal.pk, action=action, actor=actor)

    launch = PlanLaunch.objects.get(plan__proposal=proposal)
    assert launch.canceled_at is not None
    runs = Run.objects.filter(plan__proposal=proposal)
    assert set(runs.exclude(pk=running.pk).values_list("state", flat=True)) == {RunState.KILLED}
    running.refresh_from_db()
    assert running.state == RunState.RUNNING
    assert running.cancel_requested_at is not None
    assert runs.filter(cancel_requested_at__isnull=True).count() == 0
    assert dispatch.runs_dispatch() == []
    kill = RunEvent.objects.filter(run__plan__proposal=proposal, verb="killed").first()
    assert kill is not None
    assert (kill.actor, kill.from_state, kill.door) == (actor, RunState.QUEUED, "web")


def test_cancelling_a_plan_of_a_thousand_runs_takes_a_few_queries(
    contributor: Any,
    maintainer: Any,
    recipe: Any,
    django_assert_max_num_queries: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """A cancel used to ask each run in turn (thousands of queries, longer than the
    server's timeout); now it is set-based, and the running runs' stops go to a task."""
    grid = (
        "axes:\n"
        "  learning_rate: [0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007, 0.008, 0.009, 0.01]\n"
        "  weight_decay: [0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09, 0.1]\n"
        "  capacity_factor: [1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 6.0]\n"
    )
    proposal = _launched(
        contributor, maintainer, recipe, ablation_spec=grid, budget_accelerator_hours=None
    )
    runs = Run.objects.filter(plan__proposal=proposal)
    assert runs.count() >= 1000
    for run in runs.order_by("pk")[:3]:
        _start(run)

    with django_capture_on_commit_callbacks() as after_commit, django_assert_max_num_queries(40):
        services.proposal_transition(proposal_id=proposal.pk, action="cancel", actor=maintainer)

    assert runs.filter(state=RunState.KILLED).count() == runs.count() - 3
    assert runs.filter(state=RunState.RUNNING, cancel_requested_at__isnull=False).count() == 3
    assert runs.filter(cancel_requested_at__isnull=True).count() == 0
    assert RunEvent.objects.filter(run__plan__proposal=proposal, verb="killed").count() == (
        runs.count() - 3
    )
    assert len(after_commit) >= 1  # the running runs' stops and the summary, after commit
    assert (
        services.proposal_transition(
            proposal_id=proposal.pk, action="cancel", actor=maintainer
        ).state
        == State.CANCELED
    )


def test_reconciler_launches_an_approved_plan_whose_launch_was_lost(
    contributor: Any, maintainer: Any, recipe: Any, settings: Any
) -> None:
    settings.RUNS_DEFAULT_EXECUTOR, settings.RAY_ADDRESS = "ray", ""  # nothing starts
    proposal = _at(State.SUBMITTED, contributor, recipe)
    services.proposal_transition(proposal_id=proposal.pk, action="approve", actor=maintainer)
    proposal.refresh_from_db()
    PlanLaunch.objects.filter(plan__proposal=proposal).delete()  # as a lost hand-off left it

    reconcile.runs_reconcile()

    launch = PlanLaunch.objects.get(plan__proposal=proposal)
    assert launch.criteria == proposal.approved_criteria
    assert launch.expanded_at is not None
    assert Run.objects.filter(plan__proposal=proposal, state=RunState.QUEUED).count() == 4


@pytest.mark.parametrize("state", [State.CANCELED, State.WITHDRAWN])
def test_reconciler_cancels_the_plan_of_a_stopped_proposal_whose_cancel_was_lost(
    contributor: Any, maintainer: Any, recipe: Any, state: str
) -> None:
    proposal = _launched(contributor, maintainer, recipe)
    Proposal.objects.filter(pk=proposal.pk).update(state=state)  # the plan's cancel never ran

    reconcile.runs_reconcile()

    assert PlanLaunch.objects.get(plan__proposal=proposal).canceled_at is not None
    states = set(Run.objects.filter(plan__proposal=proposal).values_list("state", flat=True))
    assert states == {RunState.KILLED}


def test_reconciler_leaves_rejected_and_approved_plans_alone(
    contributor: Any, maintainer: Any, recipe: Any
) -> None:
    proposal = _launched(contributor, maintainer, recipe)
    assert services.proposal_plans_reconcile() == {"launched": 0, "canceled": 0}
    assert PlanLaunch.objects.get(plan__proposal=proposal).canceled_at is None


def test_unknown_action_is_refused(proposal: Proposal, maintainer: Any) -> None:
    with pytest.raises(DomainError):
        services.proposal_transition(proposal_id=proposal.pk, action="explode", actor=maintainer)


def test_review_by_reviewer_then_update(contributor: Any, reviewer: Any, recipe: Any) -> None:
    proposal = _at(State.SUBMITTED, contributor, recipe)
    services.review_submit(
        proposal_id=proposal.pk, reviewer=reviewer, score=3, recommendation="approve", text="ok"
    )
    services.review_submit(
        proposal_id=proposal.pk, reviewer=reviewer, score=5, recommendation="approve", text="great"
    )
    review = Review.objects.get()
    assert (review.score, review.text) == (5, "great")
    assert [e.verb for e in proposal.events.all()] == ["reviewed", "review_updated"]


def test_reviewer_never_reviews_own_proposal(reviewer: Any, recipe: Any) -> None:
    proposal = _at(State.SUBMITTED, reviewer, recipe)
    with pytest.raises(ActionForbidden):
        services.review_submit(
            proposal_id=proposal.pk, reviewer=reviewer, score=5, recommendation="approve", text="!"
        )
    assert Review.objects.count() == 0


def test_maintainer_never_reviews_own_proposal(maintainer: Any, recipe: Any) -> None:
    proposal = _at(State.SUBMITTED, maintainer, recipe)
    with pytest.raises(ActionForbidden):
        services.review_submit(
            proposal_id=proposal.pk,
            reviewer=maintainer,
            score=5,
            recommendation="approve",
            text="!",
        )


def test_contributor_cannot_review(contributor: Any, recipe: Any) -> None:
    proposal = _at(State.SUBMITTED, UserFactory.create(), recipe)
    with pytest.raises(ActionForbidden):
        services.review_submit(
            proposal_id=proposal.pk,
            reviewer=contributor,
            score=5,
            recommendation="approve",
            text="x",
        )


@pytest.mark.parametrize("score", [0, 6])
def test_review_score_outside_1_to_5_is_refused(
    contributor: Any, reviewer: Any, recipe: Any, score: int
) -> None:
    proposal = _at(State.SUBMITTED, contributor, recipe)
    with pytest.raises(ValidationError) as caught:
        services.review_submit(
            proposal_id=proposal.pk,
            reviewer=reviewer,
            score=score,
            recommendation="approve",
            text="x",
        )
    assert "score" in caught.value.message_dict
    assert Review.objects.count() == 0


def test_review_refused_on_draft(contributor: Any, reviewer: Any, recipe: Any) -> None:
    proposal = _at(State.DRAFT, contributor, recipe)
    with pytest.raises(TransitionNotAllowed):
        services.review_submit(
            proposal_id=proposal.pk, reviewer=reviewer, score=4, recommendation="approve", text="x"
        )


def test_edit_by_author_while_submitted(contributor: Any, recipe: Any) -> None:
    proposal = _at(State.SUBMITTED, contributor, recipe)
    services.proposal_update(
        proposal_id=proposal.pk, actor=contributor, data={"title": "New title"}, labels=["x"]
    )
    proposal.refresh_from_db()
    assert proposal.title == "New title"
    assert proposal.events.get().message == "Changed labels, title"


def test_edit_refused_for_other_contributor(contributor: Any, recipe: Any) -> None:
    proposal = _at(State.DRAFT, UserFactory.create(), recipe)
    with pytest.raises(ActionForbidden):
        services.proposal_update(proposal_id=proposal.pk, actor=contributor, data={"title": "x"})


def test_edit_refused_after_rejection(contributor: Any, recipe: Any) -> None:
    proposal = _at(State.REJECTED, contributor, recipe)
    with pytest.raises(TransitionNotAllowed):
        services.proposal_update(proposal_id=proposal.pk, actor=contributor, data={"title": "x"})


def test_after_approval_hypothesis_edits_become_amendments(
    contributor: Any, maintainer: Any, recipe: Any
) -> None:
    proposal = _at(State.SUBMITTED, contributor, recipe)
    services.proposal_transition(proposal_id=proposal.pk, action="approve", actor=maintainer)
    services.proposal_update(
        proposal_id=proposal.pk,
        actor=contributor,
        data={"hypothesis": "Revised after seeing the data.", "success_threshold": 0.05},
    )
    proposal.refresh_from_db()
    assert proposal.approved_hypothesis.startswith("A higher capacity factor")
    assert proposal.approved_criteria == {
        "metric": "eval/loss",
        "direction": "lower",
        "threshold": 0.01,
    }
    assert proposal.hypothesis == "Revised after seeing the data."
    amendments = {a.field: (a.old_value, a.new_value) for a in Amendment.objects.all()}
    assert amendments["success_threshold"] == ("0.01", "0.05")
    assert amendments["hypothesis"][1] == "Revised after seeing the data."


def test_after_approval_plan_fields_are_locked(
    contributor: Any, maintainer: Any, recipe: Any
) -> None:
    proposal = _at(State.SUBMITTED, contributor, recipe)
    services.proposal_transition(proposal_id=proposal.pk, action="approve", actor=maintainer)
    with pytest.raises(DomainError, match="ablation_spec"):
        services.proposal_update(
            proposal_id=proposal.pk, actor=contributor, data={"ablation_spec": "seeds: [1]"}
        )


def test_frozen_plan_survives_recipe_edit(contributor: Any, maintainer: Any, recipe: Any) -> None:
    proposal = _at(State.SUBMITTED, contributor, recipe)
    approved = services.proposal_transition(
        proposal_id=proposal.pk, action="approve", actor=maintainer
    )
    hashes = list(PlanEntry.objects.order_by("index").values_list("config_hash", flat=True))
    recipe_update(recipe=recipe, data={"default_config": {**recipe.default_config, "steps": 999}})
    assert list(PlanEntry.objects.order_by("index").values_list("config_hash", flat=True)) == hashes
    assert approved.plan is not None
    approved.plan.refresh_from_db()
    assert approved.plan.recipe_snapshot["default_config"]["steps"] == 200


def test_outcome_recorded_by_maintainer(contributor: Any, maintainer: Any, recipe: Any) -> None:
    proposal = _at(State.APPROVED, contributor, recipe)
    result = services.proposal_record_outcome(
        proposal_id=proposal.pk,
        actor=maintainer,
        outcome="did_not_work",
        conclusion="No effect.",
        confidence="exploratory",
    )
    assert result.outcome == "did_not_work"
    event = result.events.get(verb="outcome_recorded")
    assert (event.from_state, event.to_state) == ("", "did_not_work")


def test_outcome_refused_for_author_and_for_drafts(
    contributor: Any, maintainer: Any, recipe: Any
) -> None:
    approved = _at(State.APPROVED, contributor, recipe)
    with pytest.raises(ActionForbidden):
        services.proposal_record_outcome(
            proposal_id=approved.pk,
            actor=contributor,
            outcome="worked",
            conclusion="",
            confidence="stable",
        )
    draft = _at(State.DRAFT, contributor, recipe)
    with pytest.raises(TransitionNotAllowed):
        services.proposal_record_outcome(
            proposal_id=draft.pk,
            actor=maintainer,
            outcome="worked",
            conclusion="",
            confidence="stable",
        )


def test_comment_needs_a_body_and_an_account(proposal: Proposal, reviewer: Any) -> None:
    from django.contrib.auth.models import AnonymousUser

    with pytest.raises(ValidationError):
        services.comment_create(proposal_id=proposal.pk, author=reviewer, body="   ")
    with pytest.raises(ActionForbidden):
        services.comment_create(proposal_id=proposal.pk, author=AnonymousUser(), body="hi")
    comment = services.comment_create(proposal_id=proposal.pk, author=reviewer, body="hi")
    assert comment.author_label == "rita"


@pytest.mark.parametrize("door", [Door.WEB, Door.API, Door.GITHUB])
def test_a_comment_is_recorded_on_the_timeline_with_its_door(
    proposal: Proposal, reviewer: Any, door: str
) -> None:
    long_body = "Have you tried top-2 routing?\n\n" + "More words. " * 50
    services.comment_create(proposal_id=proposal.pk, author=reviewer, body=long_body, door=door)
    event = proposal.events.get(verb="commented")
    assert (event.actor, event.door) == (reviewer, door)
    assert event.message.startswith("Have you tried top-2 routing? More words.")
    assert len(event.message) <= 280


def test_a_refused_comment_records_nothing(proposal: Proposal) -> None:
    from django.contrib.auth.models import AnonymousUser

    with pytest.raises(ActionForbidden):
        services.comment_create(proposal_id=proposal.pk, author=AnonymousUser(), body="hi")
    assert not proposal.events.exists()


# --- the dry run before approval -------------------------------------------------------


def _failed_dry_run(proposal: Proposal) -> Any:
    from runs.models import DryRun

    return DryRun.objects.create(
        recipe=proposal.recipe,
        subject=services.dry_run_subject(proposal),
        state="failed",
        reason="exit code 3",
    )


def test_a_failed_dry_run_blocks_approval_without_a_reason(
    contributor: Any, recipe: Any, maintainer: Any
) -> None:
    proposal = _at(State.SUBMITTED, contributor, recipe)
    _failed_dry_run(proposal)
    with pytest.raises(ValidationError) as refused:
        services.proposal_transition(proposal_id=proposal.pk, action="approve", actor=maintainer)
    assert "dry_run_override" in refused.value.message_dict
    assert "exit code 3" in refused.value.message_dict["dry_run_override"][0]
    assert Proposal.objects.get(pk=proposal.pk).state == State.SUBMITTED


def test_a_maintainer_approves_over_a_failed_dry_run_with_a_reason_on_the_timeline(
    contributor: Any, recipe: Any, maintainer: Any
) -> None:
    proposal = _at(State.SUBMITTED, contributor, recipe)
    dry_run = _failed_dry_run(proposal)
    approved = services.proposal_transition(
        proposal_id=proposal.pk,
        action="approve",
        actor=maintainer,
        dry_run_override="the eval data is mounted on the cluster only",
    )
    assert approved.state == State.APPROVED
    event = Event.objects.get(proposal=proposal, verb="dry_run_overridden")
    assert event.actor == maintainer
    assert f"dry run {dry_run.pk} failed" in event.message
    assert "mounted on the cluster only" in event.message


def test_only_a_maintainer_starts_a_dry_run(
    contributor: Any, recipe: Any, maintainer: Any, django_capture_on_commit_callbacks: Any
) -> None:
    proposal = _at(State.SUBMITTED, contributor, recipe)
    with pytest.raises(ActionForbidden):
        services.proposal_dry_run(proposal_id=proposal.pk, actor=contributor)
    with django_capture_on_commit_callbacks(execute=False):
        dry_run = services.proposal_dry_run(proposal_id=proposal.pk, actor=maintainer)
    assert dry_run.subject == f"proposal-{proposal.pk}"
    assert Event.objects.filter(proposal=proposal, verb="dry_run_started").exists()


# --- who may launch where -------------------------------------------------------------


@pytest.mark.parametrize("executor", ["ray", "iris"])
def test_the_approving_maintainer_chooses_the_executor_within_its_allow_list(
    contributor: Any, recipe: Any, maintainer: Any, settings: Any, executor: str
) -> None:
    settings.RUNS_EXECUTOR_LAUNCHERS = {executor: ["alice"]}
    proposal = _at(State.SUBMITTED, contributor, recipe)
    with pytest.raises(ValidationError) as refused:
        services.proposal_transition(
            proposal_id=proposal.pk, action="approve", actor=maintainer, executor=executor
        )
    assert refused.value.message_dict["executor"] == [
        f"max may not launch on '{executor}' (who may: alice)"
    ]
    assert Proposal.objects.get(pk=proposal.pk).state == State.SUBMITTED
    alice = UserFactory.create(username="alice", roles=["maintainer"])
    approved = services.proposal_transition(
        proposal_id=proposal.pk, action="approve", actor=alice, executor=executor
    )
    assert PlanLaunch.objects.get(plan__proposal=approved).executor == executor


def test_a_pool_launches_only_for_its_launchers(
    contributor: Any, recipe: Any, maintainer: Any
) -> None:
    from tests.runs.pools.pool_helpers import make_pool

    pool = make_pool(maintainer, labels=[], launchers=["olga"])
    proposal = _at(State.SUBMITTED, contributor, recipe)
    with pytest.raises(ValidationError) as refused:
        services.proposal_transition(
            proposal_id=proposal.pk, action="approve", actor=maintainer, executor=pool.executor
        )
    assert (
        "may not launch on 'pool:gpu' (who may: olga)" in refused.value.message_dict["executor"][0]
    )


def test_the_status_says_the_latest_dry_run_beside_the_sites_estimate(
    contributor: Any, recipe: Any
) -> None:
    from proposals.selectors import proposal_status_text
    from runs.models import DryRun

    proposal = _at(State.SUBMITTED, contributor, recipe)
    DryRun.objects.create(
        recipe=recipe,
        subject=services.dry_run_subject(proposal),
        state="succeeded",
        figures={"steps": 2000.0, "flops": 3.82e17, "cost": 12.5},
        estimate={"flops": 3.9e17, "accelerator_hours": 1.0},
    )
    text = proposal_status_text(proposal)
    assert "succeeded (2,000 steps, 3.82e+17 FLOPs, cost 12.50)" in text
    assert "the site's estimate 3.9e+17 FLOPs" in text
