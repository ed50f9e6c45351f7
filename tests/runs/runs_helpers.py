"""Helpers for the run queue tests: launched plans of the tiny recipe, waiting on jobs."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery.contrib.testing.worker import start_worker
from django.db import OperationalError, connection, transaction

from marin_site.celery import app
from runs.models import Plan, Recipe
from runs.services import dispatch
from runs.services import plans as plan_services

FAST_BASELINE = {"steps": 12, "width": 32}
CRITERIA = {"metric": "eval/loss", "direction": "lower", "threshold": 0.01}

TWO_POINT_SPEC = """axes:
  capacity_factor: [2.0]
"""


def database_url_for_a_process() -> str:
    """The test database as a ``DATABASE_URL`` for a process of its own (a worker, a
    killed submit): SQLite's file or PostgreSQL's database, whichever the test runs on.
    The test must be ``transaction=True`` for that process to see its rows."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    return f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def frozen_plan(
    recipe: Recipe,
    spec: str = TWO_POINT_SPEC,
    *,
    baseline: dict[str, Any] | None = None,
    budget: float | None = None,
) -> Plan:
    return plan_services.plan_freeze(
        recipe=recipe,
        baseline=FAST_BASELINE if baseline is None else baseline,
        spec_text=spec,
        budget_accelerator_hours=budget,
    )


def launched_plan(recipe: Recipe, spec: str = TWO_POINT_SPEC, **kwargs: Any) -> Plan:
    """A plan launched and expanded (the nudges of the launch are not run)."""
    launch_kwargs = {
        k: kwargs.pop(k)
        for k in ("executor", "max_concurrent_runs", "criteria", "git_ref")
        if k in kwargs
    }
    plan = frozen_plan(recipe, spec, **kwargs)
    with transaction.atomic():
        criteria = launch_kwargs.pop("criteria", CRITERIA)
        plan_services.plan_launch(plan_id=plan.pk, criteria=criteria, **launch_kwargs)
    dispatch.plan_expand(plan_id=plan.pk)
    return plan


def wait_for(predicate: Callable[[], Any], *, timeout: float = 30.0, every: float = 0.1) -> Any:
    """Poll ``predicate`` until truthy. SQLite's shared in-memory test database answers
    "table is locked" while another thread (worker, live server) writes: poll again."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except OperationalError:
            value = None
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {predicate}")


@pytest.fixture
def eager_tasks() -> Iterator[None]:
    """Nudges run inline instead of going to the development broker."""
    app.conf.task_always_eager = True
    try:
        yield
    finally:
        app.conf.task_always_eager = False


# Redis as the Celery broker, as in production: TEST_REDIS_URL (bin/test sets it).
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/13")


@contextlib.contextmanager
def broker(url: str) -> Iterator[None]:
    """Point the Celery app at ``url``; connections made for the old broker are dropped."""
    saved = {k: app.conf[k] for k in ("broker_url", "broker_transport_options")}
    app.conf.broker_url = url
    app.conf.broker_transport_options = {}
    app._pool = None
    app.amqp._producer_pool = None
    try:
        yield
    finally:
        app.conf.update(saved)
        app._pool = None
        app.amqp._producer_pool = None


@pytest.fixture
def redis_broker() -> Iterator[None]:
    """Redis (a database of its own) as the broker, with a worker in this process."""
    redis.Redis.from_url(REDIS_URL).flushdb()
    try:
        with (
            broker(REDIS_URL),
            start_worker(app, pool="threads", concurrency=2, perform_ping_check=False),
        ):
            yield
    finally:
        redis.Redis.from_url(REDIS_URL).flushdb()
