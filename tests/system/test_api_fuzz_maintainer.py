"""The whole API fuzzed as a maintainer (a token with every permission): see
``tests/system/api_fuzz.py``."""

from __future__ import annotations

import pytest
import schemathesis
from django.contrib.auth.models import User
from rest_framework.authtoken.models import Token

from tests.factories import UserFactory
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
def test_no_operation_fails_or_lies_for_a_maintainer(case: schemathesis.Case) -> None:
    maintainer = User.objects.filter(username="fuzz-max").first() or UserFactory.create(
        username="fuzz-max", roles=["maintainer"]
    )
    token, _ = Token.objects.get_or_create(user=maintainer)
    fuzz(case, {"Authorization": f"Token {token.key}"})
