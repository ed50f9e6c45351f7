"""A proposal's preregistered verdict rule: checked against its recipe, written out with every
parameter, frozen at approval into the launch's criteria, amended on the record after."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.exceptions import ValidationError

from proposals import services
from proposals.models import Amendment, State
from runs.models import PlanLaunch
from tests.factories import ProposalFactory, RecipeFactory

pytestmark = pytest.mark.django_db


def _data(recipe: Any, **overrides: Any) -> dict[str, Any]:
    return {
        "title": "Gate 1",
        "summary": "Does the variant pass gate 1?",
        "hypothesis": "It is faster in wall-clock time.",
        "success_metric": "eval/loss",
        "success_direction": "lower",
        "success_threshold": 0.01,
        "recipe": recipe,
        "baseline": {},
        "ablation_spec": "axes:\n  capacity_factor: [1.25]\nscales: [small, medium]\n",
    } | overrides


@pytest.fixture
def gate_recipe() -> Any:
    return RecipeFactory.create(
        verdict_rules=[{"kind": "effective_speedup", "metric": "eval/loss"}, {"kind": "ladder"}]
    )


def test_the_rule_is_written_out_with_the_recipe_s_parameters(
    contributor: Any, gate_recipe: Any
) -> None:
    proposal = services.proposal_create(
        author=contributor,
        data=_data(gate_recipe, verdict_rule={"kind": "effective_speedup", "alpha": 0.1}),
    )
    assert proposal.verdict_rule == {
        "kind": "effective_speedup",
        "version": 1,
        "asymptote": 1.6,
        "alpha": 0.1,  # the proposal's own
        "metric": "eval/loss",  # the recipe's
    }


@pytest.mark.parametrize(
    ("rule", "words"),
    [
        ({"kind": "speedrun_threshold"}, "the recipe declares only effective_speedup, ladder"),
        ({"kind": "gate_three"}, "is not a rule"),
        ({"kind": "effective_speedup", "alpha": -1}, "rule.alpha"),
        ({"kind": "effective_speedup", "beta": 1}, "rule.beta"),
        ("effective_speedup", "must be an object"),
    ],
)
def test_a_rule_the_recipe_does_not_offer_is_refused(
    contributor: Any, gate_recipe: Any, rule: Any, words: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        services.proposal_create(author=contributor, data=_data(gate_recipe, verdict_rule=rule))
    assert words in " ".join(refused.value.message_dict["verdict_rule"])


def test_approval_freezes_the_rule_into_the_launch_and_amendments_are_recorded(
    contributor: Any, maintainer: Any, gate_recipe: Any
) -> None:
    proposal = ProposalFactory.create(
        author=contributor,
        recipe=gate_recipe,
        state=State.SUBMITTED,
        ablation_spec="axes:\n  capacity_factor: [1.25]\nscales: [small, medium]\n",
        verdict_rule={
            "kind": "effective_speedup",
            "version": 1,
            "asymptote": 1.6,
            "alpha": 0.0941,
            "metric": "eval/loss",
        },
    )
    approved = services.proposal_transition(
        proposal_id=proposal.pk, action="approve", actor=maintainer
    )
    criteria: Any = approved.approved_criteria
    frozen = criteria["rule"]
    assert frozen["kind"] == "effective_speedup" and frozen["alpha"] == 0.0941
    launch = PlanLaunch.objects.get(plan=approved.plan)
    assert launch.criteria["rule"] == frozen
    services.proposal_update(
        proposal_id=proposal.pk,
        actor=maintainer,
        data={"verdict_rule": {"kind": "effective_speedup", "alpha": 0.08}},
    )
    amendment = Amendment.objects.get(proposal=proposal, field="verdict_rule")
    assert json.loads(amendment.old_value)["alpha"] == 0.0941
    assert json.loads(amendment.new_value)["alpha"] == 0.08
    approved.refresh_from_db()
    criteria = approved.approved_criteria
    assert criteria["rule"]["alpha"] == 0.0941  # the approved one stays
