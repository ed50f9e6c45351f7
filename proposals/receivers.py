"""What proposals/ does when something happens elsewhere: receivers, in one place.

Every receiver of the app is a ``@receiver``-decorated function in a ``receivers`` module
(this one, and ``github/receivers.py`` for the GitHub sync), connected when
``ProposalsConfig.ready()`` imports them. What a write makes stale in the caches is not here:
it is the app's table in ``invalidation.py``.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.utils.text import slugify

from proposals.follows import notice_add
from proposals.github.issues import pending_issues_import
from proposals.github.outbox.enqueue import outbox_proposal_changed
from proposals.models import Proposal
from proposals.services import proposal_plan_owners, proposal_plans_reconcile
from runs.alerts.models import Alert
from runs.campaigns.models import Campaign, Intervention
from runs.models import Recipe
from runs.signals import (
    alert_changed,
    dry_run_finished,
    intervention_recorded,
    plan_finished,
    plan_named,
    plan_owners,
    plan_pages,
    reconcile_pass,
)

FRAGMENT_ROW_SIGNALS = (post_save, post_delete)


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


@receiver(plan_named, dispatch_uid="proposals.plan_named")
def on_plan_named(sender: Any, *, name: str, **kwargs: Any) -> int | None:
    """The plan a person means by a proposal's number (``#14``, ``14``) or its slug (its
    title, slugified, as in ``mixture-of-experts-routing``): a proposal that has a plan."""
    name = name.strip()
    number = name.removeprefix("#")
    with_plan = Proposal.objects.filter(plan__isnull=False)
    if number.isdecimal() and len(number) <= 18:
        return with_plan.filter(pk=int(number)).values_list("plan_id", flat=True).first()
    if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name) or len(name) > 200:
        return None
    first_word = name.split("-", 1)[0]
    for plan_id, title in with_plan.filter(title__icontains=first_word).values_list(
        "plan_id", "title"
    ):
        if slugify(title) == name:
            return int(plan_id)
    return None


@receiver(post_save, sender=Recipe, dispatch_uid="proposals.recipe_saved")
def on_recipe_saved(sender: Any, instance: Recipe, **kwargs: Any) -> None:
    """A recipe created, loaded or edited: the issues kept for want of one may import now."""
    if instance.is_active:
        transaction.on_commit(pending_issues_import, robust=True)


@receiver(reconcile_pass, dispatch_uid="proposals.pending_issues_import")
def on_reconcile_pass_pending_issues(sender: Any, **kwargs: Any) -> dict[str, int]:
    """Each pass of the reconciler also imports kept issues whose recipe now exists."""
    return pending_issues_import()


@receiver(dry_run_finished, dispatch_uid="proposals.github.dry_run_finished")
def on_dry_run_finished(sender: Any, *, subject: str, **kwargs: Any) -> None:
    """A proposal's dry run ended: its issue's status comment says how it went."""
    prefix, _, number = subject.partition("-")
    if prefix != "proposal" or not number.isdigit():
        return
    proposal = Proposal.objects.filter(pk=int(number)).first()
    if proposal is not None:
        with transaction.atomic():
            outbox_proposal_changed(proposal=proposal)


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
