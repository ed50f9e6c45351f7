"""Pools, their registration tokens, agents and leases.

A lease is the truth about who executes a run: at most one open lease per run and per agent
(partial unique indexes), so a run is never executed twice at once. Tokens and credentials
are stored as SHA-256 hashes only; the plain value is shown once, when it is made.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from runs.validators import slug_validator

POOL_NAME_MAX = 32  # "pool:" + name fits an executor name of 40 characters


class Pool(models.Model):
    """A named set of machines someone else owns; runs reach it as executor ``pool:<name>``."""

    name = models.CharField(max_length=POOL_NAME_MAX, unique=True, validators=[slug_validator])
    description = models.TextField(blank=True, max_length=2_000)
    labels = models.JSONField(default=list, blank=True, help_text="e.g. gpu:a5000, tpu:v5e-8")
    recipes = models.JSONField(
        default=list, blank=True, help_text="Names of the recipes it may run; empty: any recipe."
    )
    max_concurrent_runs = models.PositiveIntegerField(default=4)
    launchers = models.JSONField(
        default=list,
        blank=True,
        help_text="Usernames who may launch plans on it; empty: any maintainer who approves.",
    )
    author_dry_runs = models.BooleanField(
        default=False,
        help_text="The author of a submitted proposal whose recipe runs on this pool may start "
        "its dry run (else only a maintainer may).",
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="owned_pools"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    retired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"pool {self.name}"

    def get_absolute_url(self) -> str:
        return reverse("pools:detail", kwargs={"name": self.name})

    @property
    def executor(self) -> str:
        return f"pool:{self.name}"

    @property
    def is_active(self) -> bool:
        return self.retired_at is None

    def may_run(self, recipe_name: str) -> bool:
        return not self.recipes or recipe_name in self.recipes


class RegistrationToken(models.Model):
    """Turns into an agent credential once per agent; expiring and revocable."""

    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="registration_tokens")
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(
        max_length=16, help_text="The token's first characters, to tell it apart."
    )
    note = models.CharField(max_length=200, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    uses = models.PositiveIntegerField(default=0)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"registration token {self.prefix}… of {self.pool_id}"

    @property
    def is_usable(self) -> bool:
        return self.revoked_at is None and self.expires_at > timezone.now()


class Agent(models.Model):
    """One machine of a pool running the agent program, known by its credential."""

    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="agents")
    name = models.CharField(max_length=255, help_text="The host name the agent gave.")
    labels = models.JSONField(default=list, blank=True)
    version = models.CharField(max_length=32, blank=True)
    credential_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=16)
    registered_with = models.ForeignKey(
        RegistrationToken, null=True, blank=True, on_delete=models.SET_NULL, related_name="agents"
    )
    registered_at = models.DateTimeField(auto_now_add=True)
    last_contact_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["pool", "name", "pk"]

    def __str__(self) -> str:
        return f"agent {self.pk} ({self.name})"

    @property
    def label(self) -> str:
        return f"agent {self.pk} ({self.name[:60]})"


class LeaseEnd(models.TextChoices):
    EXITED = "exited"  # the agent reported how the job ended
    PREEMPTED = "preempted"  # the agent was stopped (SIGTERM) and stopped its job
    LOST = "lost"  # the agent stopped renewing: the lease timed out
    REVOKED = "revoked"  # the agent or its pool was revoked
    ABANDONED = "abandoned"  # the agent asked for work while holding it: it no longer runs it
    CANCELED = "canceled"  # the run was canceled and the job stopped
    SETTLED = "settled"  # the run ended by another door (its own status report, a cancel)


class Lease(models.Model):
    """An agent's hold on one attempt of one run, renewed by heartbeats until it ends."""

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="leases")
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="leases")
    attempt = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    renewed_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=16, choices=LeaseEnd.choices, blank=True)
    outcome = models.JSONField(default=dict, blank=True)
    log_tail = models.TextField(blank=True)

    # Not stored: the JSON answer of the poll that got the lease, built when it was granted
    # (``leases.leases_grant``), so that the poll only writes it.
    answer: bytes | None = None

    class Meta:
        ordering = ["-pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["run"], condition=Q(ended_at__isnull=True), name="lease_one_open_per_run"
            ),
            models.UniqueConstraint(
                fields=["agent"],
                condition=Q(ended_at__isnull=True),
                name="lease_one_open_per_agent",
            ),
        ]
        indexes = [
            models.Index(
                fields=["expires_at"], condition=Q(ended_at__isnull=True), name="lease_open_idx"
            )
        ]

    def __str__(self) -> str:
        return f"lease {self.pk} of run {self.run_id} by agent {self.agent_id}"

    @property
    def external_id(self) -> str:
        return f"lease-{self.pk}"

    @property
    def is_open(self) -> bool:
        return self.ended_at is None
