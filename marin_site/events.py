"""The one shape of a timeline row, shared by every timeline of the site, and its verbs.

``TimelineEvent`` is abstract: ``proposals.Event`` (a proposal's changes, its comments and
its admin edits), ``runs.RunEvent`` (a run's) and ``runs.RecipeEvent`` (a recipe's) are its
tables, with the same columns, so a proposal's timeline can merge its own rows with the
rows of its plan's runs (``proposals.selectors.proposal_timeline``) without ``runs``
knowing about proposals. Rows are appended, never edited.

Every row's ``verb`` is a ``Verb``: an identifier stored, a phrase shown. A state reached is
its state's own name (``submitted``, ``running``); everything else is a noun and what
happened to it (``outcome_recorded``, ``comment_edited``).
"""

from __future__ import annotations

from typing import Any, Self

from django.conf import settings
from django.db import models

from marin_site.doors import Door

MESSAGE_MAX = 10_000


class Verb(models.TextChoices):
    """What a timeline row says happened. Add a member here before recording a new verb."""

    # A proposal's life (the states it reaches are named as the states are).
    CREATED = "created", "created"
    EDITED = "edited", "edited"
    AMENDED = "amended", "amended"
    SUBMITTED = "submitted", "submitted"
    CHANGES_REQUESTED = "changes_requested", "requested changes"
    APPROVED = "approved", "approved"
    DRY_RUN_STARTED = "dry_run_started", "started a dry run"
    DRY_RUN_OVERRIDDEN = "dry_run_overridden", "approved over a failed dry run"
    REJECTED = "rejected", "rejected"
    WITHDRAWN = "withdrawn", "withdrew"
    CANCELED = "canceled", "canceled"
    REVIEWED = "reviewed", "reviewed"
    REVIEW_UPDATED = "review_updated", "updated the review"
    COMMENTED = "commented", "commented"
    COMMENT_EDITED = "comment_edited", "edited a comment"
    COMMENT_DELETED = "comment_deleted", "deleted a comment"
    OUTCOME_RECORDED = "outcome_recorded", "recorded the outcome"
    HELD = "held", "put on hold"
    UNHELD = "unheld", "released the hold"
    # Its GitHub issue.
    LINKED = "linked", "linked the GitHub issue"
    ISSUE_CLOSED = "issue_closed", "closed the issue"
    ISSUE_REOPENED = "issue_reopened", "reopened the issue"
    ISSUE_DELETED = "issue_deleted", "deleted the issue"
    ISSUE_TRANSFERRED = "issue_transferred", "transferred the issue"
    IMPORTED = "imported", "imported the GitHub issue"
    ADOPTED = "adopted", "adopted the imported proposal"
    # A run's life (the states it reaches are named as the states are).
    QUEUED = "queued", "queued"
    CACHED = "cached", "reused a finished run of the same config"
    OFFERED = "offered", "offered"
    RUNNING = "running", "running"
    FINISHED = "finished", "finished"
    FAILED = "failed", "failed"
    KILLED = "killed", "killed"
    CRASHED = "crashed", "crashed"
    PREEMPTED = "preempted", "preempted"
    CANCEL_REQUESTED = "cancel_requested", "asked to cancel"
    RERUN = "rerun", "queued as a rerun"
    RERUN_REQUESTED = "rerun_requested", "asked for a rerun"
    RETRY = "retry", "queued as a retry"
    RETRY_REQUESTED = "retry_requested", "asked for a retry"
    CONFIG_MISMATCH = "config_mismatch", "reported a config other than the plan's"
    TRACKER_IMPORT = "tracker_import", "imported tracker metrics"
    MLFLOW_DELETED = "mlflow_deleted", "deleted through MLflow"
    NOT_FINITE = "not_finite", "logged a value that is not finite"
    METRIC_FLAGGED = "metric_flagged", "logged values that do not fit the declared unit"
    METRIC_FLAG_RESOLVED = "metric_flag_resolved", "values fit the declared unit again"
    METRIC_REFUSED = "metric_refused", "logged a metric that cannot be stored"
    ALERT_OPENED = "alert_opened", "alert opened"
    ALERT_CLOSED = "alert_closed", "alert closed"
    # The board (runs/board): a run's place in a track's first ranks changed.
    BOARD_RANK_CHANGED = "board_rank_changed", "changed rank on the board"
    # Any row, through the admin (the message names what was changed).
    ADMIN_CREATED = "admin_created", "created in the admin"
    ADMIN_EDITED = "admin_edited", "edited in the admin"
    ADMIN_DELETED = "admin_deleted", "deleted in the admin"


def verb_label(value: str) -> str:
    """The phrase shown for a stored verb (a verb no longer in ``Verb`` shows as stored)."""
    try:
        return str(Verb(value).label)
    except ValueError:
        return value.replace("_", " ")


class TimelineEvent(models.Model):
    """Who did what, from which state to which, when, through which door."""

    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_label = models.CharField(max_length=100, blank=True)
    verb = models.CharField(max_length=40, choices=Verb.choices)
    from_state = models.CharField(max_length=20, blank=True)
    to_state = models.CharField(max_length=20, blank=True)
    message = models.TextField(blank=True, max_length=MESSAGE_MAX)
    door = models.CharField(max_length=16, choices=Door.choices, default=Door.WEB)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        abstract = True
        ordering = ["created_at", "id"]

    @classmethod
    def build(
        cls,
        *,
        verb: Verb,
        door: str,
        actor: Any = None,
        actor_label: str = "",
        from_state: str = "",
        to_state: str = "",
        message: str = "",
        **subject: Any,
    ) -> Self:
        """An unsaved row about ``subject`` (``proposal=``, ``run=``, ``run_id=``, ``recipe=``):
        every recorder of every timeline builds its rows here, then saves or bulk-creates them.
        ``actor`` is kept only when it is a signed-in user; the message is cut to its cap."""
        user = actor if getattr(actor, "is_authenticated", False) else None
        return cls(
            actor=user,
            actor_label=actor_label,
            verb=Verb(verb),
            door=door,
            from_state=from_state,
            to_state=to_state,
            message=message[:MESSAGE_MAX],
            **subject,
        )

    @property
    def verb_label(self) -> str:
        return verb_label(self.verb)

    @property
    def who(self) -> str:
        """The name shown for the actor: its label, else its username, else "system"."""
        if self.actor_label:
            return self.actor_label
        return self.actor.get_username() if self.actor is not None else "system"
