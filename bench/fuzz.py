#!/usr/bin/env python
"""The door fuzz (tests/system/test_door_fuzz.py) run longer: more input classes per field
and several seeds, with counts by door and status and the peak memory of the process that
served every request (the site runs in the test's process: the figure is the web process's
plus pytest's, an upper bound).

    .venv/bin/python bench/fuzz.py                    # every class per field, seeds 1-3
    .venv/bin/python bench/fuzz.py --seeds 1 --classes 8 --record

Targets (issue #29): no answer of 500 at any door; peak memory under 150 MB. ``--record``
writes the figures to bench/RESULTS.md under "## fuzz (bench/fuzz.py)".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## fuzz (bench/fuzz.py)"
MEMORY_TARGET_MB = 150


def run_seed(seed: int, classes: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        env = {
            **os.environ,
            "DOOR_FUZZ_SEED": str(seed),
            "DOOR_FUZZ_CLASSES": str(classes),
            "DOOR_FUZZ_REPORT": str(report),
            "TEST_DATABASE_NAME": os.environ.get("TEST_DATABASE_NAME", "test_bench_fuzz"),
        }
        started = time.monotonic()
        done = subprocess.run(
            [
                str(ROOT / ".venv" / "bin" / "pytest"),
                "tests/system/test_door_fuzz.py",
                "tests/system/test_door_fuzz_forms.py",
                "tests/system/test_door_fuzz_api.py",
                "-q",
                "-p",
                "no:cacheprovider",
                "-n",
                "0",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        seconds = time.monotonic() - started
        data = json.loads(report.read_text()) if report.exists() else {}
    if done.returncode != 0:
        sys.stdout.write(done.stdout[-4000:])
    return {"seed": seed, "seconds": seconds, "passed": done.returncode == 0, "parts": data}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--classes", type=int, default=25, help="input classes per field")
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()

    statuses: dict[str, Counter[str]] = {}
    failures: list[str] = []
    peak = 0.0
    before = 0.0
    total = 0
    seconds = 0.0
    for seed in range(1, args.seeds + 1):
        result = run_seed(seed, args.classes)
        seconds += result["seconds"]
        for part in result["parts"].values():
            total += part["requests"]
            peak = max(peak, part["peak_rss_mb"])
            before = max(before, part.get("rss_before_mb", 0.0))
            failures += part["failures"]
            for door, by_status in part["by_door"].items():
                statuses.setdefault(door, Counter()).update(by_status)
        print(
            f"seed {seed}: {'passed' if result['passed'] else 'FAILED'} in {result['seconds']:.0f} s"
        )

    five = sum(n for counts in statuses.values() for s, n in counts.items() if s.startswith("5"))
    lines = [
        f"{total} requests over {len(statuses)} doors, {args.seeds} seeds, {args.classes} classes"
        f" per field, {seconds:.0f} s; answers of 5xx: {five} (target 0); refusals that "
        f"stored a row or did not name the field, or taken values the policy refuses: "
        f"{len(failures)}. Memory of the process serving the requests (pytest and the site in "
        f"one process, so an upper bound of a web process's): {before:.0f} MB before the "
        f"fuzz, peak {peak:.0f} MB, growth {peak - before:.0f} MB (target: a web process "
        f"under {MEMORY_TARGET_MB} MB).",
        "",
        "| door | answers by status |",
        "|---|---|",
    ]
    for door, counts in sorted(statuses.items()):
        cells = ", ".join(f"{status}: {n}" for status, n in sorted(counts.items()))
        lines.append(f"| {door} | {cells} |")
    print("\n".join(lines))
    for failure in failures[:30]:
        print("  failure:", failure)
    if args.record:
        record(lines)


def record(lines: list[str]) -> None:
    path = ROOT / "bench" / "RESULTS.md"
    text = path.read_text()
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    block = f"### {stamp}\n\n" + "\n".join(lines) + "\n"
    if SECTION not in text:
        text = text.rstrip("\n") + f"\n\n{SECTION}\n\nIssue #29: the door fuzz run long.\n\n"
        text += block
    else:
        head, _, tail = text.partition(SECTION)
        intro, sep, rest = tail.partition("\n### ")
        text = head + SECTION + intro + block + "\n" + (sep.lstrip("\n") + rest if sep else "")
    path.write_text(text)


if __name__ == "__main__":
    main()
