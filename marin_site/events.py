"""The one shape of a timeline row, shared by every timeline of the site.

``TimelineEvent`` is abstract: ``proposals.Event`` (a proposal's changes, its comments and
its admin edits), ``runs.RunEvent`` (a run's) and ``runs.RecipeEvent`` (a recipe's) are its
tables, with the same columns, so a proposal's timeline can merge its own rows with the
rows of its plan's runs (``proposals.selectors.proposal_timeline``) without ``runs``
knowing about proposals. Rows are appended, never edited.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from marin_site.doors import Door

MESSAGE_MAX = 10_000


class TimelineEvent(models.Model):
    """Who did what, from which state to which, when, through which door."""

    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_label = models.CharField(max_length=100, blank=True)
    verb = models.CharField(max_length=40)
    from_state = models.CharField(max_length=20, blank=True)
    to_state = models.CharField(max_length=20, blank=True)
    message = models.TextField(blank=True, max_length=MESSAGE_MAX)
    door = models.CharField(max_length=16, choices=Door.choices, default=Door.WEB)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        abstract = True
        ordering = ["created_at", "id"]

    @property
    def who(self) -> str:
        """The name shown for the actor: its label, else its username, else "system"."""
        if self.actor_label:
            return self.actor_label
        return self.actor.get_username() if self.actor is not None else "system"
