"""The MLflow door as MLflow users call it (the stock ``mlflow`` client, a live server): a
maintainer's ``start_run`` right after an approval, and a plan named as a person sees it."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction
from rest_framework.authtoken.models import Token

from proposals.models import State
from runs.models import PlanLaunch, Run, RunState
from runs.services import plans as plan_services
from tests.factories import ProposalFactory
from tests.runs.runs_helpers import CRITERIA, frozen_plan
from tests.runs.test_mlflow import _mlflow_env  # noqa: F401  (fixture)

pytestmark = pytest.mark.django_db(transaction=True)


def approved_unexpanded(recipe: Any, title: str) -> Any:
    """A plan just approved: launched, its expansion (a task after commit) not yet run."""
    plan = frozen_plan(recipe)
    with transaction.atomic():
        plan_services.plan_launch(plan_id=plan.pk, criteria=CRITERIA)
    proposal = ProposalFactory.create(recipe=recipe, plan=plan, title=title, state=State.APPROVED)
    assert not Run.objects.filter(plan=plan).exists()
    return plan, proposal


@pytest.fixture
def maintainer_client(maintainer: Any, live_server: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", Token.objects.create(user=maintainer).key)
    mlflow.set_tracking_uri(live_server.url + "/mlflow")
    return mlflow


@pytest.mark.parametrize("alias", ["#{number}", "{number}", "top-2-routing-for-moe"])
def test_start_run_right_after_approval_claims_a_run_of_the_plan_named_as_people_see_it(
    recipe: Any, maintainer_client: Any, alias: str
) -> None:
    mlflow = maintainer_client
    plan, proposal = approved_unexpanded(recipe, "Top-2 routing for MoE")
    experiment = mlflow.set_experiment(alias.format(number=proposal.pk))
    assert experiment.experiment_id == str(plan.pk)
    with mlflow.start_run() as active:
        mlflow.log_metric("train/loss", 2.5, step=1)
    claimed = Run.objects.get(pk=int(active.info.run_id))
    assert claimed.plan_id == plan.pk
    assert (claimed.executor, claimed.origin, claimed.state) == (
        "external",
        "claimed",
        RunState.FINISHED,
    )
    assert PlanLaunch.objects.get(plan=plan).expanded_at is not None
    assert Run.objects.filter(plan=plan).count() == plan.run_count  # expanded once


def test_a_name_that_is_no_plan_is_refused_listing_the_names_that_are(
    recipe: Any, maintainer_client: Any
) -> None:
    mlflow = maintainer_client
    approved_unexpanded(recipe, "Top-2 routing for MoE")
    from mlflow.exceptions import MlflowException

    with pytest.raises(MlflowException) as refused:
        mlflow.set_experiment("my-experiment")
    message = str(refused.value)
    assert "plan-<id>" in message and "#14 or 14" in message and "slug" in message
    with pytest.raises(MlflowException):
        mlflow.set_experiment("#999999")
