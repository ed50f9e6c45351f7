from typing import Any

from django.contrib import admin
from django.db import models
from django.http import HttpRequest

from marin_site.admin import RecordedAdmin, TimelineAdmin
from marin_site.doors import Door
from marin_site.events import Verb
from proposals import permissions as perms
from proposals.github.outbox.enqueue import outbox_retry
from proposals.models import (
    Amendment,
    Comment,
    Event,
    Follow,
    GitHubBackfill,
    GitHubOutbox,
    GitHubRoleGrant,
    Label,
    Notice,
    NoticeDelivery,
    OutboxState,
    PendingIssue,
    Proposal,
    Review,
    WebhookDelivery,
)
from proposals.services import event_record


class ProposalRecordedAdmin(RecordedAdmin):
    """Admin edits of a proposal, or of its reviews, comments and amendments, go on the
    proposal's timeline (a deleted proposal takes its timeline with it)."""

    def admin_event_record(
        self, *, request: HttpRequest, obj: Any, verb: Verb, message: str
    ) -> None:
        if isinstance(obj, Proposal):
            if verb == Verb.ADMIN_DELETED:
                return
            proposal, noun = obj, ""
        else:  # a review, comment or amendment: the message names it
            proposal, noun = obj.proposal, str(obj._meta.verbose_name).capitalize()
        event_record(
            proposal=proposal,
            actor=request.user,
            verb=verb,
            door=Door.ADMIN,
            message=f"{noun}: {message}" if noun and message else noun or message,
        )


class ReviewInline(admin.TabularInline):
    model = Review
    extra = 0


@admin.register(Proposal)
class ProposalAdmin(ProposalRecordedAdmin):
    list_display = ["id", "title", "state", "outcome", "recipe", "author", "created_at"]
    list_filter = ["state", "outcome", "recipe", "labels"]
    search_fields = ["title", "summary", "hypothesis"]
    raw_id_fields = ["author", "plan"]
    inlines = [ReviewInline]
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}

    # "proposals.add_proposal" and "change_proposal" are the site's rules (any contributor
    # proposes; the author or a maintainer edits, through the services and their transitions).
    # The admin's raw form would bypass both: superusers only; maintainers read here.
    def has_add_permission(self, request: Any) -> bool:
        return bool(request.user.is_superuser)

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return bool(request.user.is_superuser)


@admin.register(Review)
class ReviewAdmin(ProposalRecordedAdmin):
    list_display = ["proposal", "reviewer", "score", "recommendation", "created_at"]
    raw_id_fields = ["proposal", "reviewer"]


@admin.register(Comment)
class CommentAdmin(ProposalRecordedAdmin):
    list_display = ["proposal", "author", "author_label", "created_at"]
    raw_id_fields = ["proposal", "author"]


@admin.register(Event)
class EventAdmin(TimelineAdmin):
    list_display = ["proposal", "verb", "from_state", "to_state", "door", "actor", "created_at"]
    list_filter = ["door", "verb"]
    raw_id_fields = ["proposal", "actor"]


admin.site.register(Label)


@admin.register(Amendment)
class AmendmentAdmin(ProposalRecordedAdmin):
    raw_id_fields = ["proposal", "author"]


@admin.register(GitHubOutbox)
class GitHubOutboxAdmin(admin.ModelAdmin):
    """GitHub writes; the action puts failed ones back in line (as the maintainer page does)."""

    list_display = [
        "id",
        "proposal",
        "operation",
        "state",
        "attempts",
        "next_attempt_at",
        "sent_at",
    ]
    list_filter = ["state", "operation"]
    search_fields = ["idempotency_key", "last_error"]
    raw_id_fields = ["proposal"]
    actions = ["retry"]

    @admin.action(description="Retry the selected failed writes", permissions=["manage_sync"])
    def retry(self, request: Any, queryset: Any) -> None:
        for row in queryset.filter(state=OutboxState.FAILED):
            outbox_retry(row_id=row.pk)

    def has_manage_sync_permission(self, request: Any) -> bool:
        return bool(request.user.has_perm(perms.MANAGE_GITHUB_SYNC))


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    list_display = ["delivery_id", "event", "action", "outcome", "received_at", "processed_at"]
    list_filter = ["event", "outcome"]
    search_fields = ["delivery_id", "detail"]


@admin.register(GitHubRoleGrant)
class GitHubRoleGrantAdmin(TimelineAdmin):
    """Kept by ``github_roles_sync`` from GITHUB_MAINTAINERS / GITHUB_REVIEWERS: shown, never
    edited here (change the setting)."""

    list_display = ["role", "login", "github_id", "checked_at"]
    list_filter = ["role"]


@admin.register(PendingIssue)
class PendingIssueAdmin(TimelineAdmin):
    """Experiment issues waiting for their recipe: shown, never edited here (they are imported
    when the recipe they name is loaded, or by the reconciler)."""

    list_display = ["number", "reason", "received_at", "updated_at"]
    search_fields = ["reason"]


@admin.register(GitHubBackfill)
class GitHubBackfillAdmin(TimelineAdmin):
    """Where ``manage.py github_backfill`` of each repository stands: shown, never edited
    here (the next run continues from it)."""

    list_display = ["repository", "phase", "label_index", "page", "since", "finished_at"]


@admin.register(Follow)
class FollowAdmin(admin.ModelAdmin):
    """Who follows which proposal or campaign: a maintainer may remove a follow (a bouncing
    address), never add one for someone."""

    list_display = ["user", "proposal", "campaign", "created_at"]
    raw_id_fields = ["user", "proposal", "campaign"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        return False


@admin.register(Notice)
class NoticeAdmin(TimelineAdmin):
    """What followers were told, and whether every mail went out."""

    list_display = ["subject", "proposal", "campaign", "created_at", "sent_at"]
    list_filter = ["sent_at"]
    search_fields = ["subject", "key"]


@admin.register(NoticeDelivery)
class NoticeDeliveryAdmin(TimelineAdmin):
    list_display = ["notice", "user", "sent_at"]
