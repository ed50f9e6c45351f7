"""Alerts in the admin: maintainers edit rules (checked as the API checks them); alerts are
read-only (they open and close from the data)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import ValidationError

from marin_site.admin import TimelineAdmin
from marin_site.input import PolicyModelForm
from runs.alerts import rules
from runs.alerts.models import Alert, AlertRule, AlertWatch


class AlertRuleForm(PolicyModelForm):
    class Meta:
        model = AlertRule
        fields = ["recipe", "run", "kind", "key", "params", "enabled"]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if self.errors:
            return cleaned
        if (cleaned.get("recipe") is None) == (cleaned.get("run") is None):
            raise ValidationError("Give a recipe or a run (exactly one).")
        _, problems = rules.params_check(
            kind=cleaned.get("kind", ""), key=cleaned.get("key", ""), params=cleaned.get("params")
        )
        for name, text in problems.items():
            self.add_error(name if name in self.fields else "params", f"{name}: {text}")
        return cleaned


@admin.register(AlertRule)
class AlertRuleAdmin(admin.ModelAdmin):
    form = AlertRuleForm
    list_display = ["kind", "key", "recipe", "run", "enabled", "updated_at"]
    list_filter = ["kind", "enabled"]
    raw_id_fields = ["run"]


@admin.register(Alert)
class AlertAdmin(TimelineAdmin):
    list_display = ["run", "kind", "key", "opened_at", "closed_at"]
    list_filter = ["kind"]
    raw_id_fields = ["run"]


@admin.register(AlertWatch)
class AlertWatchAdmin(TimelineAdmin):
    """The rolling state each rule keeps per run (kept by the evaluation, shown to debug a
    rule, never edited)."""

    list_display = ["run", "kind", "key"]
    list_filter = ["kind"]
