#!/usr/bin/env python
"""Time the tiny MoE trainer's smallest scale, offline, as a run would start it.

    .venv/bin/python bench/trainer.py            # 3 rounds, every scale of the recipe
    .venv/bin/python bench/trainer.py --rounds 5 --scales small

Each round writes the recipe's default config merged with the scale to a fresh directory and
runs ``python -m runs.tiny_moe --config config.json`` there with no API to report to (the
trainer then only writes ``tracker_metrics.jsonl``), timing the whole process, start-up
included. Prints every round, the median per scale and the final eval loss; target: the
smallest scale under 30 s on this 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runs.demo_recipes import TINY_MOE  # noqa: E402  (after the path is set)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scales", default=",".join(TINY_MOE["scales"]))
    args = parser.parse_args()
    print(f"machine: nproc={os.cpu_count()}, Python {sys.version.split()[0]}")
    for scale in args.scales.split(","):
        config = {**TINY_MOE["default_config"], **TINY_MOE["scales"][scale]}
        seconds: list[float] = []
        loss = float("nan")
        for round_number in range(1, args.rounds + 1):
            with tempfile.TemporaryDirectory(prefix="bench-trainer-") as workdir:
                Path(workdir, "config.json").write_text(json.dumps(config))
                started = time.perf_counter()
                subprocess.run(
                    [sys.executable, "-m", "runs.tiny_moe", "--config", "config.json"],
                    cwd=workdir,
                    env={"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "/usr/bin")},
                    check=True,
                    capture_output=True,
                )
                seconds.append(time.perf_counter() - started)
                lines = Path(workdir, "tracker_metrics.jsonl").read_text().splitlines()
                loss = json.loads(lines[-1])["summary"]["eval/loss"]
            print(f"{scale} round {round_number}: {seconds[-1]:.1f} s, eval/loss {loss:.3f}")
        median = statistics.median(seconds)
        print(
            f"{scale}: median {median:.1f} s over {len(seconds)} rounds (width {config['width']})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
