"""Every permission of the site, declared once (django-rules) and used by every door.

Roles are Django groups: ``reviewer`` and ``maintainer`` (a maintainer is also a reviewer).
Any signed-in, active user is a contributor. Views, API endpoints and slash commands ask
``user.has_perm(NAME, obj)`` with the names below; the services ask again before writing.
"""

from __future__ import annotations

from typing import Any

import rules

ROLE_CONTRIBUTOR = "contributor"
ROLE_REVIEWER = "reviewer"
ROLE_MAINTAINER = "maintainer"
ROLES = (ROLE_CONTRIBUTOR, ROLE_REVIEWER, ROLE_MAINTAINER)

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
RERUN = "proposals.rerun_proposal"
MANAGE_GITHUB_SYNC = "proposals.manage_github_sync"


def role_names(user: Any) -> frozenset[str]:
    """The user's role groups, read once per user object."""
    if not getattr(user, "is_authenticated", False) or not user.is_active:
        return frozenset()
    cached = getattr(user, "_marin_roles", None)
    if cached is None:
        cached = frozenset(user.groups.values_list("name", flat=True))
        if user.is_superuser:
            cached |= {ROLE_MAINTAINER}
        user._marin_roles = cached
    return cached


@rules.predicate
def is_contributor(user: Any) -> bool:
    return bool(getattr(user, "is_authenticated", False) and user.is_active)


@rules.predicate
def is_maintainer(user: Any) -> bool:
    return ROLE_MAINTAINER in role_names(user)


@rules.predicate
def is_reviewer(user: Any) -> bool:
    return bool(role_names(user) & {ROLE_REVIEWER, ROLE_MAINTAINER})


@rules.predicate
def is_author(user: Any, proposal: Any) -> bool:
    return bool(
        proposal is not None
        and getattr(user, "is_authenticated", False)
        and proposal.author_id == user.pk
    )


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
rules.add_perm(RERUN, is_maintainer)
rules.add_perm(MANAGE_GITHUB_SYNC, is_maintainer)

# The admin asks Django's permission names (marin_site/admin.py): maintainers open it for the
# GitHub sync they manage (the outbox, whose failed writes they retry, and the deliveries).
# "proposals.view_proposal", "add_proposal" and "change_proposal" are the site's own rules
# above; proposals/admin.py keeps the raw proposal form for superusers.
rules.add_perm("proposals", is_maintainer)
rules.add_perm("proposals.view_githuboutbox", is_maintainer)
rules.add_perm("proposals.view_webhookdelivery", is_maintainer)
