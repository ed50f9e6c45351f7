"""The rules of pools and agents: pools, registration tokens, agent credentials and
revocation. Tokens and credentials are random, shown once and stored as SHA-256 hashes; the
leases by which agents hold runs are ``runs.pools.leases``.
"""

from __future__ import annotations

import re
import secrets
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from marin_site.errors import ActionForbidden, DomainError
from runs import permissions as run_perms
from runs.models import Recipe, Run, RunState
from runs.pools.leases import clean_text, lease_end_and_requeue
from runs.pools.models import POOL_NAME_MAX, Agent, Lease, LeaseEnd, Pool, RegistrationToken

Actor = User | AnonymousUser | None

LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9:._/+-]{0,63}\Z")
VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+_-]{0,31}\Z")
POOL_NAME = re.compile(rf"^[a-z0-9][a-z0-9-]{{0,{POOL_NAME_MAX - 1}}}\Z")
MAX_LABELS = 32


class AgentUnauthorized(DomainError):
    """No such credential or token, or it expired or was revoked (HTTP 401)."""

    status_code = 401


def _require(actor: Actor, permission: str, obj: Any, what: str) -> None:
    if actor is None or not actor.has_perm(permission, obj):
        raise ActionForbidden(f"You may not {what} (permission '{permission}').")


def _secret(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(32)}"


def _hash(token: str) -> str:
    from runs.tokens import token_hash

    return token_hash(token)


# --- checking what people and agents send ------------------------------------------------


def _clean_labels(value: Any, field: str = "labels") -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValidationError({field: ["must be a list of strings"]})
    if len(value) > MAX_LABELS:
        raise ValidationError({field: [f"at most {MAX_LABELS} labels"]})
    bad = [v for v in value if not LABEL.match(v)]
    if bad:
        raise ValidationError(
            {field: [f"'{bad[0][:64]}' is no label: letters, digits and ':._/+-', at most 64"]}
        )
    return list(dict.fromkeys(value))


def labels_clean(value: Any, field: str) -> list[str]:
    """A list of labels (e.g. a recipe's ``requires_labels``), checked; 400 naming ``field``."""
    return _clean_labels(value, field)


def labels_lacking(*, pool: Pool, required: list[str]) -> list[str]:
    """Which of the ``required`` labels ``pool`` lacks: none when the pool has them all, or
    one of its agents (not revoked) has them all with the pool's; else those the pool lacks."""
    have = set(pool.labels or [])
    missing = [label for label in required if label not in have]
    if not missing:
        return []
    for labels in pool.agents.filter(revoked_at__isnull=True).values_list("labels", flat=True):
        if set(missing) <= set(labels or []):
            return []
    return missing


def labels_problem(*, pool: Pool, required: list[str], recipe_name: str) -> str:
    """Why ``pool`` cannot run a recipe requiring ``required`` labels, or ""."""
    missing = labels_lacking(pool=pool, required=required)
    if not missing:
        return ""
    return (
        f"pool '{pool.name}' lacks the label{'s' if len(missing) > 1 else ''} "
        f"{', '.join(missing)} that recipe '{recipe_name[:63]}' requires (requires_labels); "
        "neither the pool nor any of its agents has them"
    )


# --- pools and registration tokens -------------------------------------------------------


def pool_validate(*, data: dict[str, Any]) -> dict[str, Any]:
    """Check a pool's fields; returns them cleaned or raises ValidationError by field."""
    name = data.get("name")
    if not isinstance(name, str) or not POOL_NAME.match(name):
        raise ValidationError(
            {"name": [f"must be lowercase letters, digits and '-', at most {POOL_NAME_MAX}"]}
        )
    recipes = data.get("recipes") or []
    if isinstance(recipes, str):
        recipes = [part.strip() for part in recipes.split(",") if part.strip()]
    if not isinstance(recipes, list) or not all(isinstance(r, str) for r in recipes):
        raise ValidationError({"recipes": ["must be a list of recipe names"]})
    known = set(Recipe.objects.filter(name__in=recipes).values_list("name", flat=True))
    unknown = [r for r in recipes if r not in known]
    if unknown:
        raise ValidationError({"recipes": [f"no recipe is named '{unknown[0][:63]}'"]})
    author_dry_runs = data.get("author_dry_runs", False)
    if not isinstance(author_dry_runs, bool):
        raise ValidationError({"author_dry_runs": ["must be true or false"]})
    limit = data.get("max_concurrent_runs", 4)
    if type(limit) is not int or not 1 <= limit <= 10_000:
        raise ValidationError({"max_concurrent_runs": ["must be an integer from 1 to 10000"]})
    return {
        "name": name,
        "description": clean_text(data.get("description"), "description", max_length=2_000),
        "labels": _clean_labels(data.get("labels")),
        "recipes": list(dict.fromkeys(recipes)),
        "max_concurrent_runs": limit,
        "author_dry_runs": author_dry_runs,
    }


@transaction.atomic
def pool_create(*, actor: Actor, data: dict[str, Any], owner: User | None = None) -> Pool:
    """A maintainer creates a pool for ``owner`` (by default, themselves)."""
    _require(actor, run_perms.CREATE_POOL, None, "create pools")
    cleaned = pool_validate(data=data)
    if Pool.objects.filter(name=cleaned["name"]).exists():
        raise ValidationError({"name": [f"a pool named '{cleaned['name']}' exists"]})
    user = actor if isinstance(actor, User) else None
    owner = owner or user
    if owner is None:
        raise ValidationError({"owner": ["a pool needs an owner"]})
    return Pool.objects.create(**cleaned, owner=owner, created_by=user)


@transaction.atomic
def pool_update(*, actor: Actor, pool_id: int, data: dict[str, Any]) -> Pool:
    """Change a pool's description, labels, recipes, limit or whether authors may start
    dry runs (its name stays)."""
    pool = Pool.objects.select_for_update().get(pk=pool_id)
    _require(actor, run_perms.MANAGE_POOL, pool, "change this pool")
    cleaned = pool_validate(data={**data, "name": pool.name})
    fields = ["description", "labels", "recipes", "max_concurrent_runs", "author_dry_runs"]
    for field in fields:
        setattr(pool, field, cleaned[field])
    pool.save(update_fields=fields)
    return pool


def registration_token_create(
    *, actor: Actor, pool_id: int, note: str = "", days: int | None = None
) -> tuple[RegistrationToken, str]:
    """A new registration token for the pool; the plain token is returned once, never stored."""
    pool = Pool.objects.get(pk=pool_id)
    _require(actor, run_perms.MANAGE_POOL, pool, "make registration tokens for this pool")
    if pool.retired_at is not None:
        raise DomainError(f"Pool '{pool.name}' is retired.")
    days = settings.RUNS_REGISTRATION_TOKEN_DAYS if days is None else days
    if type(days) is not int or not 1 <= days <= 365:
        raise ValidationError({"days": ["must be an integer from 1 to 365"]})
    plain = _secret("mreg")
    token = RegistrationToken.objects.create(
        pool=pool,
        token_hash=_hash(plain),
        prefix=plain[:12],
        note=clean_text(note, "note", max_length=200),
        created_by=actor if isinstance(actor, User) else None,
        expires_at=timezone.now() + timedelta(days=days),
    )
    return token, plain


def registration_token_revoke(*, actor: Actor, token_id: int) -> RegistrationToken:
    token = RegistrationToken.objects.select_related("pool").get(pk=token_id)
    _require(actor, run_perms.MANAGE_POOL, token.pool, "revoke this pool's tokens")
    RegistrationToken.objects.filter(pk=token_id, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    token.refresh_from_db()
    return token


@transaction.atomic
def pool_retire(*, actor: Actor, pool_id: int) -> Pool:
    """Retire a pool: its tokens and agents are refused from now on (401), the runs its agents
    hold go back to the queue, and offered runs wait (saying why) instead of being leased."""
    pool = Pool.objects.select_for_update().get(pk=pool_id)
    _require(actor, run_perms.CREATE_POOL, pool, "retire pools")
    if pool.retired_at is not None:
        return pool
    pool.retired_at = timezone.now()
    pool.save(update_fields=["retired_at"])
    for lease_id in Lease.objects.filter(agent__pool=pool, ended_at__isnull=True).values_list(
        "pk", flat=True
    ):
        lease_end_and_requeue(
            lease_id=lease_id, reason=LeaseEnd.REVOKED, message=f"pool '{pool.name}' was retired"
        )
    Run.objects.filter(
        executor=pool.executor, state=RunState.QUEUED, dispatched_at__isnull=False
    ).update(dispatched_at=None, state_reason=f"waiting: pool '{pool.name}' is retired")
    return pool


# --- agents ------------------------------------------------------------------------------


def agent_register(
    *, token: str, name: Any, labels: Any = None, version: Any = ""
) -> tuple[Agent, str]:
    """Turn a registration token into an agent and its credential (returned once)."""
    clean_name = clean_text(name, "name", max_length=255, required=True)
    clean_labels = _clean_labels(labels)
    clean_version = clean_text(version, "version", max_length=32)
    if clean_version and not VERSION.match(clean_version):
        raise ValidationError({"version": ["letters, digits and '.+_-', at most 32"]})
    with transaction.atomic():
        row = (
            RegistrationToken.objects.select_for_update()
            .select_related("pool")
            .filter(token_hash=_hash(token))
            .first()
        )
        if row is None or not row.is_usable or row.pool.retired_at is not None:
            raise AgentUnauthorized("Unknown, expired or revoked registration token.")
        plain = _secret("magent")
        agent = Agent.objects.create(
            pool=row.pool,
            name=clean_name,
            labels=clean_labels,
            version=clean_version,
            credential_hash=_hash(plain),
            prefix=plain[:12],
            registered_with=row,
            last_contact_at=timezone.now(),
        )
        RegistrationToken.objects.filter(pk=row.pk).update(
            uses=F("uses") + 1, last_used_at=timezone.now()
        )
    return agent, plain


def agent_authenticate(*, credential: str) -> Agent:
    """The agent a credential belongs to, if it and its pool are in good standing (else 401)."""
    if not credential:
        raise AgentUnauthorized(
            "Send the agent's credential: 'Authorization: Bearer <credential>'."
        )
    agent = Agent.objects.select_related("pool").filter(credential_hash=_hash(credential)).first()
    if agent is None:
        raise AgentUnauthorized("Unknown agent credential.")
    if agent.revoked_at is not None:
        raise AgentUnauthorized("This agent was revoked.")
    if agent.pool.retired_at is not None:
        raise AgentUnauthorized(f"Pool '{agent.pool.name}' is retired.")
    now = timezone.now()
    if agent.last_contact_at is None or (now - agent.last_contact_at).total_seconds() >= 5:
        Agent.objects.filter(pk=agent.pk).update(last_contact_at=now)  # to the nearest 5 s
        agent.last_contact_at = now
    return agent


@transaction.atomic
def agent_revoke(*, actor: Actor, agent_id: int) -> Agent:
    """Revoke an agent: its next request gets 401 and the run it holds goes back to the queue."""
    agent = Agent.objects.select_for_update().select_related("pool").get(pk=agent_id)
    _require(actor, run_perms.MANAGE_POOL, agent.pool, "revoke this pool's agents")
    if agent.revoked_at is not None:
        return agent
    agent.revoked_at = timezone.now()
    agent.revoked_by = actor if isinstance(actor, User) else None
    agent.save(update_fields=["revoked_at", "revoked_by"])
    for lease_id in agent.leases.filter(ended_at__isnull=True).values_list("pk", flat=True):
        lease_end_and_requeue(
            lease_id=lease_id, reason=LeaseEnd.REVOKED, message=f"{agent.label} was revoked"
        )
    return agent


# --- leases ------------------------------------------------------------------------------
