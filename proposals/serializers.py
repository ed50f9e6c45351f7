"""API representations of proposals, reviews, comments and timeline events."""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from marin_site import api_input as policy
from marin_site.fragments import Fragments, pk_url
from proposals import selectors
from proposals.actions import allowed_action_names, allowed_actions
from proposals.markdown import render_markdown
from proposals.models import Comment, Confidence, Direction, Outcome, Proposal, Review
from runs.models import Recipe


class SuccessCriteriaSerializer(policy.Serializer):
    metric = serializers.CharField(max_length=200, allow_blank=True)
    direction = serializers.ChoiceField(choices=Direction.choices)
    threshold = serializers.FloatField(allow_null=True)


class LabelsField(serializers.ListField):
    """Label names in and out; stored as Label rows (prefetched by the selectors)."""

    def to_representation(self, data: Any) -> list[str]:
        return [label.name for label in data.all()]


class OptionalURLField(serializers.URLField):
    """A link the proposal may not have: ``null`` in and out when there is none (the column
    keeps ``""``), so a reader never meets an empty string where the schema says URL."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(allow_null=True, allow_blank=True, required=False, **kwargs)

    def validate_empty_values(self, data: Any) -> tuple[bool, Any]:
        if data is None or data == "":
            return (True, "")
        return super().validate_empty_values(data)

    def to_representation(self, value: str) -> Any:
        return value or None


class OptionalChoiceField(serializers.ChoiceField):
    """A choice not made yet: ``null`` rather than an empty string outside the enum."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(allow_null=True, read_only=True, **kwargs)

    def to_representation(self, value: str) -> Any:
        return value or None


class ProposalSerializer(policy.ModelSerializer):
    """What the API shows of a proposal (and accepts, for the writable fields)."""

    url = serializers.HyperlinkedIdentityField(view_name="proposal-detail")
    html_url = serializers.SerializerMethodField()
    recipe = serializers.PrimaryKeyRelatedField(queryset=Recipe.objects.filter(is_active=True))
    recipe_name = serializers.CharField(source="recipe.name", read_only=True)
    recipe_version = serializers.CharField(source="recipe.version", read_only=True)
    author = serializers.CharField(source="author.username", read_only=True)
    labels = LabelsField(child=serializers.CharField(max_length=50), max_length=20, required=False)
    description_html = serializers.SerializerMethodField()
    baseline = serializers.DictField(required=False)
    review_count = serializers.IntegerField(read_only=True, required=False)
    average_score = serializers.FloatField(read_only=True, required=False, allow_null=True)
    plan_id = serializers.IntegerField(read_only=True, allow_null=True)
    allowed_actions = serializers.SerializerMethodField()
    pr_url = OptionalURLField(max_length=500)
    wandb_url = OptionalURLField(max_length=500)
    data_browser_url = OptionalURLField(max_length=500)
    # Read from the linked GitHub issue (proposals/github/body.py): shown, set there.
    experiment_json_url = OptionalURLField(max_length=500, read_only=True)
    outcome = OptionalChoiceField(choices=Outcome.choices)
    confidence = OptionalChoiceField(choices=Confidence.choices)

    class Meta:
        model = Proposal
        fields = [
            "id",
            "url",
            "html_url",
            "title",
            "summary",
            "description",
            "description_html",
            "hypothesis",
            "success_metric",
            "success_direction",
            "success_threshold",
            "verdict_rule",
            "recipe",
            "recipe_name",
            "recipe_version",
            "baseline",
            "ablation_spec",
            "budget_accelerator_hours",
            "pr_url",
            "branch",
            "wandb_url",
            "data_browser_url",
            "experiment_json_url",
            "results",
            "submitter_name",
            "submitter_affiliation",
            "submitter_link",
            "github_issue_number",
            "labels",
            "author",
            "state",
            "state_reason",
            "outcome",
            "conclusion",
            "confidence",
            "approved_hypothesis",
            "approved_criteria",
            "git_ref",
            "plan_id",
            "review_count",
            "average_score",
            "on_hold",
            "allowed_actions",
            "created_at",
            "updated_at",
            "submitted_at",
            "decided_at",
            "concluded_at",
        ]
        read_only_fields = [
            "results",
            "submitter_name",
            "submitter_affiliation",
            "submitter_link",
            "github_issue_number",
            "state",
            "on_hold",
            "state_reason",
            "outcome",
            "conclusion",
            "confidence",
            "approved_hypothesis",
            "approved_criteria",
            "git_ref",
            "created_at",
            "updated_at",
            "submitted_at",
            "decided_at",
            "concluded_at",
        ]

    def get_html_url(self, obj: Proposal) -> str:
        request = self.context.get("request")
        path = reverse("proposals:detail", kwargs={"pk": obj.pk})
        return request.build_absolute_uri(path) if request else path

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_allowed_actions(self, obj: Proposal) -> list[str]:
        """What the requesting user may do to this proposal now (``proposals.actions``)."""
        request = self.context.get("request")
        user = getattr(request, "user", None)
        return [action.name for action in allowed_actions(obj, user)] if user else []

    @extend_schema_field(serializers.CharField())
    def get_description_html(self, obj: Proposal) -> str:
        return str(render_markdown(obj.description))


# The fields that depend on the request (its host, its user): never kept in a fragment.
REQUEST_FIELDS = ("url", "html_url", "allowed_actions")


class SharedProposalSerializer(ProposalSerializer):
    """A proposal's fields that are the same for every reader: ``ProposalSerializer`` without
    ``REQUEST_FIELDS``, for the cached rows of the list (``proposal_list_data``)."""

    url = None  # type: ignore[assignment]
    html_url = None  # type: ignore[assignment]
    allowed_actions = None  # type: ignore[assignment]

    class Meta(ProposalSerializer.Meta):
        fields = [f for f in ProposalSerializer.Meta.fields if f not in REQUEST_FIELDS]


def proposal_list_data(*, pks: list[int], request: Any) -> list[dict[str, Any]]:
    """The API list's rows of these proposals, in order, exactly as ``ProposalSerializer``
    writes them: the fields shared by every reader from the fragment cache while the
    proposal's version is current (the rows of the others are loaded after the versions were
    read, and serialised); the links built from one reversed URL each; the reader's
    ``allowed_actions`` from the state, hold, plan and author kept beside each row
    (``allowed_action_names``)."""
    fragments = Fragments({f"proposal-api:{pk}": [("proposal", pk)] for pk in pks})
    missing = [pk for pk in pks if fragments.get(f"proposal-api:{pk}") is None]
    if missing:
        for obj in selectors.proposal_list().filter(pk__in=missing):
            shared = dict(SharedProposalSerializer(obj).data)
            fragments.put(
                f"proposal-api:{obj.pk}",
                {"data": shared, "author_id": obj.author_id, "recipe_id": obj.recipe_id},
            )
    api_url = pk_url("proposal-detail", request)
    html_url = pk_url("proposals:detail", request)
    user = getattr(request, "user", None)
    rows = []
    for pk in pks:
        entry = fragments.get(f"proposal-api:{pk}")
        if entry is None:  # deleted since the page was counted
            continue
        shared = entry["data"]
        # What the reader may do, from the state, hold, plan and author kept beside the row.
        actions = (
            allowed_action_names(
                user,
                pk=pk,
                state=shared["state"],
                on_hold=shared["on_hold"],
                plan_id=shared["plan_id"],
                author_id=entry["author_id"],
                recipe_id=entry.get("recipe_id"),
            )
            if user is not None
            else []
        )
        per_request = {
            "url": api_url(pk),
            "html_url": html_url(pk),
            "allowed_actions": actions,
        }
        rows.append({f: per_request[f] if f in per_request else shared[f] for f in FIELDS})
    fragments.save()
    return rows


FIELDS = ProposalSerializer.Meta.fields


class TransitionSerializer(policy.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, max_length=10_000, default="")
    git_ref = serializers.CharField(required=False, allow_blank=True, max_length=255, default="")
    executor = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=100,
        default="",
        help_text="approve: where the runs go (local, ray, pool:<name>...); blank: the recipe's",
    )
    dry_run_override = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=2000,
        default="",
        help_text="approve: why approve although the latest dry run failed (recorded)",
    )


class OutcomeSerializer(policy.Serializer):
    outcome = serializers.ChoiceField(choices=Outcome.choices)
    conclusion = serializers.CharField(allow_blank=True, max_length=64 * 1024)
    confidence = serializers.ChoiceField(choices=Confidence.choices)
    without_results_reason = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=10_000,
        help_text="Required while the plan's runs are not all terminal: why the verdict "
        "cannot wait for the results.",
    )
    # An imported old issue's result, found before the site: its key figures and links.
    results = serializers.CharField(
        required=False, allow_blank=True, max_length=64 * 1024, help_text="Key figures (Markdown)."
    )
    wandb_url = serializers.URLField(required=False, allow_blank=True, max_length=500)
    data_browser_url = serializers.URLField(required=False, allow_blank=True, max_length=500)


class ReviewSerializer(policy.ModelSerializer):
    reviewer = serializers.CharField(source="reviewer.username", read_only=True)
    proposal = serializers.PrimaryKeyRelatedField(queryset=Proposal.objects.all())

    class Meta:
        model = Review
        fields = [
            "id",
            "proposal",
            "reviewer",
            "score",
            "recommendation",
            "text",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["id", "reviewer", "created_at", "updated_at"]


class CommentSerializer(policy.ModelSerializer):
    author = serializers.SerializerMethodField()
    proposal = serializers.PrimaryKeyRelatedField(queryset=Proposal.objects.all())
    body_html = serializers.SerializerMethodField()

    class Meta:
        model = Comment
        fields = ["id", "proposal", "author", "body", "body_html", "created_at", "updated_at"]
        read_only_fields = ["id", "author", "created_at", "updated_at"]

    def get_author(self, obj: Comment) -> str:
        return obj.author.username if obj.author else obj.author_label

    @extend_schema_field(serializers.CharField())
    def get_body_html(self, obj: Comment) -> str:
        return str(render_markdown(obj.body))


class TimelineEntrySerializer(policy.Serializer):
    """A row of a proposal's timeline (``proposals.selectors.TimelineEntry``): the proposal's
    own events, and its runs' events with ``run`` set."""

    kind = serializers.ChoiceField(choices=["proposal", "run"])
    id = serializers.IntegerField()
    run = serializers.IntegerField(allow_null=True)
    verb = serializers.CharField()
    actor = serializers.CharField()
    from_state = serializers.CharField()
    to_state = serializers.CharField()
    message = serializers.CharField()
    door = serializers.CharField()
    created_at = serializers.DateTimeField()
