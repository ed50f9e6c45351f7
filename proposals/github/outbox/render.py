"""What the site writes on GitHub: the proposal's block in the issue body, the status
comment, the labels, and the markers that let the site find and recognise its own text."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.urls import reverse

from proposals.github.body import MARKER_PREFIX
from proposals.models import Proposal, Review
from proposals.selectors import proposal_status_text
from runs.models import Run, RunState
from runs.services.plans import plan_build

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
    lines += render_plan_lines(proposal)
    return "\n".join(lines)


def render_plan_lines(proposal: Proposal) -> list[str]:
    """The plan in brief (the frozen one after approval, else what approval would launch)
    and the ablation spec it comes from, for the managed block."""
    plan = proposal.plan
    if plan is not None:
        runs, hours, spec = plan.run_count, plan.total_accelerator_hours, plan.spec_text
        budget = plan.budget_accelerator_hours
        what = "Plan (frozen at approval)"
    else:
        spec, budget, what = proposal.ablation_spec, proposal.budget_accelerator_hours, "Plan"
        try:
            preview = plan_build(
                recipe=proposal.recipe,
                baseline=proposal.baseline or {},
                spec_text=spec,
                budget_accelerator_hours=budget,
            )
        except ValidationError:
            return ["", "### Plan", "", "The ablation spec does not make a plan yet."]
        runs, hours = preview.run_count, preview.total_accelerator_hours
    summary = f"{what}: {runs} runs of `{proposal.recipe.name}`, {hours:.2f} accelerator-hours"
    if budget is not None:
        summary += f" of a {budget:g} h budget"
    lines = ["", "### Plan", "", summary + "."]
    if spec.strip():
        lines += ["", "```yaml", spec.strip().replace("```", "` ` `"), "```"]
    return lines


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
    """The labels the issue should carry: the state's, the hold's, and the site's labels."""
    labels = {f"{STATE_LABEL_PREFIX}{proposal.state.replace('_', '-')}"}
    if proposal.on_hold:
        labels.add(HOLD_LABEL)
    return labels | site_labels(proposal)


def site_labels(proposal: Proposal) -> set[str]:
    return set(proposal.labels.values_list("name", flat=True))


def render_review(review: Review) -> str:
    """A review on the site, as a comment on the issue."""
    link = f"{settings.SITE_URL}{review.proposal.get_absolute_url()}"
    who = review.reviewer.get_username()
    return (
        f"**Review by {who}** · score {review.score}/5 · recommends "
        f"{review.get_recommendation_display().lower()}\n\n{review.text.strip()}"
        f"\n\n---\n*{who} reviewed on [marin-site]({link}).*"
    )


RESULT_STATES = (RunState.FINISHED, RunState.FAILED, RunState.CRASHED, RunState.KILLED)


def _config_value(config: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(config, dict) or part not in config:
            return None
        config = config[part]
    return config


def _value(value: Any) -> str:
    return "–" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def render_result(*, proposal: Proposal, plan_id: int, summary: dict[str, Any]) -> str:
    """The result comment: how the runs ended (the latest attempt of each planned run), the
    overrides of each variant against the baseline, the accelerator-hours actually used, the
    table and verdict ``runs`` wrote, the loss chart and a link."""
    runs = list(Run.objects.filter(plan_id=plan_id).select_related("entry").order_by("pk"))
    latest: dict[int, Run] = {}
    for run in runs:
        latest[run.entry_id] = run  # ordered by pk: the last attempt of each entry wins
    counts = dict.fromkeys(RunState.values, 0)
    for run in latest.values():
        counts[run.state] += 1
    ended = [f"{counts[state]} {state}" for state in RESULT_STATES if counts[state]]
    others = len(latest) - sum(counts[state] for state in RESULT_STATES)
    if others:
        ended.append(f"{others} not ended")
    head = f"**Results: {', '.join(ended) or 'no runs'} of {len(latest)}.**"
    lines = [head]
    baselines = {
        (run.entry.scale, run.entry.seed): run.entry.config
        for run in latest.values()
        if run.entry.is_baseline
    }
    variants: dict[str, list[str]] = {}
    for run in sorted(latest.values(), key=lambda r: r.entry.index):
        if run.entry.is_baseline:
            continue
        base = baselines.get((run.entry.scale, run.entry.seed)) or {}
        changes = run.entry.diff or {}
        parts = []
        for key in sorted(changes):
            change = changes[key]
            if isinstance(change, dict) and "value" in change:
                was, now = change.get("baseline"), change["value"]
            else:
                was, now = _config_value(base, key), change
            parts.append(f"`{key}: {_value(was)} → {_value(now)}`")
        if parts:
            variants.setdefault(", ".join(parts), []).append(f"{run.pk} ({run.state})")
    if variants:
        lines += ["", "Overrides against the baseline:", ""]
        lines += [f"- {change}: run {', '.join(ids)}" for change, ids in variants.items()]
    used = 0.0
    for run in runs:  # every attempt counts: a failed one used its hours too
        if run.cached_from_id is None and run.started_at and run.finished_at:
            elapsed = (run.finished_at - run.started_at) / timedelta(hours=1)
            resources = run.resources if isinstance(run.resources, dict) else {}
            count = resources.get("accelerators") or resources.get("accelerator_count") or 1
            used += max(0.0, elapsed) * (count if isinstance(count, int | float) else 1)
    planned = sum(run.entry.accelerator_hours for run in latest.values())
    lines += ["", f"Accelerator-hours used: {used:.3g} (planned {planned:.3g})."]
    table = str((summary or {}).get("markdown") or "").strip()
    if table:
        lines += ["", table]
    link = f"{settings.SITE_URL}{proposal.get_absolute_url()}"
    chart = settings.SITE_URL + reverse("plan-loss-png", kwargs={"plan_id": plan_id})
    lines += ["", f"![Loss curves of the plan]({chart})", "", f"Curves, logs and every run: {link}"]
    return "\n".join(lines)
