"""The proposal page's poll: its run table and the panels that follow its runs, in one
answer, so the page never says something the table beside it contradicts.

While a launched plan's runs can change (``RunTable.live``: a run not ended, or the results
still being summarised), the page's script (static/js/results.js) asks here every few
seconds, as it asked for the run table alone before: the panels add no request. Each panel
(the outcome and its form, the results, the open alerts, this reader's actions) comes as a
``<template data-live-panel>`` with a version (``proposals.templatetags.live``); the script
swaps in the ones whose version changed.
"""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache

from proposals import selectors
from proposals.actions import BUTTON_ACTIONS, allowed_actions
from proposals.forms import OutcomeForm
from proposals.models import Proposal
from runs import selectors as run_selectors
from runs.alerts import selectors as alert_selectors
from runs.results import run_table


def live_panels(*, proposal: Proposal, user: Any) -> dict[str, Any]:
    """What the live panels show of ``proposal`` to ``user``: the actions they may take,
    the outcome form and why it waits, the open alerts (the page's view reads the same)."""
    allowed = {action.name: action for action in allowed_actions(proposal, user)}
    record = "record_outcome" in allowed
    return {
        "actions": [
            (name, allowed[name].label, allowed[name]) for name in BUTTON_ACTIONS if name in allowed
        ],
        "can_edit": "edit" in allowed,
        "can_record_outcome": record,
        "results_pending": (
            run_selectors.plan_results_pending(plan_id=proposal.plan_id)
            if proposal.plan_id is not None and record
            else ""
        ),
        "outcome_form": OutcomeForm(
            initial={
                "outcome": proposal.outcome,
                "confidence": proposal.confidence if proposal.outcome else "",
                "conclusion": proposal.conclusion,
            }
        ),
        "open_alerts": list(alert_selectors.plan_open_alerts(plan_id=proposal.plan_id))
        if proposal.plan_id is not None
        else [],
    }


@never_cache
def proposal_live(request: HttpRequest, pk: int) -> HttpResponse:
    """The run table (sorted, grouped and with the columns the page asks for) and the
    panels; 404 for a proposal without a launched plan (nothing on its page moves)."""
    try:
        proposal = selectors.proposal_detail(pk=pk, prefetch=False)
    except Proposal.DoesNotExist as exc:
        raise Http404("No such proposal.") from exc
    if proposal.plan is None:
        raise Http404("This proposal has no plan: nothing on its page follows runs.")
    table = run_table.plan_run_table(
        plan=proposal.plan,
        sort=request.GET.get("sort", ""),
        group=request.GET.get("group", ""),
        columns=run_table.columns_parse(request.GET.getlist("columns")),
    )
    context = {
        "proposal": proposal,
        "table": table,
        "launch": table.launch,
        "live_templates": True,
        **live_panels(proposal=proposal, user=request.user),
    }
    return render(request, "proposals/_live.html", context)
