"""Helpers for the pool tests: a pool, its agents, and plans offered to it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.utils import timezone

from runs.models import Plan, Recipe, Run
from runs.pools import services
from runs.pools.models import Agent, Lease, Pool
from runs.services import dispatch
from tests.runs.runs_helpers import launched_plan

ONE_RUN = ""  # the baseline alone
FOUR_RUNS = """axes:
  capacity_factor: [1.5, 2.0, 3.0]
"""


def make_pool(owner: User, name: str = "gpu", **fields: Any) -> Pool:
    defaults: dict[str, Any] = {"labels": ["gpu:a5000"], "max_concurrent_runs": 4}
    return Pool.objects.create(name=name, owner=owner, **(defaults | fields))


def make_agent(pool: Pool, name: str = "host-a") -> tuple[Agent, str]:
    _token, plain = services.registration_token_create(actor=pool.owner, pool_id=pool.pk)
    return services.agent_register(token=plain, name=name, labels=["gpu:a5000"], version="1.0")


def offered_plan(recipe: Recipe, pool: Pool, spec: str = FOUR_RUNS, **kwargs: Any) -> Plan:
    """A plan launched on the pool, expanded, and its runs offered (as far as limits allow)."""
    kwargs.setdefault("max_concurrent_runs", 100)
    plan = launched_plan(recipe, spec, executor=pool.executor, **kwargs)
    dispatch.runs_dispatch()
    return plan


def expire(lease: Lease) -> None:
    """Make a lease's time run out, as if its agent stopped renewing it a while ago."""
    past = timezone.now() - timedelta(seconds=1)
    Lease.objects.filter(pk=lease.pk).update(expires_at=past, renewed_at=past)


def runs_of(plan: Plan) -> list[Run]:
    return list(Run.objects.filter(plan=plan).order_by("pk"))
