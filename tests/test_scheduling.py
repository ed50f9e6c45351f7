"""tests/scheduling.py: the longest files first, a file's tests together, and the table
refreshed from a whole passing run only."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from tests import scheduling

pytest_plugins = ["pytester"]


@dataclass
class Item:
    nodeid: str


def _ordered(nodeids: list[str], known: dict[str, float]) -> list[str]:
    items = [Item(nodeid) for nodeid in nodeids]
    scheduling.longest_first(cast(list[pytest.Item], items), known)
    return [item.nodeid for item in items]


def test_the_longest_file_goes_first_and_a_file_s_tests_stay_together_in_order() -> None:
    collected = [
        "tests/a.py::one",
        "tests/a.py::two",
        "tests/b.py::one",
        "tests/c.py::one[x]",
        "tests/c.py::one[y]",
        "tests/c.py::two",
    ]
    known = {"tests/b.py": 30.0, "tests/a.py": 0.7}
    # c.py is not in the table: three tests at 0.1 s, shorter than a.py's 0.7 s.
    assert _ordered(collected, known) == [
        "tests/b.py::one",
        "tests/a.py::one",
        "tests/a.py::two",
        "tests/c.py::one[x]",
        "tests/c.py::one[y]",
        "tests/c.py::two",
    ]
    many = [f"tests/d.py::t{i}" for i in range(12)]  # 1.2 s by the estimate
    assert _ordered(collected + many, known)[1:13] == many


def test_a_table_that_cannot_be_read_knows_no_file(tmp_path: Path) -> None:
    table = tmp_path / "durations.json"
    assert scheduling.file_seconds(table) == {}
    table.write_text("[1, 2]")
    assert scheduling.file_seconds(table) == {}
    table.write_text('{"tests/a.py": 2.5, "tests/b.py": "long"}')
    assert scheduling.file_seconds(table) == {"tests/a.py": 2.5}


def test_every_file_the_repository_s_table_names_is_there() -> None:
    """A file moved or renamed since the table was written would be estimated, not known:
    write the table again (``python -m tests.scheduling`` after a whole run)."""
    known = scheduling.file_seconds()
    assert len(known) > 20
    assert [name for name in known if not (scheduling.ROOT / name).is_file()] == []


def test_the_table_keeps_the_files_of_half_a_second_or_more_longest_first(
    tmp_path: Path,
) -> None:
    table = tmp_path / "durations.json"
    assert scheduling.table_write({"a": 0.2, "b": 3.04, "c": 12, "d": 0.5}, table) == 3
    assert list(json.loads(table.read_text()).items()) == [("c", 12.0), ("b", 3.0), ("d", 0.5)]


SLEEPY = """
import time

def test_short():
    time.sleep(0.01)

def test_long():
    time.sleep(0.3)
"""


def _recorded(pytester: pytest.Pytester, *args: str) -> Any:
    """Run pytest on the files made in ``pytester``'s folder, with the recorder registered
    as tests/conftest.py registers it; what it kept in that folder's cache, if anything."""
    pytester.makeconftest(
        "from tests import scheduling\n"
        "def pytest_configure(config):\n"
        "    config.pluginmanager.register(scheduling.DurationsRecorder(config), 'durations')\n"
    )
    result = pytester.runpytest_subprocess("-p", "no:django", "-p", "no:xdist", *args)
    said = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in said and result.parseoutcomes().get("passed"), said
    cached = pytester.path / ".pytest_cache" / "v" / scheduling.CACHE_KEY
    return json.loads(cached.read_text()) if cached.exists() else None


@pytest.fixture(autouse=True)
def repository_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The inner pytest imports ``tests.scheduling`` from this checkout."""
    monkeypatch.setenv("PYTHONPATH", str(scheduling.ROOT))


def test_a_whole_passing_run_records_its_files_seconds(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_sleepy=SLEEPY, test_quick="def test_quick():\n    pass\n")
    recorded = _recorded(pytester)
    assert set(recorded) == {"test_sleepy.py", "test_quick.py"}
    assert recorded["test_sleepy.py"] >= 0.3 > recorded["test_quick.py"]


@pytest.mark.parametrize(
    "args", [("test_sleepy.py",), ("-k", "long"), ("-m", "not slow"), ("--lf",)]
)
def test_a_selection_records_nothing(pytester: pytest.Pytester, args: tuple[str, ...]) -> None:
    pytester.makepyfile(test_sleepy=SLEEPY)
    assert _recorded(pytester, *args) is None


def test_a_run_without_pytest_s_cache_records_nothing_and_passes(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_sleepy=SLEEPY)
    assert _recorded(pytester, "-p", "no:cacheprovider") is None


def test_a_failing_run_records_nothing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_sleepy=SLEEPY + "\ndef test_fails():\n    assert False\n")
    assert _recorded(pytester) is None
