"""Recipes (what can be trained) and frozen plans (what an approval launches).

``runs`` knows plans, not proposals: a proposal points at its frozen plan, never the
other way round.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.urls import reverse

from marin_site.events import TimelineEvent
from runs.specs.ablation import RecipeSpec
from runs.validators import EXECUTOR_NAME_MAX, slug_validator, validate_executor_name


class Recipe(models.Model):
    """A maintainer-registered training entrypoint with its overridable parameters."""

    name = models.CharField(max_length=63, validators=[slug_validator])
    version = models.CharField(max_length=32, default="1")
    title = models.CharField(max_length=200)
    description = models.TextField(blank=True, max_length=20_000)
    command_template = models.TextField(
        max_length=2_000,
        help_text=(
            "The command a runner executes, as arguments with placeholders (runs.specs.commands), "
            "e.g. '{python} -m marin.train --config {config_path} --lr {config.learning_rate}'."
        ),
    )
    launch = models.JSONField(
        default=dict,
        blank=True,
        help_text=(
            "How runs are launched besides the command: overrides (config_file, flags or env), "
            "flag_style, env_prefix, env, dry_run {append, drop}, trainings; see runs.specs.commands."
        ),
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
    executor = models.CharField(
        max_length=EXECUTOR_NAME_MAX,
        blank=True,
        validators=[validate_executor_name],
        help_text="Where this recipe's runs go: local, ray or pool:<name>; blank: the site's default.",
    )
    time_limit_seconds = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="How long one attempt of a run may take; blank: the site's RUNS_TIME_LIMIT_SECONDS.",
    )
    metrics = models.JSONField(
        default=list,
        blank=True,
        help_text=(
            "The metrics this recipe reports: a list of {key, unit, direction, display, "
            "column, summary, warmup_steps, logged_as}; see runs.metrics.declarations."
        ),
    )
    requires_labels = models.JSONField(
        default=list,
        blank=True,
        help_text=(
            "Labels a pool must have to run it (its own, or all of one agent's), e.g. "
            "gpu:a5000; empty: any pool."
        ),
    )
    verdict_rules = models.JSONField(
        default=list,
        blank=True,
        help_text=(
            "The verdict rules a proposal on this recipe may preregister: a list of "
            "{kind, <parameters>} (runs.verdicts.rules); empty: any rule."
        ),
    )
    resources = models.JSONField(
        default=dict,
        blank=True,
        help_text=(
            "What one job asks of a scheduler (Iris): tpu, gpu, cpu, memory, disk, region, "
            "zone, preemptible, priority, reserve, replicas; empty: its defaults."
        ),
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
        verbose_name = "plan entry"
        verbose_name_plural = "plan entries"
        ordering = ["plan", "index"]
        constraints = [
            models.UniqueConstraint(fields=["plan", "config_hash"], name="plan_entry_hash_unique"),
            models.UniqueConstraint(fields=["plan", "index"], name="plan_entry_index_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.plan_id}#{self.index} {self.config_hash[:12]}"


class PlanLaunch(models.Model):
    """That a plan was asked to run, with what it is judged against; one row per plan.

    The caller (a proposal's approval) passes its success criteria here, because ``runs``
    never reads proposals. The summary lands here when every run is terminal.
    """

    plan = models.OneToOneField(Plan, on_delete=models.CASCADE, related_name="launch")
    executor = models.CharField(max_length=EXECUTOR_NAME_MAX)
    command_template = models.TextField(
        max_length=2_000, help_text="The recipe's command as it was at launch."
    )
    launch_options = models.JSONField(
        default=dict, blank=True, help_text="The recipe's launch options as they were at launch."
    )
    time_limit_seconds = models.PositiveIntegerField(
        null=True, blank=True, help_text="The recipe's time limit as it was at launch."
    )
    requires_labels = models.JSONField(
        default=list,
        blank=True,
        help_text=(
            "The labels the recipe required at launch: only agents having them lease its runs."
        ),
    )
    git_ref = models.CharField(
        max_length=255,
        blank=True,
        help_text="The code version pinned at approval; every job gets it.",
    )
    git_repository = models.CharField(
        max_length=500,
        blank=True,
        help_text=(
            "The repository of the pinned commit (RUNS_CODE_REPOSITORY at launch): jobs run "
            "from a clean checkout of it at git_ref; blank: from the site's own tree."
        ),
    )
    criteria = models.JSONField(default=dict, blank=True)
    max_concurrent_runs = models.PositiveIntegerField(null=True, blank=True)
    launched_at = models.DateTimeField(auto_now_add=True)
    expanded_at = models.DateTimeField(null=True, blank=True)
    canceled_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    summary = models.JSONField(null=True, blank=True)

    class Meta:
        verbose_name = "plan launch"
        verbose_name_plural = "plan launches"

    def __str__(self) -> str:
        return f"launch of plan {self.plan_id} on {self.executor}"


class RunState(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"
    FAILED = "failed"
    KILLED = "killed"
    CRASHED = "crashed"


TERMINAL_RUN_STATES = frozenset(
    {RunState.FINISHED, RunState.FAILED, RunState.KILLED, RunState.CRASHED}
)


class FailureKind(models.TextChoices):
    NONE = "", "none"
    CONFIG = "config"
    CODE = "code"
    OOM = "oom"
    TIMEOUT = "timeout"
    INFRA = "infra"
    PREEMPTED = "preempted"


class RunOrigin(models.TextChoices):
    """Who ran it, which says how far its figures are vouched for: only a run the site
    launched itself (at the pinned commit) is verified; the others are shown as reported."""

    LAUNCHED = "launched", "launched by the site"
    CLAIMED = "claimed", "claimed and run elsewhere"  # by hand, or through MLflow's door
    IMPORTED = "imported", "imported from the project's past"


class Run(models.Model):
    """One point of a plan on one executor.

    Terminal states never change: a rerun or a retry is a new row for the same plan entry
    with the next ``sequence``. A preemption keeps the row and bumps ``attempt``.
    """

    plan = models.ForeignKey(Plan, on_delete=models.CASCADE, related_name="runs")
    entry = models.ForeignKey(PlanEntry, on_delete=models.CASCADE, related_name="runs")
    sequence = models.PositiveIntegerField(default=0)
    recipe_name = models.CharField(max_length=63)
    recipe_version = models.CharField(max_length=32)
    config = models.JSONField()
    config_hash = models.CharField(max_length=64)
    accelerator_hours = models.FloatField(default=0.0)
    state = models.CharField(max_length=16, choices=RunState.choices, default=RunState.QUEUED)
    failure_kind = models.CharField(
        max_length=16, choices=FailureKind.choices, default=FailureKind.NONE, blank=True
    )
    state_reason = models.TextField(blank=True)
    cached_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="cached_by"
    )
    command = models.TextField(blank=True)
    # A pool's run: what an agent leasing this attempt is told of it, filled when the
    # dispatcher offered it (``dispatch.run_offer_prepare``), so that the lease does not fill
    # it then; emptied when it is leased. JSON text, with the token's place held.
    offer = models.TextField(blank=True, editable=False)
    git_sha = models.CharField(
        max_length=255,
        blank=True,
        help_text="The pinned git ref; the full SHA once its checkout was made.",
    )
    git_clean = models.BooleanField(
        null=True,
        blank=True,
        help_text="Whether the job ran from a clean checkout of git_sha (unknown: not checked).",
    )
    executor = models.CharField(max_length=EXECUTOR_NAME_MAX, blank=True)
    external_id = models.CharField(max_length=255, blank=True)
    attempt = models.PositiveIntegerField(default=1)
    max_attempts = models.PositiveIntegerField(default=3)
    resources = models.JSONField(default=dict, blank=True)
    output_path = models.CharField(max_length=1000, blank=True)
    wandb_url = models.URLField(blank=True)
    secret_env_names = models.JSONField(default=list, blank=True)
    token_hash = models.CharField(max_length=64, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    heartbeat_timeout_seconds = models.PositiveIntegerField(default=300)
    time_limit_seconds = models.PositiveIntegerField(default=3600)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    queued_at = models.DateTimeField(auto_now_add=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    final_metrics = models.JSONField(default=dict, blank=True)
    tracker_config = models.JSONField(null=True, blank=True)
    tracker_tags = models.JSONField(
        default=dict, blank=True, help_text="Tags a tracker set on the run (MLflow's tags)."
    )
    tracker_artifacts = models.JSONField(
        default=list, blank=True, help_text="Artifacts a tracker reported: links, never files."
    )
    tracker_deleted_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When an MLflow client deleted the run: hidden from MLflow's searches only.",
    )
    origin = models.CharField(
        max_length=16, choices=RunOrigin.choices, default=RunOrigin.LAUNCHED, db_index=True
    )
    imported_from = models.CharField(
        max_length=500,
        blank=True,
        help_text="An imported run's source, as a canonical id (e.g. wandb:entity/project/id).",
    )
    # An external run: claimed by a person to execute by hand, elsewhere (runs/services/claims.py).
    claimed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    claimed_at = models.DateTimeField(null=True, blank=True)
    claim_where = models.CharField(
        max_length=200, blank=True, help_text="Where the claimant says it runs."
    )
    reported_config_hash = models.CharField(
        max_length=64, blank=True, help_text="The hash of the config the run says it used."
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["plan", "entry__index", "sequence"]
        constraints = [
            models.UniqueConstraint(fields=["entry", "sequence"], name="run_entry_sequence_unique")
        ]
        indexes = [
            models.Index(fields=["state", "executor"], name="run_state_executor_idx"),
            models.Index(
                fields=["recipe_name", "recipe_version", "config_hash", "state"],
                name="run_cache_lookup_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.state})"

    def get_absolute_url(self) -> str:
        return reverse("run-page", kwargs={"pk": self.pk})

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_RUN_STATES

    @property
    def config_mismatch(self) -> bool:
        """The run reported a config other than the plan's resolved one."""
        return bool(self.reported_config_hash) and self.reported_config_hash != self.config_hash


class MetricPoint(models.Model):
    # The primary key is (run, key, step): no surrogate id and no second index, so an
    # ingest writes one heap row and one index entry per point. No index of its own on run:
    # the primary key's index starts with it. (The admin cannot list composite keys.) No
    # foreign key in the database either: checking it per point cost as much as the rest of
    # an ingest. Points are written only for a run the token check just loaded, and Django
    # still deletes them with their run.
    pk = models.CompositePrimaryKey("run", "key", "step")
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="points", db_index=False, db_constraint=False
    )
    key = models.CharField(max_length=200)
    step = models.BigIntegerField()
    value = models.FloatField()
    time = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.run_id} {self.key}@{self.step}={self.value}"


class MetricSummary(models.Model):
    """Per-key last, min and max, kept as points arrive so tables never scan points; for
    throughput keys also the steady-state median (``runs.metrics.steady``)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="summaries")
    key = models.CharField(max_length=200)
    last = models.FloatField()
    steady = models.FloatField(
        null=True,
        blank=True,
        help_text="Throughput keys: the median of the points after the recipe's warm-up.",
    )
    min = models.FloatField()
    max = models.FloatField()
    step = models.BigIntegerField(help_text="The step of ``last``: the highest step seen.")
    count = models.BigIntegerField(default=0)
    stale_from = models.BigIntegerField(
        null=True,
        blank=True,
        help_text="The lowest step written since the key's MetricSeries was last refreshed.",
    )

    class Meta:
        verbose_name = "metric summary"
        verbose_name_plural = "metric summaries"
        ordering = ["run", "key"]
        constraints = [models.UniqueConstraint(fields=["run", "key"], name="metric_summary_unique")]
        indexes = [
            models.Index(
                fields=["run"],
                condition=models.Q(stale_from__isnull=False),
                name="metric_summary_stale_idx",
            )
        ]

    def __str__(self) -> str:
        return f"{self.run_id} {self.key} last={self.last}"


class MetricFlag(models.Model):
    """A key of a run whose logged values do not fit its recipe's declaration (a fraction
    above 1, a percent above 100): its points are stored as logged and flagged, once per key.
    The declaration may be the mistake: when the stored values fit the recipe's declaration
    again (a maintainer corrected it), the flag is resolved (``runs.metrics.flags``). The
    plan's verdict leaves a flagged key's value out until then."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metric_flags")
    key = models.CharField(max_length=200)
    reason = models.CharField(max_length=500)
    step = models.BigIntegerField(help_text="The first step whose value did not fit.")
    value = models.FloatField()
    unit = models.CharField(max_length=20, help_text="The unit it was checked against.")
    created_at = models.DateTimeField(auto_now_add=True)
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "key"]
        constraints = [models.UniqueConstraint(fields=["run", "key"], name="metric_flag_unique")]

    def __str__(self) -> str:
        return f"{self.run_id} {self.key}: {self.reason}"


class MetricSeries(models.Model):
    """A key's downsampled series: fixed-width step buckets (count, sum, min, max, last
    step), packed, so that charts never read points. Kept by ``runs.series``."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="series", db_index=False)
    key = models.CharField(max_length=200)
    origin = models.BigIntegerField(
        help_text="The lowest step: bucket i starts at origin + i*width."
    )
    width = models.BigIntegerField(help_text="Steps per bucket, a power of two.")
    span = models.BigIntegerField(help_text="The last bucket's number + 1.")
    buckets = models.BinaryField(help_text="Packed arrays that charts read; see runs.series.")
    coarse = models.BinaryField(help_text="The same, four buckets in one: for short reads.")
    extremes = models.BinaryField(help_text="Packed steps of each bucket's min and max.")
    refreshed_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "metric series"
        verbose_name_plural = "metric series"
        constraints = [models.UniqueConstraint(fields=["run", "key"], name="metric_series_unique")]

    def __str__(self) -> str:
        return f"{self.run_id} {self.key} every {self.width} steps"


class RunArtifact(models.Model):
    """A link a run reported: its W&B run, a checkpoint's location, any other artifact."""

    class Kind(models.TextChoices):
        WANDB = "wandb"
        CHECKPOINT = "checkpoint"
        LINK = "link"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="artifacts")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    name = models.CharField(max_length=200, blank=True)
    uri = models.CharField(max_length=1000)
    step = models.BigIntegerField(null=True, blank=True)
    attempt = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "pk"]
        constraints = [
            models.UniqueConstraint(fields=["run", "kind", "uri"], name="run_artifact_unique")
        ]

    def __str__(self) -> str:
        return f"{self.run_id} {self.kind} {self.uri[:60]}"


class RunEvent(TimelineEvent):
    """Append-only timeline of a run: who, what, from and to, when, through which door."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")

    class Meta(TimelineEvent.Meta):
        pass

    def __str__(self) -> str:
        return f"{self.run_id} {self.verb} {self.from_state}->{self.to_state}"


class TrackerImportState(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class TrackerImport(models.Model):
    """One ``tracker_metrics.jsonl`` given to a run: checked as it arrived, stored in chunks,
    imported by a task (``runs.trackers.jsonl``) that reports its progress here."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="tracker_imports")
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_label = models.CharField(max_length=100, blank=True)
    door = models.CharField(max_length=16)
    filename = models.CharField(max_length=255, blank=True)
    state = models.CharField(
        max_length=16, choices=TrackerImportState.choices, default=TrackerImportState.PENDING
    )
    size_bytes = models.BigIntegerField(default=0)
    line_count = models.BigIntegerField(default=0)
    sha256 = models.CharField(max_length=64, blank=True)
    bytes_done = models.BigIntegerField(default=0)
    lines_done = models.BigIntegerField(default=0)
    points_written = models.BigIntegerField(default=0)
    points_skipped = models.BigIntegerField(default=0)
    error_count = models.PositiveIntegerField(default=0)
    errors = models.JSONField(default=list, blank=True, help_text="The first problems, by line.")
    message = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"import {self.pk} into run {self.run_id} ({self.state})"

    @property
    def percent(self) -> int:
        if not self.size_bytes:
            return 100 if self.state == TrackerImportState.DONE else 0
        return max(0, min(100, int(100 * self.bytes_done / self.size_bytes)))


class TrackerImportChunk(models.Model):
    """A piece of an upload as it arrived (about 1 MB), so a worker on any machine reads it
    from the database; deleted once imported."""

    tracker_import = models.ForeignKey(
        TrackerImport, on_delete=models.CASCADE, related_name="chunks"
    )
    index = models.PositiveIntegerField()
    data = models.BinaryField()

    class Meta:
        ordering = ["tracker_import", "index"]
        constraints = [
            models.UniqueConstraint(
                fields=["tracker_import", "index"], name="tracker_import_chunk_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.tracker_import_id}#{self.index}"


class RecipeEvent(TimelineEvent):
    """Append-only history of a recipe: created, edited (on the site, the API or the admin)."""

    recipe = models.ForeignKey(Recipe, on_delete=models.CASCADE, related_name="events")

    class Meta(TimelineEvent.Meta):
        pass

    def __str__(self) -> str:
        return f"{self.recipe_id} {self.verb}"


# Alerts live in runs/alerts/, campaigns in runs/campaigns/, pools, agents and leases in
# runs/pools/, board tracks in runs/board/; imported here so Django registers them.
from runs.alerts.models import Alert, AlertRule, AlertWatch  # noqa: E402, F401
from runs.board.models import BoardTrack  # noqa: E402, F401
from runs.campaigns.models import Campaign, CampaignRun, Intervention  # noqa: E402, F401
from runs.pools.models import Agent, Lease, Pool, RegistrationToken  # noqa: E402, F401


class DryRunState(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class DryRun(models.Model):
    """A recipe script run in its plan-only mode (``launch.dry_run``) on a CPU, before
    approval: its output (the steps, FLOPs and cost it says it would spend) sits beside the
    site's own estimate. ``subject`` names what it was asked for (``proposal-12``), as runs
    never read proposals."""

    recipe = models.ForeignKey(Recipe, on_delete=models.PROTECT, related_name="dry_runs")
    subject = models.CharField(max_length=100, db_index=True)
    config = models.JSONField(default=dict)
    command = models.TextField(blank=True)
    executor = models.CharField(max_length=EXECUTOR_NAME_MAX, default="local")
    external_id = models.CharField(max_length=255, blank=True)
    state = models.CharField(max_length=16, choices=DryRunState.choices, default=DryRunState.QUEUED)
    reason = models.TextField(blank=True)
    output = models.TextField(blank=True)
    figures = models.JSONField(
        default=dict, blank=True, help_text="What the script said it would run: steps, flops, cost."
    )
    estimate = models.JSONField(
        default=dict,
        blank=True,
        help_text="The site's own estimate then: flops, accelerator_hours.",
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"dry run {self.pk} of {self.subject} ({self.state})"
