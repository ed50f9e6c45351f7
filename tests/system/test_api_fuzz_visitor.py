"""The whole API fuzzed as a visitor (no credentials): see ``tests/system/api_fuzz.py``.

Positive-data acceptance is left out on purpose: the schema cannot say which ids exist, so
a well-formed request for proposal 0 is rightly refused (404, or 400 for a filter).
"""

from __future__ import annotations

import pytest
import schemathesis

from tests.system.api_fuzz import (  # noqa: F401 (fixtures, found by pytest by name)
    fuzz,
    fuzz_settings,
    report_the_tally,
    requests_keep_the_test_connection,
    schema,
    some_data,
)

pytestmark = pytest.mark.django_db


@schema.parametrize()
@fuzz_settings
@pytest.mark.usefixtures("some_data")
def test_no_operation_fails_or_lies_for_a_visitor(case: schemathesis.Case) -> None:
    fuzz(case)
