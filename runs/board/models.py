"""A board track: which finished runs it reads (a recipe, or any) and how it ranks them (a
rule of ``runs.verdicts`` with its parameters, on one metric key). Maintainers add tracks in
the admin; the entries are never stored, they are read from the runs (``runs.board.read``)."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models

from runs.validators import slug_validator

BPB_KEY = "eval/paloma/c4_en/bpb"


class TrackRule(models.TextChoices):
    SPEEDRUN_THRESHOLD = "speedrun_threshold", "fewest FLOPs to reach at most a threshold"
    LOWEST = "lowest", "lowest final value of the metric"


class BoardTrack(models.Model):
    """One ranking of the board, e.g. "fastest to at most 1.3 C4-EN BPB"."""

    slug = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    title = models.CharField(max_length=200)
    description = models.TextField(blank=True, max_length=2_000)
    recipe_name = models.CharField(
        max_length=63, blank=True, help_text="Only runs of this recipe; blank: any recipe."
    )
    metric = models.CharField(max_length=200, default=BPB_KEY)
    rule = models.CharField(
        max_length=32, choices=TrackRule.choices, default=TrackRule.SPEEDRUN_THRESHOLD
    )
    parameters = models.JSONField(
        default=dict, blank=True, help_text='The rule\'s parameters, e.g. {"threshold": 1.3}.'
    )
    top_n = models.PositiveIntegerField(
        default=10, help_text="A newly finished run that changes these ranks is on the timeline."
    )
    position = models.PositiveIntegerField(default=0)
    active = models.BooleanField(default=True)

    class Meta:
        app_label = "runs"
        ordering = ["position", "slug"]

    def __str__(self) -> str:
        return self.title

    def clean(self) -> None:
        from runs.board.read import parameters_clean

        try:
            self.parameters = parameters_clean(self.rule, self.parameters)
        except ValueError as problem:
            raise ValidationError({"parameters": str(problem)}) from problem
