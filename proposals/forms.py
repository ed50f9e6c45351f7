"""Web forms: field validation only; the services decide everything else."""

from __future__ import annotations

from typing import Any

import yaml
from django import forms

from marin_site.input import PolicyForm, PolicyModelForm
from proposals.models import Confidence, Outcome, Proposal, Review
from runs.models import Recipe
from runs.specs.ablation import PlanError, parse_overrides

PROPOSAL_FORM_FIELDS = [
    "title",
    "summary",
    "recipe",
    "description",
    "hypothesis",
    "success_metric",
    "success_direction",
    "success_threshold",
    "baseline",
    "ablation_spec",
    "budget_accelerator_hours",
    "pr_url",
    "branch",
    "wandb_url",
    "data_browser_url",
]

SPEC_PLACEHOLDER = """axes:
  capacity_factor: [1.0, 1.25]
  weight_decay: [0.0, 0.1]
scales: [small]
seeds: [0]"""


class ProposalForm(PolicyModelForm):
    baseline = forms.CharField(
        required=False,
        widget=forms.Textarea(
            attrs={"rows": 3, "placeholder": "learning_rate: 0.003", "class": "mono"}
        ),
        help_text="Overrides of the recipe's defaults that every run shares, as YAML or JSON.",
        max_length=64 * 1024,
    )
    pr_url = forms.URLField(
        label="Pull request", required=False, max_length=500, assume_scheme="https"
    )
    wandb_url = forms.URLField(
        label="W&B report", required=False, max_length=500, assume_scheme="https"
    )
    data_browser_url = forms.URLField(
        label="Data browser", required=False, max_length=500, assume_scheme="https"
    )
    labels = forms.CharField(
        required=False,
        max_length=1100,
        help_text="Comma-separated, e.g. moe, optimizer.",
    )

    class Meta:
        model = Proposal
        fields = PROPOSAL_FORM_FIELDS
        widgets = {
            "description": forms.Textarea(attrs={"rows": 8}),
            "hypothesis": forms.Textarea(
                attrs={"rows": 3, "placeholder": "A prediction, made before running."}
            ),
            "ablation_spec": forms.Textarea(
                attrs={"rows": 7, "placeholder": SPEC_PLACEHOLDER, "class": "mono"}
            ),
            "success_metric": forms.TextInput(attrs={"placeholder": "eval/loss"}),
        }
        help_texts = {
            "ablation_spec": "YAML: axes (parameter -> values), optional scales and seeds.",
            "budget_accelerator_hours": "The most accelerator-hours the plan may use.",
            "success_threshold": "The smallest improvement over the baseline that counts.",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        recipes = Recipe.objects.filter(is_active=True)
        if self.instance.pk and self.instance.recipe_id:
            recipes = Recipe.objects.filter(is_active=True) | Recipe.objects.filter(
                pk=self.instance.recipe_id
            )
        self.fields["recipe"].queryset = recipes.order_by("name", "-created_at")  # type: ignore[attr-defined]
        if self.instance.pk and not self.is_bound:
            baseline = self.instance.baseline or {}
            self.initial["baseline"] = (
                yaml.safe_dump(baseline, sort_keys=False).strip() if baseline else ""
            )
            self.initial["labels"] = ", ".join(label.name for label in self.instance.labels.all())

    def clean_baseline(self) -> dict[str, Any]:
        try:
            return parse_overrides(self.cleaned_data.get("baseline") or "", "baseline")
        except PlanError as exc:
            raise forms.ValidationError(exc.errors.get("baseline", [str(exc)])) from exc

    def clean_labels(self) -> list[str]:
        raw = self.cleaned_data.get("labels") or ""
        return [part.strip() for part in raw.split(",") if part.strip()]

    def service_data(self) -> dict[str, Any]:
        return {field: self.cleaned_data[field] for field in PROPOSAL_FORM_FIELDS}


class ReasonForm(PolicyForm):
    reason = forms.CharField(
        required=False, max_length=10_000, widget=forms.Textarea(attrs={"rows": 2})
    )
    git_ref = forms.CharField(required=False, max_length=255)
    executor = forms.CharField(required=False, max_length=100)
    dry_run_override = forms.CharField(required=False, max_length=2000)


class ReviewForm(PolicyModelForm):
    class Meta:
        model = Review
        fields = ["score", "recommendation", "text"]
        widgets = {
            "score": forms.Select(choices=[("", "Score…")] + [(i, f"{i}/5") for i in range(1, 6)]),
            "text": forms.Textarea(attrs={"rows": 4}),
        }


class CommentForm(PolicyForm):
    body = forms.CharField(max_length=64 * 1024, widget=forms.Textarea(attrs={"rows": 3}))


class OutcomeForm(PolicyForm):
    # No verdict is chosen for the maintainer: the first option is a prompt, not "worked".
    outcome = forms.ChoiceField(choices=[("", "Choose a verdict…"), *Outcome.choices])
    confidence = forms.ChoiceField(choices=[("", "Choose…"), *Confidence.choices])
    conclusion = forms.CharField(
        required=False, max_length=64 * 1024, widget=forms.Textarea(attrs={"rows": 4})
    )
    without_results_reason = forms.CharField(
        required=False,
        max_length=10_000,
        label="Why record it without results",
        widget=forms.Textarea(attrs={"rows": 2}),
    )
    # Shown for an imported old issue: its result as found, with its key figures and links.
    results = forms.CharField(
        required=False,
        max_length=64 * 1024,
        label="Key figures",
        widget=forms.Textarea(attrs={"rows": 3}),
    )
    wandb_url = forms.URLField(
        required=False, max_length=500, label="W&B report", assume_scheme="https"
    )
    data_browser_url = forms.URLField(
        required=False, max_length=500, label="Data browser", assume_scheme="https"
    )

    def clean(self) -> dict[str, object]:
        """Fields the page did not show (a proposal not imported) are not sent: kept."""
        cleaned = super().clean() or {}
        for key in ("results", "wandb_url", "data_browser_url"):
            if key not in self.data:
                cleaned[key] = None
        return cleaned
