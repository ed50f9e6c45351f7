"""A fresh clone passes its tests alone: every file the tests read is inside the repository."""

from __future__ import annotations

import re
from pathlib import Path

from tests.proposals.github_support import FIXTURES, MARIN_ISSUES, WEBHOOKS

REPOSITORY = Path(__file__).resolve().parents[1]
# A path into the folder some checkouts have beside them, however it is spelt. The name is
# assembled, so that this file is not itself a match for the same search done by a grep.
FOLDER = "sha" + "red"
OUTSIDE = re.compile(rf"""\.\./{FOLDER}|["']{FOLDER}["']|{FOLDER}/fixtures|parents\[[3-9]\]""")


def test_fixtures_live_inside_the_repository() -> None:
    assert FIXTURES.is_relative_to(REPOSITORY / "tests")
    assert len(list(WEBHOOKS.glob("*/*.json"))) >= 40
    assert len(list(MARIN_ISSUES.glob("*.json"))) >= 4
    for licence in ("LICENSE.octokit-webhooks-MIT", "LICENSE.zulip-Apache-2.0", "README.md"):
        assert (FIXTURES / "github" / licence).is_file(), licence


def test_no_test_reads_beside_the_checkout() -> None:
    offenders = [
        str(path.relative_to(REPOSITORY))
        for path in sorted((REPOSITORY / "tests").rglob("*.py"))
        if path != Path(__file__).resolve() and OUTSIDE.search(path.read_text())
    ]
    assert offenders == []


def test_every_module_bin_test_runs_on_sqlite_too_exists() -> None:
    from tests.conftest import SQLITE_TOO

    assert [path for path in SQLITE_TOO if not (REPOSITORY / path).is_file()] == []
