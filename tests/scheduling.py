"""The order bin/test's processes take the test files in: the longest first.

bin/test spreads whole files over its pytest processes (``--dist loadfile``) and hands them
out in collection order (``--no-loadscope-reorder``), so the collection is sorted by each
file's seconds in the last recorded whole run (``tests/durations.json``), longest first: the
heavy files start early and the many short ones fill the end, and the processes finish
together. A file the table does not know is counted at ``SECONDS_PER_UNKNOWN_TEST`` a test.
pytest-xdist's own order (the files with the most tests first) left the heavy few-test
files, a browser walk or the agents end to end, to run last on one process while the others
had finished (bench/RESULTS.md, 2026-12-06).

The table is refreshed from a run: every whole run of the suite that passes (no selection,
no ``-k``, ``-m`` or ``--lf``) records its files' seconds in pytest's cache (``DurationsRecorder``,
on the process that hands out the files), and ``.venv/bin/python -m tests.scheduling``
writes them to ``tests/durations.json``.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
TABLE = Path(__file__).with_name("durations.json")
CACHE_KEY = "marin/file-durations"  # .pytest_cache/v/marin/file-durations
SECONDS_PER_UNKNOWN_TEST = 0.1
KEPT_FROM_SECONDS = 0.5  # shorter files are left to the estimate: the table stays short


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def file_seconds(table: Path = TABLE) -> dict[str, float]:
    """Each known file's seconds; an unreadable table knows none (the estimate orders all)."""
    try:
        known = json.loads(table.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(known, dict):
        return {}
    return {str(k): float(v) for k, v in known.items() if isinstance(v, int | float)}


def longest_first(items: list[pytest.Item], known: dict[str, float]) -> None:
    """Sort ``items`` by their file's seconds, longest first; a file's tests stay together
    and in their order (the sort is stable and its key is the file's)."""
    tests = Counter(file_of(item.nodeid) for item in items)

    def seconds(item: pytest.Item) -> float:
        name = file_of(item.nodeid)
        return known.get(name, tests[name] * SECONDS_PER_UNKNOWN_TEST)

    items.sort(key=lambda item: -seconds(item))


class DurationsRecorder:
    """Sums each file's test seconds (setup, call and teardown) as the reports arrive, and
    keeps them in pytest's cache when the whole suite ran and passed."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        name = file_of(report.nodeid)
        self.seconds[name] = self.seconds.get(name, 0.0) + report.duration

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        option = self.config.option
        selected = any(getattr(option, name, None) for name in ("keyword", "markexpr", "lf"))
        whole = self.config.args_source != pytest.Config.ArgsSource.ARGS and not selected
        cache = getattr(self.config, "cache", None)  # none under -p no:cacheprovider
        if whole and exitstatus == 0 and cache is not None and self.seconds:
            cache.set(CACHE_KEY, {k: round(v, 1) for k, v in self.seconds.items()})


def recorder_wanted(config: pytest.Config) -> bool:
    """On the process that hands out the files (not on a pytest-xdist worker)."""
    return not hasattr(config, "workerinput")


def table_write(recorded: dict[str, Any], table: Path = TABLE) -> int:
    """Write the recorded seconds of the files that take ``KEPT_FROM_SECONDS`` or more to
    ``table``, longest first; answers how many."""
    kept = {
        name: round(float(seconds), 1)
        for name, seconds in sorted(recorded.items(), key=lambda pair: -float(pair[1]))
        if float(seconds) >= KEPT_FROM_SECONDS
    }
    table.write_text(json.dumps(kept, indent=1) + "\n")
    return len(kept)


def main() -> int:
    cached = ROOT / ".pytest_cache" / "v" / CACHE_KEY
    try:
        recorded = json.loads(cached.read_text())
    except (OSError, ValueError):
        sys.stderr.write(
            f"No durations recorded at {cached}: run the whole suite (bin/test) first; "
            "a run is recorded only when it passes.\n"
        )
        return 1
    written = table_write(recorded)
    total = sum(float(seconds) for seconds in recorded.values())
    sys.stdout.write(
        f"Wrote {written} of {len(recorded)} files ({total:.0f} s of tests in all, those of "
        f"{KEPT_FROM_SECONDS} s or more) to {TABLE.relative_to(ROOT)}.\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
