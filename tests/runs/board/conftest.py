"""The board tests' fixtures."""

from importlib import import_module

import pytest
from django.apps import apps

from tests.runs.board.board_helpers import eager  # noqa: F401 (a fixture)


@pytest.fixture
def seeded_tracks(db: None) -> None:
    """The tracks migration 0008 seeds, there whatever ran before: a transactional test
    earlier in the same worker flushes every table, the migration's rows included. Made by
    the migration's own function (idempotent), so the tests still check what it seeds."""
    import_module("runs.migrations.0008_board").seed(apps, None)
