"""A proposal's page, assembled for one reader: which of its parts come from the fragment
cache and under which versions, what is loaded for the parts rendered afresh, and the context
that renders them. The view (``proposals.views.proposal_detail``) renders it and saves the
fragments; the site header's naming is here too, as every page of the app keeps one.

The order matters (marin_site/fragments.py explains it): the versions are read first, then
the rows. What makes a version stale is the app's table, ``proposals/invalidation.py``.
"""

from __future__ import annotations

import functools
from typing import Any

import rules
from django.core.exceptions import ValidationError
from django.db.models import prefetch_related_objects
from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject, cached_property

from marin_site.fragments import Fragments
from marin_site.roles import role_names, roles_kept
from proposals import follows, selectors, services
from proposals import permissions as perms
from proposals.actions import ACTIONS, BUTTON_ACTIONS, allowed_actions
from proposals.forms import CommentForm, OutcomeForm, ReviewForm
from proposals.github.client import sync_facts
from proposals.models import Proposal
from runs import selectors as run_selectors
from runs.alerts import selectors as alert_selectors
from runs.services.dry_runs import dry_runs_dependency


def site_header(request: HttpRequest) -> str:
    """The name of this reader's page header (base.html's ``site_header``) on this view.

    It is kept with no version: ``site_header_refine`` keys it by all it shows (the
    reader's name and whether they see the review queue), and the view is in its name."""
    match = request.resolver_match
    return f"site-header:{request.user.pk or 0}:{match.view_name if match else ''}"


def site_header_refine(fragments: Fragments, name: str, request: HttpRequest) -> None:
    """Key the header by what it shows; the reader's roles from the page's own round trip
    (``fragments`` read ``roles_kept``)."""
    user = request.user
    role_names(user, fragments)
    # The site's rule (proposals/permissions.py) alone: asking ``user.has_perm`` would also
    # ask the model backend, two queries for a reader who is not a reviewer.
    queue = rules.has_perm(perms.VIEW_REVIEW_QUEUE, user)
    fragments.refine(name, user.get_username(), queue)


class _PlanContext:
    """The plan section's context, computed only when the section is rendered (not when it
    comes from the fragment cache): the preview computes the whole plan from the recipe."""

    def __init__(self, proposal: Proposal) -> None:
        self.proposal = proposal

    @cached_property
    def values(self) -> dict[str, Any]:
        proposal = self.proposal
        if proposal.plan is not None:
            return {
                "frozen_plan": proposal.plan,
                "plan_entries": proposal.plan.entries.order_by("index"),
            }
        try:
            return {"preview_plan": services.proposal_plan(proposal=proposal)}
        except ValidationError as exc:
            return {"plan_errors": exc.messages}

    def context(self) -> dict[str, Any]:
        # Each name stands for the computed value (or None), computed on first use.
        return {
            name: SimpleLazyObject(functools.partial(self.values_get, name))
            for name in ("frozen_plan", "plan_entries", "preview_plan", "plan_errors")
        }

    def values_get(self, name: str) -> Any:
        return self.values.get(name)


class ProposalPage:
    """One reader's page of proposal ``pk`` (``Proposal.DoesNotExist`` when there is none)."""

    def __init__(self, request: HttpRequest, pk: int) -> None:
        user = request.user
        self.user = user
        # The page's sections that are the same for every reader (detail.html wraps each in
        # {% fragment %}), and what each needs loaded when it is rendered.
        self.sections = sections = selectors.proposal_page_prefetches()
        # What this reader may do, and whether they follow it: theirs alone, as are the
        # parts of the page that show it (their follow box and links, their actions panel,
        # their review and comment forms), kept as HTML for a signed-in reader; an anonymous
        # one's page comes from the page cache, its sign-in links naming the page they are on.
        self.reader = reader = f"reader:{user.pk}"
        self.reader_html = {
            f"reader_{part}": f"{reader}:{part}" if user.pk is not None else ""
            for part in ("head", "actions", "review", "comment")
        }
        reader_deps = [("proposal", pk)]
        if user.pk is not None:
            reader_deps.append(("reader-follows", user.pk))
        self.header = header = site_header(request)
        # The forms' fields are the same for every reader too (an unbound form; the outcome's
        # filled in from the proposal), and so are the conclusion and the results (markdown
        # rendered and sanitized). A reader's own parts carry a mark for their CSRF token
        # ({% fragment NAME csrf %}), which each response replaces with its own.
        self.fragments = fragments = Fragments(
            {
                header: [],
                "site-footer": [],
                "review-fields-new": [],
                "comment-field": [],
                **{name: reader_deps for name in (reader, *self.reader_html.values()) if name},
                **{
                    name: [("proposal", pk)]
                    for name in (*sections, "timeline", "outcome-fields", "conclusion", "results")
                },
                "dry-runs": [
                    ("proposal", pk),
                    *filter(None, [dry_runs_dependency(f"proposal-{pk}")]),
                ],
            },
            scope=f"proposal-page:{pk}",
            shared=roles_kept(user),
        )
        self.proposal = proposal = selectors.proposal_detail(
            pk=pk, prefetch=False, related=False, page_fields=True
        )
        # Changes that reach the row without a signal (the GitHub issue's number is stored
        # with an update()), and the runs' events, written in bulk, on the timeline:
        for name in ("head", "body", "details", "outcome-fields", "conclusion", "results"):
            fragments.refine(name, proposal.updated_at.isoformat(), proposal.github_issue_number)
        fragments.refine("timeline", selectors.plan_last_run_event(plan_id=proposal.plan_id))
        # The GitHub panel, kept with the details, also shows what the site's settings say.
        fragments.refine("details", *sync_facts(proposal.github_issue_number))
        missing = [name for name in sections if fragments.get(name) is None]
        if any(name in selectors.PAGE_ROW_SECTIONS for name in missing):
            selectors.proposal_rest_load(proposal)
        prefetch_related_objects(
            [proposal], *(lookup for name in missing for lookup in sections[name])
        )
        # What this reader may do here, whether they follow it, and their review: asked once
        # per version of the proposal (a review, a hold, a launch all bump it), of the
        # reader's follows and of their roles; the services ask again on every action, so a
        # button is never the only check. (A superuser may do more than their roles say.)
        roles = sorted(role_names(user, fragments))
        for name in (reader, *filter(None, self.reader_html.values())):
            fragments.refine(name, *roles, user.is_superuser, proposal.updated_at.isoformat())
        site_header_refine(fragments, header, request)
        self.facts: dict[str, Any] = fragments.get_or_render(reader, self._reader_facts)

    def _reader_facts(self) -> dict[str, Any]:
        names = [action.name for action in allowed_actions(self.proposal, self.user)]
        review = (
            selectors.proposal_own_review(proposal=self.proposal, reviewer=self.user)
            if "review" in names
            else None
        )
        return {
            "actions": names,
            "following": follows.is_following(user=self.user, proposal_id=self.proposal.pk),
            "review": review.pk if review is not None else None,
        }

    def _review_form(self) -> ReviewForm:
        own = (
            selectors.proposal_own_review(proposal=self.proposal, reviewer=self.user)
            if self.facts["review"] is not None
            else None
        )
        return ReviewForm(instance=own)

    @functools.cached_property
    def _timeline(self) -> tuple[list[selectors.TimelineEntry], bool]:
        return selectors.proposal_timeline_recent(proposal=self.proposal)

    def in_flight(self) -> bool:
        """Whether runs of its plan are moving: its numbers change every few seconds."""
        plan_id = self.proposal.plan_id
        return plan_id is not None and run_selectors.plan_in_flight(plan_id=plan_id)

    def context(self) -> dict[str, Any]:
        proposal = self.proposal
        allowed = {name: ACTIONS[name] for name in self.facts["actions"]}
        return {
            "proposal": proposal,
            "actions": [  # (name, label, action): the buttons of the actions panel
                (name, allowed[name].label, allowed[name])
                for name in BUTTON_ACTIONS
                if name in allowed
            ],
            "can_review": "review" in allowed,
            # The forms are built only if the page shows them (their fields are fragments).
            "review_form": SimpleLazyObject(self._review_form),
            "can_comment": "comment" in allowed,
            "comment_form": SimpleLazyObject(CommentForm),
            "can_edit": "edit" in allowed,
            "can_record_outcome": "record_outcome" in allowed,
            # The outcome form waits for the results (or an explicit "without results").
            "results_pending": (
                run_selectors.plan_results_pending(plan_id=proposal.plan_id)
                if proposal.plan_id is not None and "record_outcome" in allowed
                else ""
            ),
            # Only read when the timeline is rendered, not when it comes from the cache:
            "timeline": SimpleLazyObject(lambda: self._timeline[0]),
            "timeline_cut": SimpleLazyObject(lambda: self._timeline[1]),
            "outcome_form": SimpleLazyObject(
                lambda: OutcomeForm(
                    initial={  # a recorded verdict is kept when changing it; none is suggested
                        "outcome": proposal.outcome,
                        "confidence": proposal.confidence if proposal.outcome else "",
                        "conclusion": proposal.conclusion,
                    }
                )
            ),
            "following": self.facts["following"],
            "open_alerts": list(alert_selectors.plan_open_alerts(plan_id=proposal.plan_id))
            if proposal.plan_id is not None
            else [],
            # Read only when the dry runs' fragment is rendered (a dry run's writes bump
            # its own version, as they write no proposal row).
            "dry_runs": SimpleLazyObject(
                lambda: run_selectors.subject_dry_runs(subject=services.dry_run_subject(proposal))
            ),
            "fragments": self.fragments,
            "site_header": self.header,
            **self.reader_html,
            **_PlanContext(proposal).context(),
        }
