"""The door fuzz (tests/system/door_fuzz.py) at every web form: the pages come from walking
the URL configuration (each parameter filled from the world), the forms and their fields
from the pages themselves, so a form added to a page is fuzzed without a line here."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from tests.system import door_fuzz
from tests.system.door_fuzz import Fuzzer
from tests.system.door_fuzz_world import CLASSES, check, seeded, world

pytestmark = pytest.mark.django_db
__all__ = ["world"]


def test_every_web_form(world: dict[str, Any]) -> None:
    fuzzer = Fuzzer(world, seeded())
    client = Client(raise_request_exception=False)
    client.force_login(world["maintainer"])
    forms = door_fuzz.discover_forms(client, door_fuzz.url_pages(world))
    actions = {form.action for form in forms}
    # the walk finds the forms: a page that lost its form, or a walk that lost its pages,
    # would leave the fuzz with nothing to try
    assert {"/recipes/new/", "/proposals/new/", "/pools/new/"} <= actions, sorted(actions)
    for form in forms:
        door_fuzz.fuzz_form(fuzzer, client, form, CLASSES)
    check(fuzzer, "web forms")
