"""What proposals/ does when something happens elsewhere: receivers, in one place.

Every receiver of the app is a ``@receiver``-decorated function in a ``receivers`` module
(this one, and ``github/receivers.py`` for the GitHub sync), connected when
``ProposalsConfig.ready()`` imports them.
"""

from __future__ import annotations

import hashlib
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.db.models import Q
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete, pre_save
from django.dispatch import receiver

from marin_site.fragments import versions_bump
from marin_site.pagecache import PAGE_SIGNALS, generation_bump
from marin_site.roles import roles_changed
from proposals.follows import notice_add
from proposals.github.issues import pending_issues_import
from proposals.models import Amendment, Comment, Event, Follow, Label, Proposal, Review
from proposals.selectors import LIST_VERSION
from proposals.services import proposal_plan_owners, proposal_plans_reconcile
from runs.alerts.models import Alert
from runs.campaigns.models import Campaign, Intervention
from runs.models import Recipe, RunEvent
from runs.signals import (
    alert_changed,
    intervention_recorded,
    plan_finished,
    plan_owners,
    plan_pages,
    reconcile_pass,
)

FRAGMENT_ROW_SIGNALS = (post_save, post_delete)


@receiver(PAGE_SIGNALS, sender=Proposal, dispatch_uid="pagecache:proposals.Proposal")
@receiver(PAGE_SIGNALS, sender=Proposal.labels.through, dispatch_uid="pagecache:proposals.labels")
@receiver(PAGE_SIGNALS, sender=Review, dispatch_uid="pagecache:proposals.Review")
@receiver(PAGE_SIGNALS, sender=Comment, dispatch_uid="pagecache:proposals.Comment")
@receiver(PAGE_SIGNALS, sender=Amendment, dispatch_uid="pagecache:proposals.Amendment")
@receiver(PAGE_SIGNALS, sender=Event, dispatch_uid="pagecache:proposals.Event")
@receiver(PAGE_SIGNALS, sender=Label, dispatch_uid="pagecache:proposals.Label")
def on_page_row_changed(sender: Any, **kwargs: Any) -> None:
    """A row the public pages show was written: every cached page is stale, and so is every
    page of the list (which proposals a filter or a search finds, and how many)."""
    generation_bump()
    versions_bump(LIST_VERSION[0], [LIST_VERSION[1]])


@receiver(reconcile_pass, dispatch_uid="proposals.plans_reconcile")
def on_reconcile_pass(sender: Any, **kwargs: Any) -> dict[str, int]:
    """Each pass of the run reconciler also makes good the plan hand-offs that never happened."""
    return proposal_plans_reconcile()


@receiver(plan_owners, dispatch_uid="proposals.plan_owners")
def on_plan_owners(sender: Any, *, plan_id: int, **kwargs: Any) -> list[int]:
    """Who answers for a plan: the author of the approved proposal it came from."""
    return proposal_plan_owners(plan_id=plan_id)


@receiver(plan_pages, dispatch_uid="proposals.plan_pages")
def on_plan_pages(sender: Any, *, plan_id: int, **kwargs: Any) -> tuple[str, str] | None:
    """The page that shows a plan: the proposal it was approved from."""
    proposal = Proposal.objects.filter(plan_id=plan_id).only("pk", "title").first()
    if proposal is None:
        return None
    return f"#{proposal.pk} {proposal.title}", proposal.get_absolute_url()


@receiver(post_save, sender=Recipe, dispatch_uid="proposals.recipe_saved")
def on_recipe_saved(sender: Any, instance: Recipe, **kwargs: Any) -> None:
    """A recipe created, loaded or edited: the issues kept for want of one may import now."""
    if instance.is_active:
        transaction.on_commit(pending_issues_import, robust=True)


@receiver(reconcile_pass, dispatch_uid="proposals.pending_issues_import")
def on_reconcile_pass_pending_issues(sender: Any, **kwargs: Any) -> dict[str, int]:
    """Each pass of the reconciler also imports kept issues whose recipe now exists."""
    return pending_issues_import()


@receiver(plan_finished, dispatch_uid="proposals.follows.plan_finished")
def on_plan_finished_notify(
    sender: Any, *, plan_id: int, summary: dict[str, Any], **kwargs: Any
) -> None:
    """Followers hear that the results are in, once per distinct result."""
    with transaction.atomic():
        proposal = Proposal.objects.filter(plan_id=plan_id).first()
        if proposal is None:
            return
        table = str((summary or {}).get("markdown") or "").strip()
        digest = hashlib.sha256(table.encode()).hexdigest()[:16]
        notice_add(
            proposal=proposal,
            key=f"results:{plan_id}:{digest}",
            subject="results are in",
            body=f"Every run of the plan has finished.\n\n{table}".strip(),
        )


@receiver(alert_changed, dispatch_uid="proposals.follows.alert_changed")
def on_alert_changed_notify(
    sender: Any, *, alert_id: int, run_id: int, plan_id: int | None, opened: bool, **kwargs: Any
) -> None:
    """An alert on a run opened or closed: the followers of the proposal whose plan it ran
    and of every campaign it is part of hear of it, once each."""
    with transaction.atomic():
        alert = Alert.objects.filter(pk=alert_id).first()
        if alert is None:
            return
        way = "opened" if opened else "closed"
        text = alert.message if opened else alert.close_message
        subject = f"alert {way} on run {alert.run_id} ({alert.kind})"
        body = f"Alert {way} on run {alert.run_id} ({alert.get_kind_display()}): {text}"
        proposal = Proposal.objects.filter(plan_id=plan_id).first() if plan_id else None
        if proposal is not None:
            notice_add(proposal=proposal, key=f"alert:{alert_id}:{way}", subject=subject, body=body)
        for campaign in Campaign.objects.filter(members__run_id=run_id).distinct():
            notice_add(
                campaign=campaign,
                key=f"alert:{alert_id}:{way}:campaign:{campaign.pk}",
                subject=subject,
                body=body,
            )


@receiver(intervention_recorded, dispatch_uid="proposals.follows.intervention_recorded")
def on_intervention_recorded_notify(sender: Any, *, intervention_id: int, **kwargs: Any) -> None:
    """A campaign's followers hear of each intervention recorded on it."""
    with transaction.atomic():
        found = Intervention.objects.filter(pk=intervention_id).select_related("campaign").first()
        if found is None:
            return
        change = (
            f" ({found.from_value or '–'} → {found.to_value or '–'})"
            if found.from_value or found.to_value
            else ""
        )
        notice_add(
            campaign=found.campaign,
            key=f"intervention:{found.pk}",
            subject=f"intervention at step {found.step}: {found.title}",
            body=f"{found.title}{change}, at step {found.step} ({found.get_kind_display()}).\n\n"
            f"{found.note}".strip(),
        )


# ------------------------------------------------ fragment versions (marin_site/fragments.py)
# A proposal's fragments (its card, API row, page sections) carry its version: each write
# below replaces the versions of the proposals whose fragments show what it changed.


@receiver(FRAGMENT_ROW_SIGNALS, sender=Proposal, dispatch_uid="fragments:proposals.Proposal")
def on_proposal_written(sender: Any, instance: Proposal, **kwargs: Any) -> None:
    versions_bump("proposal", [instance.pk])


@receiver(FRAGMENT_ROW_SIGNALS, sender=Follow, dispatch_uid="fragments:proposals.Follow")
def on_follow_written(sender: Any, instance: Follow, **kwargs: Any) -> None:
    """What a proposal page keeps for its reader says whether they follow it."""
    versions_bump("reader-follows", [instance.user_id])


@receiver(FRAGMENT_ROW_SIGNALS, sender=Review, dispatch_uid="fragments:proposals.Review")
@receiver(FRAGMENT_ROW_SIGNALS, sender=Comment, dispatch_uid="fragments:proposals.Comment")
@receiver(FRAGMENT_ROW_SIGNALS, sender=Amendment, dispatch_uid="fragments:proposals.Amendment")
@receiver(FRAGMENT_ROW_SIGNALS, sender=Event, dispatch_uid="fragments:proposals.Event")
def on_proposal_part_written(sender: Any, instance: Any, **kwargs: Any) -> None:
    versions_bump("proposal", [instance.proposal_id])


@receiver(m2m_changed, sender=Proposal.labels.through, dispatch_uid="fragments:proposals.labels")
def on_labels_changed(
    sender: Any, instance: Any, action: str, reverse: bool, pk_set: Any, **kwargs: Any
) -> None:
    if not reverse:  # proposal.labels.add/remove/set/clear
        if action.startswith("post_"):
            versions_bump("proposal", [instance.pk])
    elif action == "pre_clear":  # label.proposals.clear(): the proposals it had
        versions_bump("proposal", _proposals_with_label(instance.pk))
    elif action.startswith("post_") and pk_set:  # label.proposals.add/remove
        versions_bump("proposal", pk_set)


def _proposals_with_label(label_id: int) -> list[int]:
    through = Proposal.labels.through.objects
    return list(through.filter(label_id=label_id).values_list("proposal_id", flat=True))


@receiver(post_save, sender=Label, dispatch_uid="fragments:proposals.Label:save")
@receiver(pre_delete, sender=Label, dispatch_uid="fragments:proposals.Label:delete")
def on_label_written(sender: Any, instance: Label, **kwargs: Any) -> None:
    """A renamed or deleted label changes every card that shows it."""
    versions_bump("proposal", _proposals_with_label(instance.pk))


@receiver(post_save, sender=Recipe, dispatch_uid="fragments:runs.Recipe")
def on_recipe_written(sender: Any, instance: Recipe, **kwargs: Any) -> None:
    """A proposal shows its recipe's name and a plan preview computed from the recipe; the
    list filters by its name."""
    proposals = Proposal.objects.filter(recipe_id=instance.pk).values_list("pk", flat=True)
    versions_bump("proposal", list(proposals))
    versions_bump(LIST_VERSION[0], [LIST_VERSION[1]])


@receiver(pre_save, sender=get_user_model(), dispatch_uid="fragments:user-renamed")
def on_user_renamed(sender: Any, instance: Any, update_fields: Any = None, **kwargs: Any) -> None:
    """A username is shown on the proposals the user wrote, reviewed, commented and acted
    on; a rename (rare) makes them all fresh."""
    field = sender.USERNAME_FIELD
    if instance.pk is None or (update_fields is not None and field not in update_fields):
        return  # a new user, or a save of other fields (the last login)
    before = sender.objects.filter(pk=instance.pk).values_list(field, flat=True).first()
    if before is None or before == getattr(instance, field):
        return
    touched = Proposal.objects.filter(
        Q(author=instance.pk)
        | Q(reviews__reviewer=instance.pk)
        | Q(comments__author=instance.pk)
        | Q(events__actor=instance.pk)
        | Q(amendments__author=instance.pk)
    ).values_list("pk", flat=True)
    plans = RunEvent.objects.filter(actor=instance.pk).values_list("run__plan_id", flat=True)
    of_runs = Proposal.objects.filter(plan_id__in=plans).values_list("pk", flat=True)
    versions_bump("proposal", {*touched, *of_runs})
    versions_bump(LIST_VERSION[0], [LIST_VERSION[1]])  # the list filters by author


# A user's roles are kept in the shared cache (marin_site/roles.py): every change of who is in
# which group, from either side, and a group renamed or deleted, makes the users' roles stale.


@receiver(m2m_changed, sender=get_user_model().groups.through, dispatch_uid="roles:memberships")
def on_memberships_changed(
    sender: Any, instance: Any, action: str, reverse: bool, pk_set: Any, **kwargs: Any
) -> None:
    if not reverse:  # user.groups.add/remove/set/clear
        if action.startswith("post_"):
            roles_changed([instance.pk])
    elif action == "pre_clear":  # group.user_set.clear(): the users it had
        roles_changed(_group_members(instance.pk))
    elif action.startswith("post_") and pk_set:  # group.user_set.add/remove
        roles_changed(pk_set)


def _group_members(group_id: int) -> list[int]:
    through = get_user_model().groups.through.objects
    return list(through.filter(group_id=group_id).values_list("user_id", flat=True))


@receiver(post_save, sender=Group, dispatch_uid="roles:group-saved")
@receiver(pre_delete, sender=Group, dispatch_uid="roles:group-deleted")
def on_group_written(sender: Any, instance: Group, **kwargs: Any) -> None:
    """A renamed or deleted group changes the roles of everyone in it."""
    roles_changed(_group_members(instance.pk))
