from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError

from runs.models import (
    MetricSeries,
    MetricSummary,
    Plan,
    PlanEntry,
    PlanLaunch,
    Recipe,
    Run,
    RunEvent,
)
from runs.services import RECIPE_FIELDS, recipe_create, recipe_update, recipe_validate


class RecipeAdminForm(forms.ModelForm):
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
class RecipeAdmin(admin.ModelAdmin):
    """Maintainers add and edit recipes here too; the writes go through the recipe services."""

    form = RecipeAdminForm
    list_display = ["name", "version", "title", "executor", "is_active", "created_at"]
    list_filter = ["is_active", "executor"]
    search_fields = ["name", "title"]

    def save_form(self, request: Any, form: Any, change: bool) -> Recipe:
        data = {field: form.cleaned_data[field] for field in RECIPE_FIELDS}
        if change:
            return recipe_update(recipe=Recipe.objects.get(pk=form.instance.pk), data=data)
        return recipe_create(actor=request.user, data=data)

    def save_model(self, request: Any, obj: Recipe, form: Any, change: bool) -> None:
        """save_form has written it, through the services."""

    def save_related(self, request: Any, form: Any, formsets: Any, change: bool) -> None:
        """A recipe has no related rows, and its form was never saved as a ModelForm."""


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
class RunAdmin(admin.ModelAdmin):
    list_display = ["id", "plan", "state", "failure_kind", "executor", "attempt"]
    list_filter = ["state", "failure_kind", "executor"]
    raw_id_fields = ["plan", "entry"]


@admin.register(MetricSummary)
class MetricSummaryAdmin(admin.ModelAdmin):
    list_display = ["run", "key", "last", "min", "max"]
    raw_id_fields = ["run"]


# MetricPoint has no admin: Django's admin refuses composite primary keys. Points are read
# through the run page, the series API and the CSV export.


@admin.register(MetricSeries)
class MetricSeriesAdmin(admin.ModelAdmin):
    list_display = ["run", "key", "origin", "width", "refreshed_at"]
    raw_id_fields = ["run"]
    exclude = ["buckets"]


@admin.register(RunEvent)
class RunEventAdmin(admin.ModelAdmin):
    list_display = ["run", "verb", "created_at"]
    raw_id_fields = ["run"]
