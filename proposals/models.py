"""Proposals, their reviews, comments, amendments and the append-only timeline."""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.search import SearchVectorField
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.urls import reverse

from marin_site.events import TimelineEvent
from runs.models import Plan, Recipe

MAX_MARKDOWN = 64 * 1024
METRIC_KEY = RegexValidator(
    r"^[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*$",
    "A metric key is words separated by '/', e.g. eval/paloma/macro_loss.",
)
LABEL_NAME = RegexValidator(
    r"^[a-z0-9][a-z0-9:._-]{0,49}$",
    "A label is lowercase letters, digits and ':._-', at most 50 characters.",
)


class State(models.TextChoices):
    DRAFT = "draft", "Draft"
    SUBMITTED = "submitted", "Submitted"
    CHANGES_REQUESTED = "changes_requested", "Changes requested"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    WITHDRAWN = "withdrawn", "Withdrawn"
    CANCELED = "canceled", "Canceled"
    # An old GitHub issue brought in by ``manage.py github_backfill``: a quiet mirror, outside
    # the review lifecycle, that writes nothing to GitHub until a maintainer adopts it.
    IMPORTED = "imported", "Imported"


class Outcome(models.TextChoices):
    WORKED = "worked", "Worked"
    PROMISING = "promising", "Promising"
    MIXED = "mixed", "Mixed"
    DID_NOT_WORK = "did_not_work", "Did not work"
    INCONCLUSIVE = "inconclusive", "Inconclusive"
    NOT_EVALUATED = "not_evaluated", "Not evaluated"


class Confidence(models.TextChoices):
    EXPLORATORY = "exploratory", "Exploratory"
    REPLICATED = "replicated", "Replicated"
    STABLE = "stable", "Stable"


class Direction(models.TextChoices):
    LOWER = "lower", "Lower is better"
    HIGHER = "higher", "Higher is better"


class Label(models.Model):
    name = models.CharField(max_length=50, unique=True, validators=[LABEL_NAME])

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Proposal(models.Model):
    title = models.CharField(max_length=200)
    summary = models.CharField("one-line summary", max_length=300)
    description = models.TextField(blank=True, max_length=MAX_MARKDOWN)
    hypothesis = models.TextField(blank=True, max_length=MAX_MARKDOWN)
    success_metric = models.CharField(max_length=200, blank=True, validators=[METRIC_KEY])
    success_direction = models.CharField(
        max_length=10, choices=Direction.choices, default=Direction.LOWER
    )
    success_threshold = models.FloatField(
        null=True,
        blank=True,
        help_text="The smallest improvement over the baseline that counts as success.",
    )
    # The verdict rule and its parameters ({kind, ...}: runs.verdicts.rules), preregistered
    # with the criteria; it reaches the launch in ``criteria["rule"]``.
    verdict_rule = models.JSONField(null=True, blank=True)
    recipe = models.ForeignKey(Recipe, on_delete=models.PROTECT, related_name="proposals")
    baseline = models.JSONField(default=dict, blank=True)
    ablation_spec = models.TextField(blank=True, max_length=64 * 1024)
    budget_accelerator_hours = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0)]
    )
    pr_url = models.URLField("pull request", max_length=500, blank=True)
    branch = models.CharField(max_length=255, blank=True)
    wandb_url = models.URLField("W&B report", max_length=500, blank=True)
    data_browser_url = models.URLField("data browser", max_length=500, blank=True)
    labels = models.ManyToManyField(Label, blank=True, related_name="proposals")
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="proposals"
    )

    state = models.CharField(
        max_length=20, choices=State.choices, default=State.DRAFT, db_index=True
    )
    state_reason = models.TextField(blank=True, max_length=10_000)
    submitted_at = models.DateTimeField(null=True, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)

    # The preregistration as approved; later edits become amendments beside it.
    plan = models.OneToOneField(
        Plan, null=True, blank=True, on_delete=models.PROTECT, related_name="proposal"
    )
    approved_hypothesis = models.TextField(blank=True)
    approved_criteria = models.JSONField(null=True, blank=True)
    git_ref = models.CharField("pinned git ref", max_length=255, blank=True)

    outcome = models.CharField(
        max_length=20, choices=Outcome.choices, blank=True, default="", db_index=True
    )
    conclusion = models.TextField(blank=True, max_length=MAX_MARKDOWN)
    confidence = models.CharField(max_length=20, choices=Confidence.choices, blank=True)
    concluded_at = models.DateTimeField(null=True, blank=True)

    # Read from a GitHub issue: its `## Results`, and the community form's submitter fields.
    results = models.TextField(blank=True, max_length=MAX_MARKDOWN)
    submitter_name = models.CharField(max_length=200, blank=True)
    submitter_affiliation = models.CharField(max_length=300, blank=True)
    submitter_link = models.CharField(max_length=500, blank=True)
    experiment_json_url = models.URLField("experiment JSON", max_length=500, blank=True)
    # A maintainer's hold (`/hold`): not a state, a flag that blocks approval while set.
    on_hold = models.BooleanField(default=False)

    # The linked GitHub issue (see proposals/github/).
    github_issue_number = models.PositiveIntegerField(null=True, blank=True, unique=True)
    github_issue_node_id = models.CharField(max_length=100, blank=True)
    github_status_comment_id = models.BigIntegerField(null=True, blank=True)
    github_updated_at = models.DateTimeField(
        null=True, blank=True, help_text="The issue's updated_at when its body was last read."
    )
    github_sections = models.JSONField(
        default=dict, blank=True, help_text="The issue's sections as last applied."
    )
    # What an imported issue carried (proposals/github/backfill.py): its parent issue (a
    # sub-issue of a tracker), its dates on GitHub, and the mirror's facts (author login and
    # id, every label as GitHub names it, its comment count, comments refused).
    github_parent_number = models.PositiveIntegerField(null=True, blank=True)
    github_created_at = models.DateTimeField(null=True, blank=True)
    github_closed_at = models.DateTimeField(null=True, blank=True)
    github_mirror = models.JSONField(default=dict, blank=True)

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Full-text search on PostgreSQL: a trigger keeps it and a GIN index serves it, both made
    # by migration 0003 on PostgreSQL only. Unused (NULL) on SQLite; see proposals/search.py.
    search_vector = SearchVectorField(null=True, editable=False)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["state", "-created_at"], name="proposal_state_created"),
            models.Index(fields=["outcome", "-created_at"], name="proposal_outcome_created"),
        ]

    def __str__(self) -> str:
        return self.title

    def get_absolute_url(self) -> str:
        return reverse("proposals:detail", kwargs={"pk": self.pk})

    @property
    def criteria(self) -> dict[str, object]:
        criteria: dict[str, object] = {
            "metric": self.success_metric,
            "direction": self.success_direction,
            "threshold": self.success_threshold,
        }
        if self.verdict_rule:
            criteria["rule"] = self.verdict_rule
        return criteria

    @property
    def is_frozen(self) -> bool:
        return self.plan_id is not None


class Review(models.Model):
    class Recommendation(models.TextChoices):
        APPROVE = "approve", "Approve"
        REQUEST_CHANGES = "request_changes", "Request changes"
        REJECT = "reject", "Reject"

    proposal = models.ForeignKey(Proposal, on_delete=models.CASCADE, related_name="reviews")
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="reviews"
    )
    score = models.PositiveSmallIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(5)]
    )
    recommendation = models.CharField(max_length=20, choices=Recommendation.choices)
    text = models.TextField(max_length=MAX_MARKDOWN)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["proposal", "reviewer"], name="one_review_per_reviewer"
            ),
            models.CheckConstraint(
                condition=models.Q(score__gte=1, score__lte=5), name="review_score_1_to_5"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.reviewer} on {self.proposal_id}: {self.score}/5"


class Comment(models.Model):
    proposal = models.ForeignKey(Proposal, on_delete=models.CASCADE, related_name="comments")
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="proposal_comments",
    )
    author_label = models.CharField(max_length=100, blank=True)
    body = models.TextField(max_length=MAX_MARKDOWN)
    # The GitHub comment this row mirrors (either way); unique, so a comment arriving twice
    # under two delivery ids is stored once.
    github_comment_id = models.BigIntegerField(null=True, blank=True, unique=True)
    github_updated_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"comment {self.pk} on {self.proposal_id}"


class Amendment(models.Model):
    """A dated change to the preregistration after approval; the approved text stays."""

    proposal = models.ForeignKey(Proposal, on_delete=models.CASCADE, related_name="amendments")
    field = models.CharField(max_length=50)
    old_value = models.TextField(blank=True)
    new_value = models.TextField(blank=True)
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"amendment to {self.field} of {self.proposal_id}"


class Event(TimelineEvent):
    """An append-only timeline row: who did what, from and to, when, through which door."""

    proposal = models.ForeignKey(Proposal, on_delete=models.CASCADE, related_name="events")

    class Meta(TimelineEvent.Meta):
        pass

    def __str__(self) -> str:
        return f"{self.verb} on {self.proposal_id} by {self.actor_label or self.actor_id}"


class OutboxState(models.TextChoices):
    PENDING = "pending", "Pending"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"


class OutboxOperation(models.TextChoices):
    ISSUE_CREATE = "issue_create", "Create the issue"
    BODY_SYNC = "body_sync", "Update the managed block of the issue body"
    STATUS_SYNC = "status_sync", "Create or edit the status comment"
    LABELS_SYNC = "labels_sync", "Set the state labels"
    COMMENT_CREATE = "comment_create", "Post a comment"


class GitHubOutbox(models.Model):
    """One write to GitHub, stored with the change that caused it and sent after commit.

    Rows of one proposal are sent one at a time in id order (writes to one issue keep their
    order). ``idempotency_key`` is unique: enqueueing the same cause twice stores one row.
    """

    proposal = models.ForeignKey(Proposal, on_delete=models.CASCADE, related_name="github_outbox")
    operation = models.CharField(max_length=20, choices=OutboxOperation.choices)
    payload = models.JSONField(default=dict, blank=True)
    idempotency_key = models.CharField(max_length=200, unique=True)
    state = models.CharField(
        max_length=10, choices=OutboxState.choices, default=OutboxState.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    leased_until = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    result = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        verbose_name = "GitHub outbox row"
        indexes = [
            models.Index(fields=["state", "proposal", "id"], name="outbox_state_proposal"),
        ]

    def __str__(self) -> str:
        return f"{self.operation} for proposal {self.proposal_id} ({self.state})"


class WebhookDelivery(models.Model):
    """A GitHub webhook delivery, stored by its X-GitHub-Delivery id before any work."""

    class Outcome(models.TextChoices):
        PENDING = "pending", "Pending"
        APPLIED = "applied", "Applied"
        IGNORED = "ignored", "Ignored"
        FAILED = "failed", "Failed"

    delivery_id = models.CharField(max_length=100, unique=True)
    event = models.CharField(max_length=50)
    action = models.CharField(max_length=50, blank=True)
    # The JSON body exactly as GitHub signed it (a NUL escape aside: ``delivery_store``), so
    # the signature can still be checked; stored as text, not jsonb: PostgreSQL copies it
    # instead of parsing it on the webhook's path, and the drain parses it once.
    body = models.TextField()
    received_at = models.DateTimeField(auto_now_add=True, db_index=True)
    processed_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=10, choices=Outcome.choices, default=Outcome.PENDING)
    detail = models.TextField(blank=True)

    class Meta:
        ordering = ["-received_at", "-id"]
        verbose_name_plural = "webhook deliveries"
        indexes = [
            # What the drain asks for, oldest first. Partial, so it holds only what is
            # pending: the drain's query stays a short ordered scan however many deliveries
            # were processed (an index on outcome made it walk every processed one).
            models.Index(
                fields=["received_at", "id"],
                name="webhook_delivery_pending",
                condition=models.Q(outcome="pending"),
            )
        ]

    def __str__(self) -> str:
        return f"{self.event}.{self.action} {self.delivery_id} ({self.outcome})"


class GitHubBackfill(models.Model):
    """Where ``manage.py github_backfill`` of one repository stands: an interrupted run
    continues from here, and a finished one is the ``since`` of the next."""

    repository = models.CharField(max_length=200, unique=True)
    labels = models.JSONField(default=list, blank=True)
    phase = models.CharField(max_length=20, default="issues")
    label_index = models.PositiveIntegerField(default=0)
    page = models.PositiveIntegerField(default=1)
    since = models.DateTimeField(null=True, blank=True, help_text="the last finished run's start")
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    counts = models.JSONField(default=dict, blank=True)

    class Meta:
        verbose_name = "GitHub backfill"

    def __str__(self) -> str:
        return f"backfill of {self.repository} ({self.phase})"


class GitHubRoleGrant(models.Model):
    """A role given through GITHUB_MAINTAINERS / GITHUB_REVIEWERS, bound to the GitHub
    user id the configured login had when it was resolved (proposals/github/accounts.py).

    A login is only a name: it can be renamed, freed and taken by someone else, and compares
    in any letter case. The id cannot, so the role follows the id."""

    role = models.CharField(max_length=20)
    login = models.CharField(max_length=100, help_text="as configured, lowercased")
    github_id = models.BigIntegerField(null=True, blank=True)
    checked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "GitHub role grant"
        verbose_name_plural = "GitHub role grants"
        constraints = [
            models.UniqueConstraint(fields=["role", "login"], name="github_role_grant_unique")
        ]

    def __str__(self) -> str:
        return f"{self.role}: {self.login} ({self.github_id or 'unresolved'})"


class PendingIssue(models.Model):
    """An experiment issue that could not become a proposal yet (no recipe, or one it names
    that the site does not have): kept with its latest payload, and imported when a recipe
    appears (``proposals.github.issues.pending_issues_import``)."""

    number = models.PositiveIntegerField(unique=True)
    issue = models.JSONField(help_text="The issue as the latest delivery about it carried it.")
    reason = models.TextField(blank=True)
    received_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["number"]

    def __str__(self) -> str:
        return f"pending issue #{self.number}"


class Follow(models.Model):
    """A signed-in user following a proposal or a campaign (exactly one of the two): mailed
    on its state changes, results, alerts and interventions (``proposals.follows``) until
    they unfollow or unsubscribe from a mail."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="follows"
    )
    proposal = models.ForeignKey(
        Proposal, null=True, blank=True, on_delete=models.CASCADE, related_name="follows"
    )
    campaign = models.ForeignKey(
        "runs.Campaign", null=True, blank=True, on_delete=models.CASCADE, related_name="follows"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["user", "proposal"], name="follow_once"),
            models.UniqueConstraint(fields=["user", "campaign"], name="follow_campaign_once"),
            models.CheckConstraint(
                condition=models.Q(proposal__isnull=False, campaign__isnull=True)
                | models.Q(proposal__isnull=True, campaign__isnull=False),
                name="follow_one_thing",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user_id} follows {self.proposal_id or f'campaign {self.campaign_id}'}"


class Notice(models.Model):
    """Something the followers of a proposal or of a campaign are told, stored with the
    change that caused it (``key`` is unique: the same cause twice is one notice) and mailed
    by a task after commit."""

    proposal = models.ForeignKey(
        Proposal, null=True, blank=True, on_delete=models.CASCADE, related_name="notices"
    )
    campaign = models.ForeignKey(
        "runs.Campaign", null=True, blank=True, on_delete=models.CASCADE, related_name="notices"
    )
    key = models.CharField(max_length=200, unique=True)
    subject = models.CharField(max_length=300)
    body = models.TextField(max_length=20_000)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True, help_text="Every follower was mailed.")

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [
            models.Index(
                fields=["created_at"],
                name="notice_unsent",
                condition=models.Q(sent_at__isnull=True),
            )
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(proposal__isnull=False, campaign__isnull=True)
                | models.Q(proposal__isnull=True, campaign__isnull=False),
                name="notice_one_thing",
            )
        ]

    def __str__(self) -> str:
        return f"notice {self.key}"


class NoticeDelivery(models.Model):
    """That one follower was mailed one notice: claimed before the mail is sent, so a task
    run twice (or retried) mails nobody twice."""

    notice = models.ForeignKey(Notice, on_delete=models.CASCADE, related_name="deliveries")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    sent_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "notice deliveries"
        constraints = [
            models.UniqueConstraint(fields=["notice", "user"], name="notice_delivery_once")
        ]

    def __str__(self) -> str:
        return f"{self.notice_id} to {self.user_id}"
