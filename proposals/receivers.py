"""What proposals/ does when something happens elsewhere: receivers, in one place.

Every receiver of the app is a ``@receiver``-decorated function in a ``receivers`` module
(this one, and ``github/receivers.py`` for the GitHub sync), connected when
``ProposalsConfig.ready()`` imports them.
"""

from __future__ import annotations

import hashlib
from typing import Any

from django.db import transaction
from django.db.models.signals import post_save
from django.dispatch import receiver

from marin_site.pagecache import PAGE_SIGNALS, generation_bump
from proposals.follows import notice_add
from proposals.github.issues import pending_issues_import
from proposals.models import Amendment, Comment, Event, Label, Proposal, Review
from proposals.services import proposal_plan_owners, proposal_plans_reconcile
from runs.alerts.models import Alert
from runs.models import Recipe
from runs.signals import alert_changed, plan_finished, plan_owners, plan_pages, reconcile_pass


@receiver(PAGE_SIGNALS, sender=Proposal, dispatch_uid="pagecache:proposals.Proposal")
@receiver(PAGE_SIGNALS, sender=Proposal.labels.through, dispatch_uid="pagecache:proposals.labels")
@receiver(PAGE_SIGNALS, sender=Review, dispatch_uid="pagecache:proposals.Review")
@receiver(PAGE_SIGNALS, sender=Comment, dispatch_uid="pagecache:proposals.Comment")
@receiver(PAGE_SIGNALS, sender=Amendment, dispatch_uid="pagecache:proposals.Amendment")
@receiver(PAGE_SIGNALS, sender=Event, dispatch_uid="pagecache:proposals.Event")
@receiver(PAGE_SIGNALS, sender=Label, dispatch_uid="pagecache:proposals.Label")
def on_page_row_changed(sender: Any, **kwargs: Any) -> None:
    """A row the public pages show was written: every cached page is stale."""
    generation_bump()


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
    sender: Any, *, alert_id: int, plan_id: int | None, opened: bool, **kwargs: Any
) -> None:
    """Followers hear of an alert on a run of the proposal's plan: when it opens and closes."""
    if plan_id is None:
        return
    with transaction.atomic():
        proposal = Proposal.objects.filter(plan_id=plan_id).first()
        alert = Alert.objects.filter(pk=alert_id).first()
        if proposal is None or alert is None:
            return
        way = "opened" if opened else "closed"
        text = alert.message if opened else alert.close_message
        notice_add(
            proposal=proposal,
            key=f"alert:{alert_id}:{way}",
            subject=f"alert {way} on run {alert.run_id} ({alert.kind})",
            body=f"Alert {way} on run {alert.run_id} ({alert.get_kind_display()}): {text}",
        )
