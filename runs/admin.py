from typing import Any

from django.contrib import admin
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import models
from django.http import HttpRequest

from marin_site.admin import RecordedAdmin, TimelineAdmin
from marin_site.doors import Door
from marin_site.events import Verb
from marin_site.input import PolicyModelForm
from runs.board.models import BoardEntry, BoardRankChange, BoardTrack
from runs.board.parameters import parameters_clean
from runs.models import (
    Agent,
    DryRun,
    Lease,
    MetricFlag,
    MetricSeries,
    MetricSummary,
    Plan,
    PlanEntry,
    PlanLaunch,
    Pool,
    Recipe,
    RecipeEvent,
    RegistrationToken,
    Run,
    RunArtifact,
    RunEvent,
    TrackerImport,
    TrackerImportChunk,
)
from runs.services.recipes import RECIPE_FIELDS, recipe_event_record, recipe_validate
from runs.services.runs import run_event_record


class RecipeAdminForm(PolicyModelForm):
    """The admin's recipe form checks what the site's form and the API check (recipe_validate)."""

    class Meta:
        model = Recipe
        fields = list(RECIPE_FIELDS)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if self.errors:
            return cleaned
        try:
            recipe_validate(data={field: cleaned.get(field) for field in RECIPE_FIELDS})
        except ValidationError as exc:
            for field, messages in exc.message_dict.items():
                self.add_error(field if field in self.fields else None, messages)
        return cleaned


@admin.register(Recipe)
class RecipeAdmin(RecordedAdmin):
    """Maintainers add and edit recipes here too: the form checks what the recipe services
    check, and the edits go in the recipe's history, as edits on the site do."""

    form = RecipeAdminForm
    list_display = ["name", "version", "title", "executor", "is_active", "created_at"]
    list_filter = ["is_active", "executor"]
    search_fields = ["name", "title"]

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        if not change and isinstance(request.user, User):
            obj.created_by = request.user
        super().save_model(request, obj, form, change)

    def admin_event_record(
        self, *, request: HttpRequest, obj: Any, verb: Verb, message: str
    ) -> None:
        if verb != Verb.ADMIN_DELETED:  # a deleted recipe takes its history with it
            recipe_event_record(
                recipe=obj, actor=request.user, verb=verb, door=Door.ADMIN, message=message
            )


class PlanEntryInline(admin.TabularInline):
    model = PlanEntry
    extra = 0
    fields = ("index", "scale", "seed", "config_hash", "is_baseline", "flops", "accelerator_hours")
    readonly_fields = fields
    can_delete = False


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    list_display = ["id", "recipe", "run_count", "total_accelerator_hours", "frozen_at"]
    readonly_fields = ["recipe_snapshot", "baseline", "spec_text", "spec", "frozen_at"]
    inlines = [PlanEntryInline]


@admin.register(PlanEntry)
class PlanEntryAdmin(admin.ModelAdmin):
    list_display = ["plan", "index", "scale", "seed", "config_hash", "is_baseline", "flops"]
    list_filter = ["is_baseline"]
    search_fields = ["config_hash"]
    raw_id_fields = ["plan"]


@admin.register(PlanLaunch)
class PlanLaunchAdmin(admin.ModelAdmin):
    list_display = ["plan", "executor"]
    raw_id_fields = ["plan"]


@admin.register(Run)
class RunAdmin(RecordedAdmin):
    """Admin edits of a run go on its timeline (and so on its proposal's)."""

    list_display = ["id", "plan", "state", "failure_kind", "executor", "attempt"]
    list_filter = ["state", "failure_kind", "executor"]
    raw_id_fields = ["plan", "entry"]
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}

    def admin_event_record(
        self, *, request: HttpRequest, obj: Any, verb: Verb, message: str
    ) -> None:
        if verb != Verb.ADMIN_DELETED:  # a deleted run takes its timeline with it
            run_event_record(
                run=obj, verb=verb, door=Door.ADMIN, actor=request.user, message=message
            )


@admin.register(MetricSummary)
class MetricSummaryAdmin(admin.ModelAdmin):
    list_display = ["run", "key", "last", "min", "max"]
    raw_id_fields = ["run"]


# MetricPoint has no admin: Django's admin refuses composite primary keys. Points are read
# through the run page, the series API and the CSV export.


@admin.register(MetricFlag)
class MetricFlagAdmin(admin.ModelAdmin):
    """Keys whose values did not fit their declaration; resolved by correcting the recipe's
    declaration, not here (``runs.metrics.flags`` reads the values again)."""

    list_display = ["run", "key", "reason", "step", "created_at", "resolved_at"]
    list_filter = ["resolved_at"]
    raw_id_fields = ["run"]
    readonly_fields = ["run", "key", "reason", "step", "value", "unit", "created_at", "resolved_at"]


@admin.register(MetricSeries)
class MetricSeriesAdmin(admin.ModelAdmin):
    list_display = ["run", "key", "origin", "width", "refreshed_at"]
    raw_id_fields = ["run"]
    exclude = ["buckets"]


@admin.register(TrackerImport)
class TrackerImportAdmin(admin.ModelAdmin):
    list_display = ["id", "run", "state", "filename", "size_bytes", "points_written", "created_at"]
    list_filter = ["state", "door"]
    raw_id_fields = ["run", "actor"]


@admin.register(TrackerImportChunk)
class TrackerImportChunkAdmin(admin.ModelAdmin):
    list_display = ["tracker_import", "index"]
    raw_id_fields = ["tracker_import"]
    exclude = ["data"]  # up to 1 MB of an upload


@admin.register(DryRun)
class DryRunAdmin(admin.ModelAdmin):
    list_display = ["id", "subject", "recipe", "state", "created_at", "finished_at"]
    list_filter = ["state"]
    readonly_fields = [f.name for f in DryRun._meta.fields]


@admin.register(RunEvent)
class RunEventAdmin(TimelineAdmin):
    list_display = ["run", "verb", "door", "actor", "created_at"]
    list_filter = ["door", "verb"]
    raw_id_fields = ["run", "actor"]


@admin.register(RecipeEvent)
class RecipeEventAdmin(TimelineAdmin):
    list_display = ["recipe", "verb", "door", "actor", "created_at"]
    list_filter = ["door", "verb"]
    raw_id_fields = ["recipe", "actor"]


@admin.register(RunArtifact)
class RunArtifactAdmin(admin.ModelAdmin):
    list_display = ["run", "kind", "uri", "step", "attempt", "created_at"]
    list_filter = ["kind"]
    raw_id_fields = ["run"]


# Pools and agents (runs/pools/): tokens and credentials are stored as hashes only.


@admin.register(Pool)
class PoolAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "owner",
        "max_concurrent_runs",
        "author_dry_runs",
        "created_at",
        "retired_at",
    ]
    raw_id_fields = ["owner", "created_by"]


@admin.register(RegistrationToken)
class RegistrationTokenAdmin(admin.ModelAdmin):
    list_display = ["prefix", "pool", "note", "expires_at", "revoked_at", "uses"]
    readonly_fields = ["token_hash", "prefix", "uses", "last_used_at"]
    raw_id_fields = ["pool", "created_by"]


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "pool", "version", "last_contact_at", "revoked_at"]
    list_filter = ["pool"]
    readonly_fields = ["credential_hash", "prefix", "registered_with"]
    raw_id_fields = ["pool", "revoked_by"]


@admin.register(Lease)
class LeaseAdmin(admin.ModelAdmin):
    list_display = ["id", "run", "agent", "attempt", "created_at", "expires_at", "end_reason"]
    list_filter = ["end_reason"]
    raw_id_fields = ["run", "agent"]


from runs.alerts import admin as alerts_admin  # noqa: E402, F401  (registers alerts' admin)

# Campaigns' admin lives in runs/campaigns/admin.py; imported here so the admin finds it.
from runs.campaigns import admin as campaign_admin  # noqa: E402, F401


class BoardTrackAdminForm(PolicyModelForm):
    """A track's form: the rule's parameters are checked (``parameters_clean``), and what is
    wrong is said in words (a parameter the rule does not have, a value out of its range, a
    needed one missing); the defaults are filled in."""

    class Meta:
        model = BoardTrack
        fields = [
            "slug",
            "title",
            "description",
            "recipe_name",
            "metric",
            "rule",
            "parameters",
            "top_n",
            "position",
            "active",
        ]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if self.errors:
            return cleaned
        try:
            cleaned["parameters"] = parameters_clean(
                str(cleaned.get("rule") or ""), cleaned.get("parameters")
            )
        except ValueError as problem:
            self.add_error("parameters", str(problem))
        if not str(cleaned.get("metric") or "").strip():
            self.add_error("metric", "Name the metric key the track reads.")
        if (cleaned.get("top_n") or 0) > 1000:
            self.add_error("top_n", "At most 1000 ranks are followed on the timeline.")
        return cleaned


@admin.register(BoardTrack)
class BoardTrackAdmin(admin.ModelAdmin):
    """Maintainers manage the board's tracks here; a saved track is ranked again at once
    (``runs.receivers``), and its entries are never edited by hand."""

    form = BoardTrackAdminForm
    list_display = [
        "title",
        "slug",
        "recipe_name",
        "metric",
        "rule",
        "position",
        "active",
        "ranked_at",
    ]
    list_filter = ["active", "rule"]
    search_fields = ["slug", "title", "recipe_name", "metric"]
    readonly_fields = ["ranked_at"]


@admin.register(BoardEntry)
class BoardEntryAdmin(admin.ModelAdmin):
    """Read only: entries are written by ``runs.board.rank`` from the runs."""

    list_display = ["track", "rank", "run", "value", "flops", "verified", "origin"]
    list_filter = ["track", "verified", "origin"]
    raw_id_fields = ["run", "plan"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(BoardRankChange)
class BoardRankChangeAdmin(admin.ModelAdmin):
    """Read only: the rank changes ``runs.board.rank`` records (the board's feed)."""

    list_display = ["created_at", "track", "run", "from_rank", "to_rank", "message"]
    list_filter = ["track"]
    raw_id_fields = ["run"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
