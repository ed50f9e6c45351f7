"""Shared fixtures: users in each role, the tiny recipe, API clients; and what keeps a run of
the suite to itself (its Redis database per worker, jobs that report nowhere by default, no
job left running after it)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from tests import scheduling
from tests.factories import ProposalFactory, RecipeFactory, UserFactory
from tests.resources import worker_redis_url

# A port nothing listens on (discard): a job's report is refused at once.
NOWHERE = "http://127.0.0.1:9"

# Each pytest worker has a Redis database of its own (the broker tests flush theirs), and any
# process the suite starts (a Celery worker, a job) reports nowhere unless its test says
# where: never to 127.0.0.1:8000, where a developer's own site may be running. Set here, at
# import, before any test module reads them.
os.environ["TEST_REDIS_URL"] = worker_redis_url(
    os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
)
os.environ["SITE_URL"] = NOWHERE
os.environ["RUNS_API_URL"] = f"{NOWHERE}/api/v1/"
os.environ["RUNS_MLFLOW_TRACKING_URI"] = f"{NOWHERE}/mlflow"

# The parts that behave differently on SQLite (the embedded default) and PostgreSQL: bin/test
# runs them on SQLite too (`pytest -m sqlite`) after the whole suite on PostgreSQL. A module
# joins here; a single test elsewhere joins with @pytest.mark.sqlite.
SQLITE_TOO = (
    "tests/proposals/test_services.py",  # transitions: row locks, transactions, savepoints
    "tests/runs/services/test_recipes_and_plans.py",
    "tests/runs/management/test_load_recipes.py",  # all or nothing across savepoints
    "tests/proposals/management/test_seed_demo.py",  # every service of a proposal's life, end to end
    "tests/runs/services/test_dispatch.py",  # the queue: locks, concurrency limits, the reconciler
    "tests/system/test_runs_end_to_end.py",  # a real worker's threads against the database
    "tests/system/test_runs_chaos.py",  # worker SIGKILLed, Redis restarted
    "tests/runs/results/test_summary.py",
    "tests/runs/test_runner_api.py",  # ingest: upserts, NaN, binary arrays on PostgreSQL only
    "tests/runs/series/test_rollup.py",  # chart rollups: SQL on PostgreSQL, Python elsewhere
    "tests/proposals/test_search.py",  # full-text search on PostgreSQL, its fallback elsewhere
    "tests/proposals/test_export.py",
    "tests/proposals/github/test_deliveries.py",  # the delivery store: ON CONFLICT, NUL, batches
    "tests/proposals/github/test_outbox.py",  # the outbox: ordering, locks, retries
    "tests/system/test_github_loop.py",  # threads writing results and comments at once
    "tests/marin_site/test_db.py",  # the PostgreSQL statements and their portable fallbacks
    "tests/system/test_hostile_input.py",  # NUL, surrogates, integers past 64 bits stored
    "tests/runs/metrics/test_steady.py",  # the steady-state median: SQL on PostgreSQL, numpy elsewhere
    "tests/runs/test_units_every_page.py",  # what the pages read: medians and rollups, either way
)
ROOT = Path(__file__).resolve().parents[1]
SQLITE_MARK = re.compile(rb"\bmark\.sqlite\b")


def holds_sqlite_tests(path: Path) -> bool:
    """Whether a test file may hold tests of the SQLite pass: one of SQLITE_TOO, or a file
    that marks a test of its own (``pytest.mark.sqlite``)."""
    listed = path.is_relative_to(ROOT) and str(path.relative_to(ROOT)) in SQLITE_TOO
    return listed or bool(SQLITE_MARK.search(path.read_bytes()))


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The SQLite pass (``-m sqlite``) does not import the test files that hold none of its
    tests: each of its workers would collect the whole suite (about 15 s of CPU, the schema
    fuzzer's cases included) to keep a few hundred tests."""
    if config.getoption("markexpr", "") != "sqlite":
        return None
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    return None if holds_sqlite_tests(collection_path) else True


def pytest_sessionfinish(session: pytest.Session) -> None:
    """No job outlives the run: the local executor's supervisors (and their jobs) that a test
    left running under this process's temporary directory are stopped."""
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is not None:
        _stop_leftover_jobs(factory.getbasetemp())


def pytest_configure(config: pytest.Config) -> None:
    if scheduling.recorder_wanted(config):
        config.pluginmanager.register(scheduling.DurationsRecorder(config), "file-durations")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if str(item.path.relative_to(ROOT)) in SQLITE_TOO:
            item.add_marker(pytest.mark.sqlite)
    # The longest files first, as bin/test's processes take them (tests/scheduling.py).
    scheduling.longest_first(items, scheduling.file_seconds())


@pytest.fixture
def recipe() -> Any:
    return RecipeFactory.create()


@pytest.fixture
def contributor() -> Any:
    return UserFactory.create(username="carla", roles=["contributor"])


@pytest.fixture
def reviewer() -> Any:
    return UserFactory.create(username="rita", roles=["reviewer"])


@pytest.fixture
def maintainer() -> Any:
    return UserFactory.create(username="max", roles=["maintainer"])


@pytest.fixture
def proposal(contributor: Any, recipe: Any) -> Any:
    return ProposalFactory.create(author=contributor, recipe=recipe)


@pytest.fixture
def api() -> APIClient:
    return APIClient()


@pytest.fixture
def api_as(api: APIClient) -> Any:
    def login(user: Any) -> APIClient:
        api.force_authenticate(user)
        return api

    return login


@pytest.fixture(autouse=True, scope="session")
def _fast_password_hashing() -> None:
    """Real hashers cost ~0.3 s a user by design; tests need many users, not security."""
    from django.conf import settings
    from django.contrib.auth.hashers import get_hashers

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    get_hashers.cache_clear()  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None) -> Iterator[None]:
    """pytest-django's, and then: a long-poll opens a listening connection
    (runs/pools/wakeup.py), closed before the test database is dropped."""
    yield
    from runs.pools import wakeup

    wakeup.stop_listening()


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    """Throttles and caches start empty in every test (and what a process remembers of them)."""
    from django.core.cache import cache

    from proposals.actions import allowed_action_names_forget
    from proposals.github.deliveries import nudge_memo_forget

    cache.clear()
    nudge_memo_forget()
    allowed_action_names_forget()


@pytest.fixture(autouse=True)
def _jobs_report_to_the_test_s_site(settings: Any, tmp_path_factory: Any) -> None:
    """A job a test starts reports where that test says (its live server), else nowhere: never
    to the default address (127.0.0.1:8000), where a developer's own site may be running."""
    settings.RUNS_API_URL = f"{NOWHERE}/api/v1/"
    settings.RUNS_MLFLOW_TRACKING_URI = f"{NOWHERE}/mlflow"
    # And its local jobs work under the test's temporary directory, where the clean-up
    # before a flush and at the end of the run finds them (never under var/).
    settings.RUNS_WORK_DIR = tmp_path_factory.mktemp("runs")


@pytest.fixture(autouse=True)
def _quiet_before_flush(request: pytest.FixtureRequest, tmp_path_factory: Any) -> Iterator[None]:
    """A transactional test ends with a flush (a DELETE of every table on PostgreSQL,
    tests/postgresql/base.py). Anything still talking to the database then (a job of the test
    posting through the live server, a request the browser's poll started) can deadlock with
    it or write a row after it, and PostgreSQL aborts the flush or the next test finds the row. So before it: stop the local jobs the test left behind, and wait for the other
    connections to the test database to go idle. Set up after pytest-django's database
    fixture (a conftest autouse comes after a plugin's), so torn down before it."""
    yield
    marker = request.node.get_closest_marker("django_db")
    if marker is None or not (marker.kwargs.get("transaction") or marker.args[:1] == (True,)):
        return
    _stop_leftover_jobs(tmp_path_factory.getbasetemp())
    _wait_for_idle_connections(timeout=15.0)


def _stop_leftover_jobs(basetemp: Path) -> None:
    """Stop the local executor's supervisors (and their jobs' groups) under the tests' temp
    directory: they outlive the test by design (runs/executors/supervise.py)."""
    import contextlib
    import json
    import os
    import signal

    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"runs.executors.supervise" not in argv or b"--workdir" not in argv:
            continue
        workdir = Path(argv[argv.index(b"--workdir") + 1].decode(errors="replace"))
        if basetemp not in workdir.parents:
            continue
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            child = json.loads((workdir / "child.json").read_text())
            os.killpg(int(child["pgid"]), signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.kill(int(proc.name), signal.SIGKILL)


def _wait_for_idle_connections(*, timeout: float) -> None:
    import time

    from django.db import connection

    if connection.vendor != "postgresql":
        return  # SQLite's test database is one in-memory database: nothing to deadlock with
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND state <> 'idle'"
            )
            (busy,) = cursor.fetchone()
        if not busy:
            return
        time.sleep(0.05)
