"""The demo data command: every state, failures included, and safe to run twice."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from proposals.models import Outcome, Proposal, State
from runs.models import Pool, Recipe

pytestmark = pytest.mark.django_db


def test_seed_demo_fills_every_state_and_is_idempotent(settings: Any) -> None:
    settings.DEBUG = True  # bin/run's default; pytest-django turns it off
    out = StringIO()
    call_command("seed_demo", stdout=out)
    assert set(Proposal.objects.values_list("state", flat=True)) == set(State.values)
    assert Proposal.objects.filter(outcome=Outcome.DID_NOT_WORK).count() >= 2
    assert Proposal.objects.count() >= 12
    approved = Proposal.objects.filter(state=State.APPROVED)
    assert all(p.plan_id for p in approved)
    users = get_user_model().objects
    assert set(users.get(username="max").groups.values_list("name", flat=True)) == {"maintainer"}
    assert users.get(username="carla").check_password("marin-demo")
    # Marin-scale plans go to a Ray cluster; on a machine without one they wait, never fail.
    assert dict(Recipe.objects.values_list("name", "executor")) == {
        "tiny-moe": "",
        "marin-moe": "ray",
    }
    assert "carla (contributor)" in out.getvalue()
    pool = Pool.objects.get()  # a pool for runs on anyone's compute, owned by a contributor
    assert (pool.name, pool.owner.username, pool.recipes) == (
        "community-gpus",
        "carla",
        ["tiny-moe"],
    )

    count = Proposal.objects.count()
    again = StringIO()
    call_command("seed_demo", stdout=again)
    assert Proposal.objects.count() == count
    assert "none added" in again.getvalue()


def test_seed_demo_refuses_to_create_demo_accounts_with_debug_off(settings: Any) -> None:
    settings.DEBUG = False  # production
    with pytest.raises(CommandError, match="load_recipes"):
        call_command("seed_demo", stdout=StringIO())
    assert not get_user_model().objects.exists()
    assert not Recipe.objects.exists()


def test_seed_demo_registers_the_reviewed_recipe_files_as_load_recipes_does(settings: Any) -> None:
    settings.DEBUG = True
    call_command("load_recipes", stdout=StringIO())
    loaded = {r.name: r.updated_at for r in Recipe.objects.all()}
    call_command("seed_demo", stdout=StringIO())
    assert {r.name: r.updated_at for r in Recipe.objects.all()} == loaded
