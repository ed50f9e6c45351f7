"""Edits of recipes and runs made in the admin are recorded (door: admin), a run's on its
proposal's timeline too."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from proposals.models import State
from proposals.selectors import proposal_timeline, timeline_entries
from runs.models import Run
from tests.admin_support import admin_change
from tests.factories import ProposalFactory
from tests.runs.runs_helpers import launched_plan

pytestmark = pytest.mark.django_db


@pytest.fixture
def root(client: Client) -> User:
    user = User.objects.create_superuser("root", "root@example.org", "pw")
    client.force_login(user)
    return user


def test_a_recipe_edited_in_the_admin_is_in_its_history_and_on_its_page(
    client: Client, root: User, recipe: Any
) -> None:
    assert admin_change(client, recipe, title="Tiny MoE (admin)").status_code == 302
    event = recipe.events.get()
    assert (event.verb, event.door, event.actor, event.message) == (
        "admin_edited",
        "admin",
        root,
        "Changed title",
    )
    page = client.get(recipe.get_absolute_url()).content.decode()
    history = page.split('id="recipe-history"')[1].split("</ol>")[0]
    assert "edited in the admin" in history and "root" in history and "Admin" in history


def test_a_run_edited_in_the_admin_is_on_the_proposal_timeline(
    client: Client, root: User, recipe: Any
) -> None:
    plan = launched_plan(recipe)
    proposal = ProposalFactory.create(recipe=recipe, state=State.APPROVED, plan=plan)
    run = Run.objects.filter(plan=plan).order_by("entry__index").first()
    assert run is not None
    assert admin_change(client, run, max_attempts=5).status_code == 302
    entries = timeline_entries(proposal_timeline(proposal=proposal))
    edited = [e for e in entries if e.verb == "admin_edited"]
    assert [(e.kind, e.run, e.door, e.actor, e.message) for e in edited] == [
        ("run", run.pk, "admin", "root", "Changed max_attempts")
    ]
