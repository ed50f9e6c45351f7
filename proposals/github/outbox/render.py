"""What the site writes on GitHub: the proposal's block in the issue body, the status
comment, the labels, and the markers that let the site find and recognise its own text."""

from __future__ import annotations

from django.conf import settings

from proposals.github.body import MARKER_PREFIX
from proposals.models import Proposal
from proposals.selectors import proposal_status_text

STATUS_MARKER = "<!-- marin-site:status -->"
HOLD_LABEL = "on-hold"
STATE_LABEL_PREFIX = "status:"


def proposal_marker(proposal_id: int) -> str:
    return f"<!-- marin-site:proposal:{proposal_id} -->"


def outbox_marker(key: str) -> str:
    return f"<!-- marin-site:outbox:{key} -->"


def is_own_text(body: str | None) -> bool:
    """Text the site wrote carries one of its markers; it never comes back as input."""
    return MARKER_PREFIX in (body or "")


def render_block(proposal: Proposal) -> str:
    link = f"{settings.SITE_URL}{proposal.get_absolute_url()}"
    lines = [
        proposal_marker(proposal.pk),
        f"**[Proposal #{proposal.pk} on marin-site]({link})** · {proposal_status_text(proposal)}",
    ]
    if not proposal.github_sections:  # written on the site: the issue shows its sections
        lines += ["", "### Summary", "", proposal.summary]
        if proposal.description:
            lines += ["", "### Description", "", proposal.description]
        if proposal.hypothesis:
            lines += ["", "### Hypothesis", "", proposal.hypothesis]
        if proposal.success_metric:
            threshold = proposal.success_threshold
            lines += [
                "",
                "### Success criteria",
                "",
                f"`{proposal.success_metric}`, {proposal.get_success_direction_display().lower()}"
                + (f", by at least {threshold:g}" if threshold is not None else "")
                + " against the baseline.",
            ]
    return "\n".join(lines)


def render_status(proposal: Proposal) -> str:
    link = f"{settings.SITE_URL}{proposal.get_absolute_url()}"
    lines = [STATUS_MARKER, f"**Status** · {proposal_status_text(proposal)}"]
    if proposal.on_hold:
        lines.append("Approval waits for `/unhold`.")
    if proposal.state_reason:
        lines.append(f"> {proposal.state_reason.splitlines()[0][:500]}")
    plan = proposal.plan
    if plan is not None:
        lines.append(
            f"Plan: {plan.run_count} runs, {plan.total_accelerator_hours:.1f} accelerator-hours"
            + (
                f" of a {plan.budget_accelerator_hours:g} h budget"
                if plan.budget_accelerator_hours is not None
                else ""
            )
        )
    lines.append(f"[Open on marin-site]({link}) · this comment is edited as things change.")
    return "\n\n".join(lines)


def wanted_labels(proposal: Proposal) -> set[str]:
    labels = {f"{STATE_LABEL_PREFIX}{proposal.state.replace('_', '-')}"}
    if proposal.on_hold:
        labels.add(HOLD_LABEL)
    return labels
