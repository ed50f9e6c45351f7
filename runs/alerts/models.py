"""Alerts on a run's metrics: the rules maintainers edit, the rolling state kept per run and
rule, and the alerts themselves (each opens once and closes once).

A rule belongs to a recipe (every run of the recipe) or to one run (an override). Without a
stored rule a recipe still has defaults, derived from its metric declarations
(``runs.alerts.rules``); a stored rule of the same kind and key replaces the default.
"""

from __future__ import annotations

from django.db import models
from django.urls import reverse


class AlertKind(models.TextChoices):
    SPIKE = "spike", "Spike (above the rolling median by k robust deviations)"
    DROP = "drop", "Sustained drop"
    RISE = "rise", "Sustained rise"
    SILENCE = "silence", "Heartbeat gone silent"
    NAN = "nan", "Not a finite number"


class AlertRule(models.Model):
    """One rule: a kind, the metric key it watches (blank for silence; ``*`` for NaN on every
    key) and its parameters (``runs.alerts.rules.PARAMETERS`` says which, with their ranges)."""

    recipe = models.ForeignKey(
        "runs.Recipe", null=True, blank=True, on_delete=models.CASCADE, related_name="alert_rules"
    )
    run = models.ForeignKey(
        "runs.Run", null=True, blank=True, on_delete=models.CASCADE, related_name="alert_rules"
    )
    kind = models.CharField(max_length=16, choices=AlertKind.choices)
    key = models.CharField(max_length=200, blank=True)
    params = models.JSONField(default=dict, blank=True)
    enabled = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["recipe", "run", "kind", "key"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(recipe__isnull=False, run__isnull=True)
                | models.Q(recipe__isnull=True, run__isnull=False),
                name="alert_rule_recipe_or_run",
            ),
            models.UniqueConstraint(
                fields=["recipe", "kind", "key"],
                condition=models.Q(run__isnull=True),
                name="alert_rule_recipe_unique",
            ),
            models.UniqueConstraint(
                fields=["run", "kind", "key"],
                condition=models.Q(recipe__isnull=True),
                name="alert_rule_run_unique",
            ),
        ]

    def __str__(self) -> str:
        scope = f"recipe {self.recipe_id}" if self.recipe_id else f"run {self.run_id}"
        return f"{self.kind} {self.key or '-'} on {scope}"


class AlertWatch(models.Model):
    """The rolling state of one rule on one run: what the next batch needs, so that it never
    reads the run's history again (a window of recent values, the last step folded in)."""

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="alert_watches")
    kind = models.CharField(max_length=16, choices=AlertKind.choices)
    key = models.CharField(max_length=200, blank=True)
    state = models.JSONField(default=dict)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "alert watches"
        constraints = [
            models.UniqueConstraint(fields=["run", "kind", "key"], name="alert_watch_unique")
        ]

    def __str__(self) -> str:
        return f"{self.run_id} {self.kind} {self.key}"


class Alert(models.Model):
    """An alert: opened once, closed once. At most one open alert per run, kind and key."""

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="alerts")
    kind = models.CharField(max_length=16, choices=AlertKind.choices)
    key = models.CharField(max_length=200, blank=True)
    message = models.TextField(max_length=2_000)
    opened_at = models.DateTimeField(auto_now_add=True, db_index=True)
    opened_step = models.BigIntegerField(null=True, blank=True)
    opened_value = models.FloatField(null=True, blank=True)
    closed_at = models.DateTimeField(null=True, blank=True, db_index=True)
    closed_step = models.BigIntegerField(null=True, blank=True)
    close_message = models.TextField(blank=True, max_length=2_000)

    class Meta:
        ordering = ["-opened_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "kind", "key"],
                condition=models.Q(closed_at__isnull=True),
                name="alert_one_open_per_watch",
            )
        ]

    def __str__(self) -> str:
        return (
            f"{self.kind} {self.key} on run {self.run_id} ({'open' if self.is_open else 'closed'})"
        )

    def get_absolute_url(self) -> str:
        return reverse("run-page", kwargs={"pk": self.run_id}) + f"#alert-{self.pk}"

    @property
    def is_open(self) -> bool:
        return self.closed_at is None
