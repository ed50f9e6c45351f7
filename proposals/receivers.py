"""What proposals/ does when something happens elsewhere: receivers, in one place.

Every receiver of the app is a ``@receiver``-decorated function in a ``receivers`` module
(this one, and ``github/receivers.py`` for the GitHub sync), connected when
``ProposalsConfig.ready()`` imports them.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models.signals import post_save
from django.dispatch import receiver

from marin_site.pagecache import PAGE_SIGNALS, generation_bump
from proposals.github.issues import pending_issues_import
from proposals.models import Amendment, Comment, Event, Label, Proposal, Review
from proposals.services import proposal_plan_owners, proposal_plans_reconcile
from runs.models import Recipe
from runs.signals import plan_owners, plan_pages, reconcile_pass


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
