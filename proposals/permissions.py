"""Every permission of proposals, declared once (django-rules) and used by every door.

The roles and their checks (contributor, reviewer, maintainer) are the site's, in
``marin_site/roles.py``. Which action an actor may take on a proposal in its current state
is ``proposals.actions.allowed_actions``, built on these names; the services ask again
before writing.
"""

from __future__ import annotations

from typing import Any

import rules

from marin_site.roles import is_contributor, is_maintainer, is_reviewer

VIEW = "proposals.view_proposal"
ADD = "proposals.add_proposal"
CHANGE = "proposals.change_proposal"
SUBMIT = "proposals.submit_proposal"
WITHDRAW = "proposals.withdraw_proposal"
REVIEW = "proposals.review_proposal"
REQUEST_CHANGES = "proposals.request_changes_proposal"
APPROVE = "proposals.approve_proposal"
REJECT = "proposals.reject_proposal"
CANCEL = "proposals.cancel_proposal"
RECORD_OUTCOME = "proposals.record_outcome_proposal"
COMMENT = "proposals.comment_proposal"
VIEW_REVIEW_QUEUE = "proposals.view_review_queue"
HOLD = "proposals.hold_proposal"
MANAGE_GITHUB_SYNC = "proposals.manage_github_sync"
ADOPT = "proposals.adopt_proposal"
DRY_RUN = "proposals.dry_run_proposal"


@rules.predicate
def is_author(user: Any, proposal: Any) -> bool:
    return bool(
        proposal is not None
        and getattr(user, "is_authenticated", False)
        and proposal.author_id == user.pk
    )


@rules.predicate
def runs_on_a_pool_open_to_author_dry_runs(user: Any, proposal: Any) -> bool:
    """Its recipe runs on a pool that lets authors start dry runs (``Pool.author_dry_runs``)."""
    if proposal is None:
        return False
    from proposals.models import Proposal
    from runs.selectors import recipe_author_dry_runs_allowed

    recipe_id = proposal.recipe_id
    if recipe_id is None and proposal.pk is not None:  # a list's stand-in of the row
        recipe_id = (
            Proposal.objects.filter(pk=proposal.pk).values_list("recipe_id", flat=True).first()
        )
    return recipe_author_dry_runs_allowed(recipe_id=recipe_id)


rules.add_perm(VIEW, rules.always_allow)
rules.add_perm(ADD, is_contributor)
rules.add_perm(CHANGE, is_contributor & (is_author | is_maintainer))
rules.add_perm(SUBMIT, is_contributor & is_author)
rules.add_perm(WITHDRAW, is_contributor & is_author)
rules.add_perm(REVIEW, is_reviewer & ~is_author)
rules.add_perm(REQUEST_CHANGES, is_reviewer & ~is_author)
rules.add_perm(APPROVE, is_maintainer)
rules.add_perm(REJECT, is_maintainer)
rules.add_perm(CANCEL, is_maintainer)
rules.add_perm(RECORD_OUTCOME, is_maintainer)
rules.add_perm(COMMENT, is_contributor)
rules.add_perm(VIEW_REVIEW_QUEUE, is_reviewer)
rules.add_perm(HOLD, is_maintainer)
rules.add_perm(MANAGE_GITHUB_SYNC, is_maintainer)
rules.add_perm(ADOPT, is_maintainer)
# A dry run before approval: a maintainer's, or the author's on a pool that allows it.
rules.add_perm(
    DRY_RUN, is_maintainer | (is_contributor & is_author & runs_on_a_pool_open_to_author_dry_runs)
)

# The admin asks Django's permission names (marin_site/admin.py): maintainers open it for the
# GitHub sync they manage (the outbox, whose failed writes they retry, and the deliveries).
# "proposals.view_proposal", "add_proposal" and "change_proposal" are the site's own rules
# above; proposals/admin.py keeps the raw proposal form for superusers.
rules.add_perm("proposals", is_maintainer)
rules.add_perm("proposals.view_githuboutbox", is_maintainer)
rules.add_perm("proposals.view_webhookdelivery", is_maintainer)
