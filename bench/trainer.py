#!/usr/bin/env python
"""Time the tiny MoE transformer's scales, offline, as a run would start them, and fit the
ladder they make.

    .venv/bin/python bench/trainer.py                       # 1 round of every scale
    .venv/bin/python bench/trainer.py --rounds 3 --scales small
    .venv/bin/python bench/trainer.py --cpu 0 --seed 1      # pinned to core 0, seed 1

Each round writes the recipe's default config merged with the scale (and ``--seed``) to a
fresh directory and runs ``python -m trainers.tiny_moe --config config.json`` there with no API
to report to (the trainer then only writes ``tracker_metrics.jsonl``), timing the whole
process, start-up and reading the standard library included: wall-clock and the child's CPU
time (user + system), which is what one core spends whatever else the machine is doing.
Prints every round, the median per scale, the scale's FLOPs as the recipe's compute model
prices them, and at the end the ladder's fit of final eval/loss against those FLOPs
(``runs.results.ladder.ladder_fit``: exponent, its standard error and R²). Targets: loss falling
with compute, R² >= 0.95, the largest scale under two minutes of one core.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marin_site.settings")
import django  # noqa: E402  (after the path is set)

django.setup()  # runs.results.ladder reads the site's models; nothing here touches the database

from runs.recipes.demo import TINY_MOE  # noqa: E402
from runs.results.ladder import ladder_fit  # noqa: E402
from runs.specs.compute import run_cost  # noqa: E402


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--scales", default=",".join(TINY_MOE["scales"]))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpu", type=int, default=None, help="pin the trainer to this core")
    args = parser.parse_args()
    print(
        f"machine: nproc={os.cpu_count()}, Python {sys.version.split()[0]}, load {os.getloadavg()}"
    )
    flops, losses = [], []
    for scale in args.scales.split(","):
        config = {**TINY_MOE["default_config"], **TINY_MOE["scales"][scale], "seed": args.seed}
        cost = run_cost(TINY_MOE["compute_model"], config)
        walls: list[float] = []
        cpus: list[float] = []
        loss = float("nan")
        for round_number in range(1, args.rounds + 1):
            with tempfile.TemporaryDirectory(prefix="bench-trainer-") as workdir:
                Path(workdir, "config.json").write_text(json.dumps(config))
                command = [sys.executable, "-m", "trainers.tiny_moe", "--config", "config.json"]
                if args.cpu is not None:
                    command = ["taskset", "-c", str(args.cpu), *command]
                cpu_before, started = _child_cpu(), time.perf_counter()
                subprocess.run(
                    command,
                    cwd=workdir,
                    env={"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "/usr/bin")},
                    check=True,
                    capture_output=True,
                )
                walls.append(time.perf_counter() - started)
                cpus.append(_child_cpu() - cpu_before)
                lines = Path(workdir, "tracker_metrics.jsonl").read_text().splitlines()
                loss = json.loads(lines[-1])["summary"]["eval/loss"]
            print(
                f"{scale} round {round_number}: {walls[-1]:.1f} s wall, {cpus[-1]:.1f} s CPU, "
                f"eval/loss {loss:.4f}",
                flush=True,
            )
        print(
            f"{scale}: width {config['width']}, depth {config['depth']}, {config['steps']} steps, "
            f"{cost.active_params:,.0f} active params, {cost.tokens:,.0f} tokens, "
            f"{cost.flops:.3g} FLOPs; median {statistics.median(walls):.1f} s wall, "
            f"{statistics.median(cpus):.1f} s CPU over {len(walls)} rounds; eval/loss {loss:.4f}",
            flush=True,
        )
        flops.append(cost.flops)
        losses.append(loss)
    fit = ladder_fit(flops, losses) if len(flops) >= 2 else None
    if fit is not None:
        print(
            f"fit ({fit.kind}, {fit.scales} scales): exponent {fit.exponent:.4f} "
            f"± {fit.exponent_se or float('nan'):.4f}, R² {fit.r_squared:.4f}, "
            f"clearly falling: {fit.clearly_falling}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
