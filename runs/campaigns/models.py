"""A campaign, its runs (restarts and phases, in order) and the interventions made to it."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.urls import reverse

LINKS_HELP = "A list of {label, url}: proposals, ladders, posts (http(s) or a path on this site)."


class Phase(models.TextChoices):
    PRETRAINING = "pre-training"
    MIDTRAINING = "mid-training"
    COOLDOWN = "cool-down"


class Campaign(models.Model):
    """A named long run: its target, hardware and recipe, made of ``CampaignRun`` rows."""

    slug = models.SlugField(max_length=63, unique=True)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True, max_length=50_000, help_text="Markdown.")
    target_tokens = models.FloatField(help_text="Tokens the campaign means to train on.")
    target_flops = models.FloatField(help_text="Training FLOPs at the target.")
    hardware = models.CharField(max_length=500, blank=True)
    recipe_config = models.JSONField(default=dict, blank=True)
    loss_key = models.CharField(max_length=200, default="train/loss")
    tokens_key = models.CharField(
        max_length=200,
        default="throughput/total_tokens",
        help_text="The key its runs log the tokens seen under; charts are drawn against it.",
    )
    telemetry_keys = models.JSONField(
        default=list, blank=True, help_text="Keys charted beyond loss, throughput, MFU, drops."
    )
    ladder_plan = models.ForeignKey(
        "runs.Plan",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The plan of the ladder whose fit is projected to this campaign's FLOPs.",
    )
    links = models.JSONField(default=list, blank=True, help_text=LINKS_HELP)
    is_active = models.BooleanField(default=True, help_text="Linked from the home page.")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-is_active", "-created_at"]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("campaigns:detail", kwargs={"slug": self.slug})

    @property
    def flops_per_token(self) -> float | None:
        if self.target_tokens > 0 and self.target_flops > 0:
            return self.target_flops / self.target_tokens
        return None


class CampaignRun(models.Model):
    """One run of a campaign: an attempt (a restart is the next ``order``) in a phase."""

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="members")
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="campaign_members")
    phase = models.CharField(max_length=16, choices=Phase.choices, default=Phase.PRETRAINING)
    order = models.PositiveIntegerField(
        help_text="Later attempts win where their steps overlap earlier ones."
    )
    data_mix = models.JSONField(
        default=dict, blank=True, help_text="The phase config's data mix: {source: weight}."
    )

    class Meta:
        ordering = ["campaign", "order"]
        constraints = [
            models.UniqueConstraint(fields=["campaign", "run"], name="campaign_run_unique"),
            models.UniqueConstraint(fields=["campaign", "order"], name="campaign_run_order_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.campaign_id}#{self.order} run {self.run_id} ({self.phase})"


class InterventionKind(models.TextChoices):
    HYPERPARAMETER = "hyperparameter"
    DATA_MIX = "data-mix"
    KERNEL = "kernel"
    PARALLELISM = "parallelism"
    HARDWARE = "hardware"
    OTHER = "other"


class Intervention(models.Model):
    """A dated change at a step (weight decay 0.1 -> 0.05, new kernels), with a note."""

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="interventions")
    step = models.BigIntegerField()
    happened_at = models.DateTimeField()
    kind = models.CharField(max_length=16, choices=InterventionKind.choices)
    title = models.CharField(max_length=200)
    from_value = models.CharField(max_length=200, blank=True)
    to_value = models.CharField(max_length=200, blank=True)
    keys = models.JSONField(
        default=list, blank=True, help_text="The telemetry keys it concerns: before/after."
    )
    window_steps = models.PositiveIntegerField(
        default=2000, help_text="Steps on each side compared for the before/after figure."
    )
    note = models.TextField(blank=True, max_length=20_000, help_text="Markdown.")
    links = models.JSONField(default=list, blank=True, help_text=LINKS_HELP)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["campaign", "step", "pk"]

    def __str__(self) -> str:
        return f"{self.campaign_id}@{self.step} {self.title}"

    def get_absolute_url(self) -> str:
        """Its entry on the campaign's page (feeds link here)."""
        url = reverse("campaigns:detail", kwargs={"slug": self.campaign.slug})
        return f"{url}#intervention-{self.pk}"
