"""The door fuzz (tests/system/door_fuzz.py) at every API operation that takes a body, with
each writable property of the schema given each input class in turn (as a maintainer, who
may write everywhere, so the input and not the permission is what is tried)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from drf_spectacular.generators import SchemaGenerator

from tests.system import door_fuzz
from tests.system.door_fuzz import Fuzzer
from tests.system.door_fuzz_world import CLASSES, check, seeded, world

pytestmark = pytest.mark.django_db
__all__ = ["world"]


def test_every_api_operation(world: dict[str, Any]) -> None:
    fuzzer = Fuzzer(world, seeded())
    schema = SchemaGenerator().get_schema(request=None, public=True)
    operations = list(door_fuzz.api_operations(schema))
    assert len(operations) > 20
    door_fuzz.fuzz_api(
        fuzzer, Client(raise_request_exception=False), schema, world["token"], CLASSES
    )
    check(fuzzer, "api")
