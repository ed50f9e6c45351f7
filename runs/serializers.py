"""API representations of runs/: recipes, plan previews and plans, runs with their events,
summaries and artifacts, and the shapes the runner's doors take (status, metric batches,
tracker imports)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from marin_site import api_input as policy
from runs.models import MetricSummary, Plan, Recipe, Run, RunArtifact, RunEvent, TrackerImport
from runs.services.recipes import RECIPE_FIELDS
from runs.specs.ablation import Plan as PlanPreview


class RecipeSerializer(policy.ModelSerializer):
    url = serializers.HyperlinkedIdentityField(view_name="recipe-detail")

    class Meta:
        model = Recipe
        # The fields the services write (one list), then what is read back.
        fields = ["id", "url", *RECIPE_FIELDS, "created_at", "updated_at"]
        read_only_fields = ["id", "created_at", "updated_at"]


class PlanPreviewRequestSerializer(policy.Serializer):
    recipe = serializers.PrimaryKeyRelatedField(queryset=Recipe.objects.all())
    baseline = serializers.DictField(required=False, default=dict)
    ablation_spec = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=64 * 1024 + 1
    )
    budget_accelerator_hours = serializers.FloatField(required=False, allow_null=True, min_value=0)


class PlanEntrySerializer(policy.Serializer):
    index = serializers.IntegerField()
    scale = serializers.CharField()
    seed = serializers.IntegerField(allow_null=True)
    overrides = serializers.DictField()
    config = serializers.DictField()
    config_hash = serializers.CharField()
    is_baseline = serializers.BooleanField()
    diff = serializers.DictField()
    flops = serializers.FloatField()
    accelerator_hours = serializers.FloatField()
    cost_formula = serializers.CharField()


class PlanSerializer(policy.Serializer):
    frozen = serializers.BooleanField()
    frozen_at = serializers.DateTimeField(allow_null=True)
    recipe = serializers.DictField()
    baseline = serializers.DictField()
    axes = serializers.ListField(child=serializers.CharField())
    run_count = serializers.IntegerField()
    total_flops = serializers.FloatField()
    total_accelerator_hours = serializers.FloatField()
    budget_accelerator_hours = serializers.FloatField(allow_null=True)
    over_budget = serializers.BooleanField()
    runs = PlanEntrySerializer(many=True)


def plan_data(plan: PlanPreview | Plan) -> dict[str, Any]:
    """One JSON shape for a live preview and a frozen plan."""
    if isinstance(plan, Plan):
        entries = [
            {
                "index": e.index,
                "scale": e.scale,
                "seed": e.seed,
                "overrides": e.overrides,
                "config": e.config,
                "config_hash": e.config_hash,
                "is_baseline": e.is_baseline,
                "diff": e.diff,
                "flops": e.flops,
                "accelerator_hours": e.accelerator_hours,
                "cost_formula": e.cost_formula,
            }
            for e in plan.entries.order_by("index")
        ]
        snapshot = plan.recipe_snapshot
        return {
            "frozen": True,
            "frozen_at": plan.frozen_at,
            "recipe": {
                "id": plan.recipe_id,
                "name": snapshot["name"],
                "version": snapshot["version"],
            },
            "baseline": plan.baseline,
            "axes": list((plan.spec or {}).get("axes", {})),
            "run_count": plan.run_count,
            "total_flops": plan.total_flops,
            "total_accelerator_hours": plan.total_accelerator_hours,
            "budget_accelerator_hours": plan.budget_accelerator_hours,
            "over_budget": plan.over_budget,
            "runs": entries,
        }
    return {
        "frozen": False,
        "frozen_at": None,
        "recipe": {"name": plan.recipe.name, "version": plan.recipe.version},
        "baseline": plan.baseline,
        "axes": plan.axis_names,
        "run_count": plan.run_count,
        "total_flops": plan.total_flops,
        "total_accelerator_hours": plan.total_accelerator_hours,
        "budget_accelerator_hours": plan.budget_accelerator_hours,
        "over_budget": plan.over_budget,
        "runs": [
            {
                "index": p.index,
                "scale": p.scale,
                "seed": p.seed,
                "overrides": p.overrides,
                "config": p.config,
                "config_hash": p.config_hash,
                "is_baseline": p.is_baseline,
                "diff": p.diff,
                "flops": p.cost.flops,
                "accelerator_hours": p.cost.accelerator_hours,
                "cost_formula": p.cost.formula,
            }
            for p in plan.points
        ],
    }


class MetricSummarySerializer(policy.ModelSerializer[MetricSummary]):
    class Meta:
        model = MetricSummary
        fields = ["key", "last", "min", "max", "step", "steady"]


class RunEventSerializer(policy.ModelSerializer[RunEvent]):
    actor = serializers.SerializerMethodField()

    class Meta:
        model = RunEvent
        fields = ["verb", "door", "from_state", "to_state", "message", "actor", "created_at"]

    def get_actor(self, event: RunEvent) -> str:
        return event.actor_label or (event.actor.get_username() if event.actor else "")


class RunSerializer(policy.ModelSerializer[Run]):
    plan_index = serializers.IntegerField(source="entry.index", read_only=True)
    scale = serializers.CharField(source="entry.scale", read_only=True)
    is_baseline = serializers.BooleanField(source="entry.is_baseline", read_only=True)

    class Meta:
        model = Run
        fields = [
            "id",
            "plan",
            "plan_index",
            "sequence",
            "scale",
            "is_baseline",
            "recipe_name",
            "recipe_version",
            "config_hash",
            "state",
            "failure_kind",
            "state_reason",
            "cached_from",
            "executor",
            "external_id",
            "attempt",
            "max_attempts",
            "accelerator_hours",
            "queued_at",
            "started_at",
            "finished_at",
            "heartbeat_at",
            "cancel_requested_at",
        ]
        read_only_fields = fields


class RunArtifactSerializer(policy.ModelSerializer[RunArtifact]):
    class Meta:
        model = RunArtifact
        fields = ["kind", "name", "uri", "step", "attempt", "created_at"]
        read_only_fields = fields


class RunDetailSerializer(RunSerializer):
    claimed_by = serializers.CharField(source="claimed_by.username", default=None, read_only=True)
    artifacts = RunArtifactSerializer(many=True, read_only=True)
    summaries = MetricSummarySerializer(many=True, read_only=True)
    events = RunEventSerializer(many=True, read_only=True)

    class Meta(RunSerializer.Meta):
        fields = [
            *RunSerializer.Meta.fields,
            "config",
            "command",
            "git_sha",
            "resources",
            "output_path",
            "wandb_url",
            "secret_env_names",
            "final_metrics",
            "tracker_config",
            "claimed_by",
            "claimed_at",
            "claim_where",
            "reported_config_hash",
            "config_mismatch",
            "artifacts",
            "summaries",
            "events",
        ]
        read_only_fields = fields


class RunStatusSerializer(policy.Serializer[Any]):
    state = serializers.ChoiceField(choices=["finished", "failed"])
    failure_kind = serializers.ChoiceField(
        choices=["", "config", "code", "oom"], required=False, default=""
    )
    message = serializers.CharField(required=False, default="", allow_blank=True, max_length=2000)


class TrackerImportSerializer(policy.Serializer[Any]):
    jsonl = serializers.CharField(max_length=1_000_000, trim_whitespace=False)

    @staticmethod
    def progress(upload: TrackerImport) -> dict[str, Any]:
        """An import as the API shows it: its state, progress and problems."""
        return {
            "id": upload.pk,
            "run": upload.run_id,
            "state": upload.state,
            "filename": upload.filename,
            "size_bytes": upload.size_bytes,
            "bytes_done": upload.bytes_done,
            "percent": upload.percent,
            "lines": upload.line_count,
            "lines_done": upload.lines_done,
            "points_written": upload.points_written,
            "points_skipped": upload.points_skipped,
            "error_count": upload.error_count,
            "errors": upload.errors,
            "message": upload.message,
            "created_at": upload.created_at.isoformat(),
            "finished_at": upload.finished_at.isoformat() if upload.finished_at else None,
        }


class MetricPointInSerializer(serializers.Serializer[Any]):
    """One point as a runner sends it (documentation; runs.metrics checks the batch)."""

    key = serializers.CharField(max_length=200)
    step = serializers.IntegerField(min_value=0)
    value = serializers.FloatField(help_text="finite; NaN and infinities are refused")
    time = serializers.FloatField(required=False, help_text="unix seconds; default: now")


class MetricBatchSerializer(serializers.Serializer[Any]):
    points = MetricPointInSerializer(many=True, help_text="at most 1000 points, 1 MB")
