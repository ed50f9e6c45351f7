"""Edits made in the admin are recorded on the proposal's timeline (door: admin), and the
timeline itself cannot be edited there."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from marin_site.events import Verb
from proposals.models import Comment, Event, Proposal, State
from proposals.services import event_record
from tests.admin_support import admin_change, admin_delete
from tests.factories import CommentFactory, ProposalFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def root(client: Client) -> User:
    user = User.objects.create_superuser("root", "root@example.org", "pw")
    client.force_login(user)
    return user


def test_a_proposal_edited_in_the_admin_is_on_its_timeline(
    client: Client, root: User, recipe: Any
) -> None:
    proposal = ProposalFactory.create(recipe=recipe, state=State.SUBMITTED, ablation_spec="")
    response = admin_change(client, proposal, title="Renamed by an admin")
    assert response.status_code == 302, response.content.decode()[:2000]
    assert Proposal.objects.get(pk=proposal.pk).title == "Renamed by an admin"
    event = proposal.events.get()
    assert (event.verb, event.door, event.actor, event.message) == (
        "admin_edited",
        "admin",
        root,
        "Changed title",
    )


def test_saving_unchanged_in_the_admin_records_nothing(
    client: Client, root: User, recipe: Any
) -> None:
    proposal = ProposalFactory.create(recipe=recipe, ablation_spec="axes: {}")
    assert admin_change(client, proposal).status_code == 302
    assert not proposal.events.exists()


def test_a_comment_edited_and_deleted_in_the_admin_is_on_its_proposal_s_timeline(
    client: Client, root: User, recipe: Any
) -> None:
    comment = CommentFactory.create(proposal=ProposalFactory.create(recipe=recipe))
    assert admin_change(client, comment, body="[removed: spam]").status_code == 302
    assert admin_delete(client, comment).status_code == 302
    assert not Comment.objects.filter(pk=comment.pk).exists()
    assert [(e.verb, e.door, e.message[:8]) for e in comment.proposal.events.all()] == [
        ("admin_edited", "admin", "Comment:"),
        ("admin_deleted", "admin", "Comment:"),
    ]


def test_timeline_rows_cannot_be_changed_in_the_admin(
    client: Client, root: User, recipe: Any
) -> None:
    proposal = ProposalFactory.create(recipe=recipe)
    event = event_record(proposal=proposal, actor=root, verb=Verb.SUBMITTED, door="web")
    change = reverse("admin:proposals_event_change", args=[event.pk])
    client.post(change, {"verb": "approved", "door": "web"})
    assert Event.objects.get(pk=event.pk).verb == "submitted"
    delete = reverse("admin:proposals_event_delete", args=[event.pk])
    assert client.post(delete, {"post": "yes"}).status_code == 403
    assert Event.objects.filter(pk=event.pk).exists()
