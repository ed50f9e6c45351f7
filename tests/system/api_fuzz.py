"""Schema-driven fuzzing of the whole API (schemathesis over drf-spectacular's schema), shared
by its two test files, one per identity (``test_api_fuzz_visitor.py``,
``test_api_fuzz_maintainer.py``: two files, so the suite's two processes take one each): no
operation answers 5xx, and every answer's status, content type, headers and body are the ones
the schema documents.

Positive-data acceptance is left out on purpose: the schema cannot say which ids exist, so
a well-formed request for proposal 0 is rightly refused (404, or 400 for a filter).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis import checks, openapi

from tests.factories import ProposalFactory

TALLY: Counter[str] = Counter()  # requests and answers by status class, for SECURITY.md


@pytest.fixture(scope="module", autouse=True)
def report_the_tally() -> Iterator[None]:
    yield
    classes = ", ".join(f"{k}: {v}" for k, v in sorted(TALLY.items()))
    sys.stdout.write(f"\nAPI fuzz: {sum(TALLY.values())} requests ({classes})\n")


def _read_and_close(app: Any) -> Any:
    """The WSGI app, with each answer read whole and closed, as a WSGI server does (Django
    closes the request's uploaded files when its response is closed)."""

    def wsgi(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        def counting_start_response(status: str, headers: Any, *args: Any) -> Any:
            TALLY[f"{status[0]}xx"] += 1
            return start_response(status, headers, *args)

        result = app(environ, counting_start_response)
        try:
            return [b"".join(result)]
        finally:
            result.close()
            environ["wsgi.input"].close()

    return wsgi


# Django's own WSGI handler, not marin_site.wsgi: that module prepares a production process
# (Celery's producer pool, a frozen heap), which the rest of the suite must not inherit.
schema = openapi.from_wsgi("/api/schema/", _read_and_close(get_wsgi_application()))

CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
]
EXAMPLES = 6  # per operation and identity; the suite's budget, not a ceiling of the tool


@pytest.fixture(autouse=True)
def requests_keep_the_test_connection() -> Iterator[None]:
    """The WSGI app closes the database connection after each request, as in production;
    Django's own test client disconnects the same receivers for the same reason."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@pytest.fixture
def some_data(recipe: Any) -> None:
    ProposalFactory.create(recipe=recipe)


def fuzz(case: schemathesis.Case, headers: dict[str, str] | None = None) -> None:
    case.call_and_validate(headers=headers or {}, checks=CHECKS)


# The generation settings of both identities' tests: the same cases in every run.
fuzz_settings = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
