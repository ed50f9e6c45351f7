from django.contrib import admin

from runs.models import Plan, PlanEntry, Recipe


@admin.register(Recipe)
class RecipeAdmin(admin.ModelAdmin):
    list_display = ["name", "version", "title", "is_active", "created_at"]
    list_filter = ["is_active"]
    search_fields = ["name", "title"]


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
