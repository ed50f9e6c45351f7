"""What runs/ announces, turned into GitHub writes: status updates and the result comment.

runs/ never imports proposals/; it sends signals after its transactions commit, and these
receivers queue outbox rows in a transaction of their own.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from proposals.github import outbox
from proposals.models import Proposal


def on_run_state_changed(sender: Any, *, plan_id: int, **kwargs: Any) -> None:
    with transaction.atomic():
        proposal = Proposal.objects.filter(plan_id=plan_id).first()
        if proposal is not None:
            outbox.outbox_proposal_changed(proposal=proposal)  # the status comment's progress


def on_plan_finished(sender: Any, *, plan_id: int, summary: dict[str, Any], **kwargs: Any) -> None:
    with transaction.atomic():
        proposal = Proposal.objects.filter(plan_id=plan_id).first()
        if proposal is None:
            return
        table = str((summary or {}).get("markdown") or "").strip()
        body = "**Results: every run of the plan has finished.**"
        if table:
            body += f"\n\n{table}"
        outbox.outbox_comment_enqueue(proposal=proposal, key=f"result:{plan_id}", body=body)
        outbox.outbox_proposal_changed(proposal=proposal)
