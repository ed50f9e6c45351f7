"""The board tests' fixtures."""

from tests.runs.board.board_helpers import eager  # noqa: F401 (a fixture)
