"""The admin of campaigns: maintainers declare a campaign, attach its runs (inline) and
record interventions. The forms check what the API's services check."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import ValidationError

from marin_site.input import PolicyModelForm
from runs.campaigns import services
from runs.campaigns.models import Campaign, CampaignRun, Intervention


class CampaignAdminForm(PolicyModelForm):
    class Meta:
        model = Campaign
        fields = list(services.CAMPAIGN_FIELDS)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        try:
            cleaned["links"] = services.links_validate(cleaned.get("links") or [])
            cleaned["telemetry_keys"] = services.keys_validate(
                cleaned.get("telemetry_keys") or [], field="telemetry_keys"
            )
        except ValidationError as exc:
            for field, messages in exc.message_dict.items():
                self.add_error(field if field in self.fields else None, messages)
        return cleaned


class InterventionAdminForm(PolicyModelForm):
    class Meta:
        model = Intervention
        fields = [
            "campaign",
            "step",
            "happened_at",
            "kind",
            "title",
            "from_value",
            "to_value",
            "keys",
            "window_steps",
            "note",
            "links",
        ]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        try:
            cleaned["links"] = services.links_validate(cleaned.get("links") or [])
            cleaned["keys"] = services.keys_validate(cleaned.get("keys") or [], field="keys")
        except ValidationError as exc:
            for field, messages in exc.message_dict.items():
                self.add_error(field if field in self.fields else None, messages)
        return cleaned


class CampaignRunInline(admin.TabularInline):
    model = CampaignRun
    extra = 1
    raw_id_fields = ["run"]


@admin.register(Campaign)
class CampaignAdmin(admin.ModelAdmin):
    form = CampaignAdminForm
    list_display = ["slug", "name", "is_active", "target_tokens", "target_flops", "created_at"]
    list_filter = ["is_active"]
    raw_id_fields = ["ladder_plan"]
    inlines = [CampaignRunInline]

    def save_model(self, request: Any, obj: Campaign, form: Any, change: bool) -> None:
        if not change:
            obj.created_by = request.user
        super().save_model(request, obj, form, change)


@admin.register(Intervention)
class InterventionAdmin(admin.ModelAdmin):
    form = InterventionAdminForm
    list_display = ["campaign", "step", "kind", "title", "from_value", "to_value", "happened_at"]
    list_filter = ["kind", "campaign"]

    def save_model(self, request: Any, obj: Intervention, form: Any, change: bool) -> None:
        if not change:
            obj.created_by = request.user
        super().save_model(request, obj, form, change)


@admin.register(CampaignRun)
class CampaignRunAdmin(admin.ModelAdmin):
    """A campaign's runs are edited inline on the campaign; this list finds a run's campaigns."""

    list_display = ["campaign", "run", "phase", "order"]
    list_filter = ["campaign", "phase"]
    raw_id_fields = ["run"]
