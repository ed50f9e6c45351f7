"""Recipes (what can be trained) and frozen plans (what an approval launches).

``runs`` knows plans, not proposals: a proposal points at its frozen plan, never the
other way round.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.urls import reverse

from runs.plans import RecipeSpec

slug_validator = RegexValidator(
    r"^[a-z0-9][a-z0-9-]{0,62}$",
    "Use lowercase letters, digits and hyphens (at most 63 characters).",
)


class Recipe(models.Model):
    """A maintainer-registered training entrypoint with its overridable parameters."""

    name = models.CharField(max_length=63, validators=[slug_validator])
    version = models.CharField(max_length=32, default="1")
    title = models.CharField(max_length=200)
    description = models.TextField(blank=True, max_length=20_000)
    command_template = models.TextField(
        max_length=2_000,
        help_text="The command a runner executes, e.g. 'python -m marin.train --config {config_path}'.",
    )
    default_config = models.JSONField(default=dict)
    parameter_schema = models.JSONField(
        default=dict, help_text="JSON Schema of the parameters a proposal may override."
    )
    compute_model = models.JSONField(
        default=dict,
        help_text=(
            "total_params, active_params, tokens (numbers or formulas over the config), "
            "peak_flops_per_accelerator, assumed_mfu, accelerator."
        ),
    )
    scales = models.JSONField(
        default=dict, blank=True, help_text="Scale name -> config overrides (a scaling ladder)."
    )
    is_active = models.BooleanField(default=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["name", "version"], name="recipe_name_version_unique")
        ]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"

    def get_absolute_url(self) -> str:
        return reverse("runs:recipe-detail", kwargs={"name": self.name, "version": self.version})

    def as_spec(self) -> RecipeSpec:
        return RecipeSpec(
            name=self.name,
            version=self.version,
            default_config=self.default_config,
            parameter_schema=self.parameter_schema,
            compute_model=self.compute_model,
            scales=self.scales or {},
        )

    @property
    def parameters(self) -> list[tuple[str, dict[str, Any]]]:
        return list((self.parameter_schema.get("properties") or {}).items())


class Plan(models.Model):
    """A frozen plan: every run approval launches, with the recipe as it was then."""

    recipe = models.ForeignKey(Recipe, on_delete=models.PROTECT, related_name="plans")
    recipe_snapshot = models.JSONField()
    baseline = models.JSONField(default=dict)
    spec_text = models.TextField(blank=True)
    spec = models.JSONField(default=dict)
    budget_accelerator_hours = models.FloatField(null=True, blank=True)
    run_count = models.PositiveIntegerField()
    total_flops = models.FloatField()
    total_accelerator_hours = models.FloatField()
    frozen_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-frozen_at"]

    def __str__(self) -> str:
        return f"plan {self.pk} ({self.run_count} runs of {self.recipe_snapshot.get('name')})"

    @property
    def over_budget(self) -> bool:
        budget = self.budget_accelerator_hours
        return budget is not None and self.total_accelerator_hours > budget


class PlanEntry(models.Model):
    """One point of a frozen plan: a resolved config, its hash and its cost."""

    plan = models.ForeignKey(Plan, on_delete=models.CASCADE, related_name="entries")
    index = models.PositiveIntegerField()
    scale = models.CharField(max_length=63, blank=True)
    seed = models.IntegerField(null=True, blank=True)
    overrides = models.JSONField(default=dict)
    config = models.JSONField()
    config_hash = models.CharField(max_length=64, db_index=True)
    is_baseline = models.BooleanField(default=False)
    diff = models.JSONField(default=dict)
    flops = models.FloatField()
    accelerator_hours = models.FloatField()
    cost_formula = models.TextField(blank=True)

    class Meta:
        ordering = ["plan", "index"]
        constraints = [
            models.UniqueConstraint(fields=["plan", "config_hash"], name="plan_entry_hash_unique"),
            models.UniqueConstraint(fields=["plan", "index"], name="plan_entry_index_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.plan_id}#{self.index} {self.config_hash[:12]}"
