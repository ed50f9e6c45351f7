"""The permissions of runs, declared once (django-rules) and used by every door.

A maintainer (``marin_site.roles.is_maintainer``) registers recipes and cancels, reruns and
retries runs; whoever answers for a plan (``answers_for_the_plan``) may also cancel and claim
its runs; reading runs and metrics is public. The run services ask for these themselves
(``marin_site.roles.permission_require``), whichever door calls them.
"""

from __future__ import annotations

from typing import Any

import rules

from marin_site.roles import is_maintainer
from runs.models import TERMINAL_RUN_STATES, Plan
from runs.signals import plan_owners

CANCEL_RUN = "runs.cancel_run"
RERUN_RUN = "runs.rerun_run"
RETRY_RUN = "runs.retry_run"
IMPORT_METRICS = "runs.import_metrics_run"
MANAGE_RECIPES = "runs.manage_recipe"
MANAGE_ALERT_RULES = "runs.manage_alert_rules"  # runs/alerts/


rules.add_perm(RERUN_RUN, is_maintainer)
rules.add_perm(RETRY_RUN, is_maintainer)
rules.add_perm(IMPORT_METRICS, is_maintainer)
rules.add_perm(MANAGE_RECIPES, is_maintainer)
rules.add_perm(MANAGE_ALERT_RULES, is_maintainer)

# The admin asks Django's permission names (marin_site/admin.py): maintainers open it for the
# recipes they manage (added and edited with the recipe services' validation, recorded in the
# recipe's history) and read the plans, runs and timelines there. Nothing is deleted from the
# admin but by a superuser.
rules.add_perm("runs", is_maintainer)
rules.add_perm("runs.add_recipe", is_maintainer)
rules.add_perm("runs.change_recipe", is_maintainer)
for _action in ("add", "change", "delete"):  # alert rules: maintainers edit them in the admin
    rules.add_perm(f"runs.{_action}_alertrule", is_maintainer)
for _model in (
    "recipe",
    "recipeevent",
    "plan",
    "planentry",
    "planlaunch",
    "run",
    "runevent",
    "metricsummary",
    "metricseries",
    "alertrule",
    "alert",
):
    rules.add_perm(f"runs.view_{_model}", is_maintainer)

# Pools (runs/pools/): maintainers create and retire pools; a pool's owner (or a maintainer)
# makes and revokes its registration tokens and revokes its agents.
CREATE_POOL = "runs.create_pool"
MANAGE_POOL = "runs.manage_pool"


@rules.predicate
def is_pool_owner(user: Any, pool: Any) -> bool:
    if pool is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return False
    return bool(pool.owner_id == user.pk)


rules.add_perm(CREATE_POOL, is_maintainer)
rules.add_perm(MANAGE_POOL, is_maintainer | is_pool_owner)

# External runs (runs/services/claims.py): a maintainer, or whoever answers for the run's plan (the
# author of its approved proposal, as ``runs.signals.plan_owners`` tells), claims a queued
# run to execute by hand.
CLAIM_RUN = "runs.claim_run"


@rules.predicate
def answers_for_the_plan(user: Any, run: Any) -> bool:
    if run is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return False
    for _receiver, owners in plan_owners.send_robust(sender=Plan, plan_id=run.plan_id):
        if isinstance(owners, list | tuple | set | frozenset) and user.pk in owners:
            return True
    return False


rules.add_perm(CLAIM_RUN, is_maintainer | answers_for_the_plan)

# Who may cancel a run: a maintainer, or whoever answers for its plan (the author of the
# approved proposal, who may also withdraw or cancel the whole of it). A plan already
# cancelled widens nothing: ``plan_cancel`` stops its runs itself (set-based, asked once, of
# whoever cancelled the plan), and a run left running after it is stopped by the reconciler.
rules.add_perm(CANCEL_RUN, is_maintainer | answers_for_the_plan)


RUN_ACTIONS = ("cancel", "rerun", "retry")
RETRYABLE_STATES = frozenset({"failed", "crashed", "killed"})


def run_allowed_actions(*, run: Any, user: Any, latest: bool, plan_live: bool) -> list[str]:
    """The run actions ``user`` may take on ``run`` now, as the run services decide them
    (``runs.services.runs.run_cancel``, ``run_rerun``, ``run_retry``): the permission, then
    the state. ``latest``: no newer run of the same plan entry exists (a rerun replaced it);
    ``plan_live``: the plan was launched and not cancelled (nothing starts a stopped plan's
    runs, so none is run again)."""
    if user is None or not user.is_authenticated:
        return []
    allowed = []
    if run.state not in TERMINAL_RUN_STATES and user.has_perm(CANCEL_RUN, run):
        allowed.append("cancel")
    again = latest and plan_live
    if again and run.state in TERMINAL_RUN_STATES and user.has_perm(RERUN_RUN, run):
        allowed.append("rerun")
    if again and run.state in RETRYABLE_STATES and user.has_perm(RETRY_RUN, run):
        allowed.append("retry")
    return allowed
