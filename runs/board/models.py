"""The board's tables: a track (which finished runs it reads and how it ranks them), its
entries (the ranking, stored so a page of it is one indexed read) and the rank changes.

Maintainers add and edit tracks in the admin, whose form checks the rule's parameters
(``runs.board.parameters``) and says in words what is wrong. Entries are never edited by hand: ``runs.board.rank`` writes
them from the runs whenever a run finishes or a track changes, and records each change of
rank in the top of a track (``BoardRankChange``, and a row on the run's timeline).
"""

from __future__ import annotations

from django.db import models

from runs.validators import slug_validator

BPB_KEY = "eval/paloma/c4_en/bpb"


class TrackRule(models.TextChoices):
    """How a track ranks; each reads the final value of the track's metric."""

    SPEEDRUN_THRESHOLD = "speedrun_threshold", "fewest FLOPs to reach at most a threshold"
    LOWEST = "lowest", "lowest final value of the metric"
    EFFECTIVE_SPEEDUP = "effective_speedup", "effective speedup over a baseline (highest first)"
    PROJECTED_LOSS = "projected_loss", "a plan's loss projected to a budget (lowest first)"


class BoardTrack(models.Model):
    """One ranking of the board, e.g. "fastest to at most 1.3 C4-EN BPB"."""

    slug = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    title = models.CharField(max_length=200)
    description = models.TextField(blank=True, max_length=2_000)
    recipe_name = models.CharField(
        max_length=63, blank=True, help_text="Only runs of this recipe; blank: any recipe."
    )
    metric = models.CharField(
        max_length=200,
        default=BPB_KEY,
        help_text="The metric key read from each finished run (its final value).",
    )
    rule = models.CharField(
        max_length=32, choices=TrackRule.choices, default=TrackRule.SPEEDRUN_THRESHOLD
    )
    parameters = models.JSONField(
        default=dict,
        blank=True,
        help_text='The rule\'s parameters as a JSON object, e.g. {"threshold": 1.3}; '
        "missing ones take their defaults.",
    )
    top_n = models.PositiveIntegerField(
        default=10, help_text="Changes of rank within the first N are recorded on the timeline."
    )
    position = models.PositiveIntegerField(
        default=0, help_text="Order of the tracks, first lowest."
    )
    active = models.BooleanField(default=True, help_text="Shown on the board.")
    ranked_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        app_label = "runs"
        ordering = ["position", "slug"]

    def __str__(self) -> str:
        return self.title

    def get_absolute_url(self) -> str:
        return f"/board/?track={self.slug}"


class BoardEntry(models.Model):
    """One finished run ranked on one track, with its provenance copied from the run (so a
    page of the board reads this table alone)."""

    track = models.ForeignKey(BoardTrack, on_delete=models.CASCADE, related_name="entries")
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="board_entries")
    plan = models.ForeignKey("runs.Plan", on_delete=models.CASCADE, related_name="+")
    rank = models.PositiveIntegerField()
    score = models.FloatField(help_text="What the rule ranks by (the value, a speedup, ...).")
    value = models.FloatField(help_text="The final value of the track's metric.")
    flops = models.FloatField(null=True, blank=True)
    verified = models.BooleanField()
    origin = models.CharField(max_length=16)
    ran_by = models.CharField(max_length=200)
    executor = models.CharField(max_length=200, blank=True)
    pool = models.CharField(max_length=100, blank=True)
    agent = models.CharField(max_length=100, blank=True)
    git_sha = models.CharField(max_length=255, blank=True)
    config_hash = models.CharField(max_length=64, blank=True)
    recipe = models.CharField(max_length=200)
    run_name = models.CharField(max_length=300)
    description = models.TextField(blank=True)
    author_affiliation = models.CharField(max_length=200, blank=True)
    author_url = models.CharField(max_length=500, blank=True)
    results_filepath = models.CharField(max_length=500, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    wandb_url = models.CharField(max_length=500, blank=True)
    imported_from = models.CharField(max_length=500, blank=True)
    model_size = models.FloatField(null=True, blank=True)
    training_time = models.FloatField(null=True, blank=True)
    training_hardware_flops = models.FloatField(null=True, blank=True)
    note = models.CharField(max_length=300, blank=True, help_text="How the score was computed.")

    class Meta:
        app_label = "runs"
        ordering = ["track", "rank"]
        verbose_name_plural = "board entries"
        constraints = [
            models.UniqueConstraint(fields=["track", "run"], name="board_entry_unique"),
        ]
        indexes = [models.Index(fields=["track", "rank"], name="board_entry_rank")]

    def __str__(self) -> str:
        return f"{self.track_id} #{self.rank} run {self.run_id}"

    @property
    def label(self) -> str:
        return "verified" if self.verified else "unverified"


class BoardRankChange(models.Model):
    """A run entered, moved within, or left the first ``top_n`` ranks of a track (the feed's
    rows; the run's timeline has the same change as a ``board_rank_changed`` event)."""

    track = models.ForeignKey(BoardTrack, on_delete=models.CASCADE, related_name="rank_changes")
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="+")
    from_rank = models.PositiveIntegerField(null=True, blank=True)
    to_rank = models.PositiveIntegerField(null=True, blank=True)
    value = models.FloatField(null=True, blank=True)
    message = models.CharField(max_length=500)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        app_label = "runs"
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return self.message
