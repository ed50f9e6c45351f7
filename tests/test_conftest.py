"""What the suite's own conftest decides: which files the SQLite pass imports."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import ROOT, SQLITE_TOO, holds_sqlite_tests


def test_the_sqlite_pass_reads_every_listed_file_and_every_file_marking_a_test(
    tmp_path: Path,
) -> None:
    assert all(holds_sqlite_tests(ROOT / name) for name in SQLITE_TOO)
    assert holds_sqlite_tests(ROOT / "tests/runs/pools/test_handout.py")  # marks one test
    marked = tmp_path / "test_marked.py"
    marked.write_text("import pytest\n\n\n@pytest.mark.sqlite\ndef test_x():\n    pass\n")
    assert holds_sqlite_tests(marked)
    in_a_list = tmp_path / "test_listed.py"
    in_a_list.write_text(
        "import pytest\n\npytestmark = [pytest.mark.django_db, pytest.mark.sqlite]\n"
    )
    assert holds_sqlite_tests(in_a_list)


def test_the_sqlite_pass_leaves_a_file_that_only_names_sqlite(tmp_path: Path) -> None:
    assert not holds_sqlite_tests(ROOT / "tests/system/test_api_fuzz_maintainer.py")
    named = tmp_path / "test_named.py"
    named.write_text(
        '"""Runs on sqlite and PostgreSQL alike."""\nSQLITE = "sqlite"\nmark_sqlite = 1\n'
    )
    assert not holds_sqlite_tests(named)
