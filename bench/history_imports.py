#!/usr/bin/env python
"""The importers of runs' histories, streamed: time and memory of a W&B history Parquet and
of a ``tracker_metrics.jsonl`` read through a ``file://`` URL onto a run.

    .venv/bin/python bench/history_imports.py                     # 100k steps, 3 rounds
    .venv/bin/python bench/history_imports.py --steps 300000 --rounds 1

Steps: create the database ``h_imports`` if missing and migrate it; write a W&B-style
history Parquet (``_step``, ``_runtime``, ``_timestamp``, ``train/loss``,
``throughput/mfu``, ``throughput/tokens_per_second`` every step and
``eval/paloma/c4_en/bpb`` every 10th, NaN elsewhere; row groups of 10,000) and the same
history as Levanter's ``json_logger`` lines. Each round imports a speedrun result to make a
fresh run, then each file onto it in its own child process (``manage.py import_history``,
so the peak RSS is that import's alone). Prints wall time, points per second and the
child's peak RSS; the memory claim is that the peak does not grow with the file (compare
--steps). Writes nothing to RESULTS.md: copy the figures there by hand.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ADMIN_URL = os.environ.get("BENCH_ADMIN_URL", "postgres://postgres@127.0.0.1:5432/postgres")
DATABASE = "h_imports"
SPEEDRUN = (
    ROOT / "tests/fixtures/speedrun/experiments/speedrun/adamw_llama_scaling/130m/"
    "speedrun_results.json"
)


def ensure_database() -> str:
    import psycopg

    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone():
            conn.execute(f'CREATE DATABASE "{DATABASE}"')
    return ADMIN_URL.rsplit("/", 1)[0] + f"/{DATABASE}"


def write_files(folder: Path, steps: int) -> tuple[Path, Path, int]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = folder / "history.parquet"
    jsonl = folder / "tracker_metrics.jsonl"
    writer = None
    points = 0
    with jsonl.open("w") as lines:
        for start in range(0, steps, 10_000):
            chunk = range(start, min(start + 10_000, steps))
            loss = [4.0 / math.sqrt(1 + s) for s in chunk]
            bpb = [1.5 - s * 1e-6 if s % 10 == 0 else math.nan for s in chunk]
            table = pa.table(
                {
                    "_step": pa.array(list(chunk), pa.int64()),
                    "_runtime": [s * 0.5 for s in chunk],
                    "_timestamp": [1.75e9 + s * 0.5 for s in chunk],
                    "train/loss": loss,
                    "throughput/mfu": [45.0 + (s % 7) for s in chunk],
                    "throughput/tokens_per_second": [1.0e6 + s for s in chunk],
                    "eval/paloma/c4_en/bpb": bpb,
                }
            )
            writer = writer or pq.ParquetWriter(parquet, table.schema)
            writer.write_table(table, row_group_size=10_000)
            for i, s in enumerate(chunk):
                metrics: dict[str, Any] = {
                    "train": {"loss": loss[i]},
                    "throughput": {"mfu": 45.0 + (s % 7), "tokens_per_second": 1.0e6 + s},
                }
                if s % 10 == 0:
                    metrics["eval"] = {"paloma": {"c4_en": {"bpb": bpb[i]}}}
                    points += 1
                points += 3
                record = {"tracker": "json_logger", "event": "log", "step": s, "metrics": metrics}
                lines.write(json.dumps(record) + "\n")
    assert writer is not None
    writer.close()
    return parquet, jsonl, points


def manage(env: dict[str, str], *args: str) -> tuple[float, float, str]:
    """Wall seconds, this child's own peak RSS in MB (``wait4``), and its output."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.monotonic()
        child = subprocess.Popen(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=env, stdout=out, stderr=err
        )
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.monotonic() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text = out.read()
        if child.returncode not in (0, 1):
            raise SystemExit(f"{args} failed:\n{text}\n{err.read()}")
    return wall, usage.ru_maxrss / 1024, text


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    env = {**os.environ, "DATABASE_URL": ensure_database(), "DJANGO_SETTINGS_MODULE": ""}
    env.pop("DJANGO_SETTINGS_MODULE")
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True
    )
    figures: dict[str, list[tuple[float, float]]] = {"wandb_history": [], "tracker_metrics": []}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        parquet, jsonl, points = write_files(folder, args.steps)
        print(
            f"{args.steps} steps, {points} points: Parquet {parquet.stat().st_size / 1e6:.1f} MB, "
            f"JSONL {jsonl.stat().st_size / 1e6:.1f} MB"
        )
        for round_ in range(args.rounds):
            for kind, path in (("wandb_history", parquet), ("tracker_metrics", jsonl)):
                result = json.loads(SPEEDRUN.read_text())
                tag = f"bench-{time.time_ns()}"
                result["runs"][0]["run_info"]["wandb_run_link"] = (
                    f"https://wandb.ai/bench/imports/runs/{tag}"
                )
                source = folder / "experiments/speedrun/bench/130m/speedrun_results.json"
                source.parent.mkdir(parents=True, exist_ok=True)
                source.write_text(json.dumps(result))
                out = manage(env, "import_history", "speedrun", str(source))[2]
                run = out.split(": run ", 1)[1].split(" ", 1)[0]
                option = (
                    f"wandb_run=bench/imports/{tag}" if kind == "wandb_history" else f"run={run}"
                )
                wall, peak, text = manage(
                    env, "import_history", kind, f"file://{path}", "-o", option
                )
                figures[kind].append((wall, peak))
                print(
                    f"round {round_ + 1} {kind}: {wall:.1f} s, {points / wall:,.0f} points/s, "
                    f"peak RSS {peak:.0f} MB; {text.strip().splitlines()[-1]}"
                )
    for kind, rows in figures.items():
        walls = [w for w, _ in rows]
        print(
            f"{kind}: median {statistics.median(walls):.1f} s "
            f"({points / statistics.median(walls):,.0f} points/s), peak RSS {max(p for _, p in rows):.0f} MB"
        )


if __name__ == "__main__":
    main()
