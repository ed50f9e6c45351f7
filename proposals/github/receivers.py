"""What runs/ announces, turned into GitHub writes: status updates and the result comment.

runs/ never imports proposals/; it sends signals after its transactions commit, and these
receivers queue outbox rows in a transaction of their own. Connected when
``ProposalsConfig.ready()`` imports this module.
"""

from __future__ import annotations

import hashlib
from typing import Any

from django.conf import settings
from django.db import transaction
from django.dispatch import receiver

from proposals.github import client as gh
from proposals.github.outbox.enqueue import outbox_comment_enqueue, outbox_proposal_changed
from proposals.github.outbox.render import render_result
from proposals.models import Proposal
from runs.alerts.models import Alert
from runs.signals import alert_changed, plan_finished, run_state_changed


@receiver(run_state_changed, dispatch_uid="proposals.github.run_state_changed")
def on_run_state_changed(sender: Any, *, plan_id: int, **kwargs: Any) -> None:
    if not gh.sync_enabled():
        return  # nothing to say on GitHub: no query per run (a batch of leases moves hundreds)
    with transaction.atomic():
        proposal = Proposal.objects.filter(plan_id=plan_id).first()
        if proposal is not None:
            outbox_proposal_changed(proposal=proposal)  # the status comment's progress


@receiver(plan_finished, dispatch_uid="proposals.github.plan_finished")
def on_plan_finished(sender: Any, *, plan_id: int, summary: dict[str, Any], **kwargs: Any) -> None:
    """The result comment (``render_result``): how the runs ended, their overrides, the
    accelerator-hours used, the table of final metrics, the verdict it suggests and a link.

    One comment per distinct result: the same summary announced twice is one comment, and
    a plan that finishes again after a rerun (new run ids in the table) gets a new one.
    """
    with transaction.atomic():
        proposal = Proposal.objects.filter(plan_id=plan_id).first()
        if proposal is None:
            return
        body = render_result(proposal=proposal, plan_id=plan_id, summary=summary)
        digest = hashlib.sha256(body.encode()).hexdigest()[:16]
        outbox_comment_enqueue(proposal=proposal, key=f"result:{plan_id}:{digest}", body=body)
        outbox_proposal_changed(proposal=proposal)


def alert_text(alert: Alert, *, opened: bool) -> str:
    """An alert in a sentence of markdown, with a link to its run."""
    link = f"{settings.SITE_URL}{alert.get_absolute_url()}"
    if opened:
        return f"**Alert on [run {alert.run_id}]({link})** ({alert.get_kind_display()}): {alert.message}"
    return f"**Alert closed on [run {alert.run_id}]({link})** ({alert.kind}): {alert.close_message}"


@receiver(alert_changed, dispatch_uid="proposals.github.alert_changed")
def on_alert_changed(
    sender: Any, *, alert_id: int, plan_id: int | None, opened: bool, **kwargs: Any
) -> None:
    """An alert on a run of the proposal's plan opened or closed: one comment on the issue
    each way (the idempotency key names the alert and the way)."""
    if plan_id is None:
        return
    with transaction.atomic():
        proposal = Proposal.objects.filter(plan_id=plan_id).first()
        alert = Alert.objects.filter(pk=alert_id).first()
        if proposal is None or alert is None:
            return
        way = "opened" if opened else "closed"
        outbox_comment_enqueue(
            proposal=proposal, key=f"alert:{alert_id}:{way}", body=alert_text(alert, opened=opened)
        )
