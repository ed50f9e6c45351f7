"""The campaign page's form for recording an intervention (maintainers): the same checks as
the API, since both end in ``services.intervention_record``."""

from __future__ import annotations

from typing import Any

from django import forms

from marin_site.input import PolicyForm
from runs.campaigns.models import InterventionKind

MAX_WINDOW_STEPS = 10_000_000


class InterventionForm(PolicyForm):
    step = forms.IntegerField(min_value=0, max_value=2**62, help_text="The step it took effect.")
    kind = forms.ChoiceField(choices=InterventionKind.choices)
    title = forms.CharField(max_length=200)
    from_value = forms.CharField(max_length=200, required=False, label="From")
    to_value = forms.CharField(max_length=200, required=False, label="To")
    keys = forms.CharField(
        max_length=2000,
        required=False,
        help_text="The telemetry keys it concerns, separated by commas or spaces: the page "
        "compares each before and after.",
    )
    window_steps = forms.IntegerField(
        min_value=1, max_value=MAX_WINDOW_STEPS, initial=2000, label="Window (steps)"
    )
    happened_at = forms.DateTimeField(
        required=False, label="When (UTC)", help_text="Empty: now. E.g. 2026-11-30 14:00."
    )
    note = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 4}),
        max_length=20_000,
        required=False,
        help_text="Markdown.",
    )

    def clean_keys(self) -> list[str]:
        text: str = self.cleaned_data.get("keys") or ""
        return [key for key in text.replace(",", " ").split() if key]

    def record_kwargs(self) -> dict[str, Any]:
        """What ``intervention_record`` takes, from the cleaned data."""
        data = dict(self.cleaned_data)
        if data.get("happened_at") is None:
            data.pop("happened_at", None)
        return data
