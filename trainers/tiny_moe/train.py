"""A tiny mixture-of-experts transformer that really trains, on one CPU core, with numpy.

The ``tiny-moe`` recipe's entrypoint: ``python -m trainers.tiny_moe --config config.json``.
Byte-level next-token prediction with a small decoder-only transformer (causal multi-head
attention, learned positions, pre-norm blocks whose feed-forward layers are token-choice
mixtures of experts: router top-k, capacity limit, load-balancing loss; ``trainers.tiny_moe.model``)
on the Python standard library's own source, cut into two sources mixed by ``data_mix``:
``code`` and ``docs`` (its docstrings and comments; ``trainers.tiny_moe.data``). Trained with AdamW
(linear warm-up, cosine decay, gradient clipping); the backward pass is written by hand.

Reports ``train/loss``, ``eval/loss`` (held-out files, the same windows of each source
whatever the mix, averaged over the sources; ``eval/code/loss`` and ``eval/docs/loss`` each),
``throughput/tokens_per_second``, ``throughput/mfu`` (model FLOP/s, attention included, over
the stated ``peak_flops``, in percent as Levanter logs it), ``moe/drop_fraction`` (a fraction,
0-1, as Marin's expert-parallel loop logs it) and ``moe/load_balance_loss`` through
``marin_client.client``, prints its progress, and writes ``tracker_metrics.jsonl`` (``config`` and
``summary``, as Levanter does). Same config and seed, same losses. Exit code 2 means the
config was refused.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

# The matrices are small: BLAS threads only fight each other (and other runs) for the cores.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
from marin_client.client import RunClient

from trainers.tiny_moe.data import SOURCES, CorpusError, eval_batches, load_corpus, sample_batch
from trainers.tiny_moe.model import TinyTransformer, flops_per_token, param_count

# The recipe's defaults (runs/recipes/tiny-moe.yaml; a test keeps the two equal), written out
# so the trainer needs numpy only, plus the trainer's own knobs.
DEFAULTS: dict[str, Any] = {
    "learning_rate": 0.003,
    "weight_decay": 0.0,
    "num_experts": 4,
    "top_k": 1,
    "capacity_factor": 1.0,
    "load_balance_coef": 0.01,
    "width": 64,
    "depth": 2,
    "steps": 200,
    "batch_size": 16,
    "seq_len": 64,
    "vocab_size": 256,
    "seed": 0,
    "data_mix": {"code": 0.7, "docs": 0.3},
    "head_dim": 16,
    "warmup_fraction": 0.1,
    "min_lr_fraction": 0.1,
    "grad_clip": 1.0,
    "eval_every": 25,
    "eval_rows": 32,
    "log_every": 10,
    "peak_flops": 1.0e11,
}
MAX_SEQ_LEN = 1024
POSITIVE_INTEGERS = (
    "width",
    "depth",
    "steps",
    "batch_size",
    "seq_len",
    "num_experts",
    "top_k",
    "head_dim",
    "eval_every",
    "eval_rows",
    "log_every",
)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def validate(cfg: dict[str, Any]) -> list[str]:
    """What is wrong with a resolved config (an empty list when it can be trained)."""
    problems = []
    for key in POSITIVE_INTEGERS:
        value = cfg.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(f"{key} must be a positive integer")
    if not problems:
        if cfg["top_k"] > cfg["num_experts"]:
            problems.append("top_k cannot exceed num_experts")
        if cfg["seq_len"] > MAX_SEQ_LEN:
            problems.append(f"seq_len must be at most {MAX_SEQ_LEN}")
        if cfg["width"] % cfg["head_dim"]:
            problems.append(f"width must be a multiple of head_dim ({cfg['head_dim']})")
    if cfg.get("vocab_size") != 256:
        problems.append("vocab_size must be 256 (the tokens are bytes)")
    if not isinstance(cfg.get("seed"), int) or isinstance(cfg.get("seed"), bool):
        problems.append("seed must be an integer")
    mix = cfg.get("data_mix")
    if not isinstance(mix, dict) or not mix or any(name not in SOURCES for name in mix):
        problems.append(f"data_mix must weigh some of: {', '.join(SOURCES)}")
    elif not all(_number(w) and w >= 0 for w in mix.values()):
        problems.append("data_mix weights must be numbers of at least 0")
    elif sum(mix.values()) <= 0:
        problems.append("data_mix weights must not all be zero")
    for key in ("learning_rate", "capacity_factor", "peak_flops"):
        if not _number(cfg.get(key)) or cfg[key] <= 0:
            problems.append(f"{key} must be a positive number")
    for key in ("weight_decay", "load_balance_coef", "grad_clip"):
        if not _number(cfg.get(key)) or cfg[key] < 0:
            problems.append(f"{key} must be a number of at least 0")
    for key in ("warmup_fraction", "min_lr_fraction"):
        if not _number(cfg.get(key)) or not 0 <= cfg[key] <= 1:
            problems.append(f"{key} must be a number from 0 to 1")
    return problems


def learning_rate(cfg: dict[str, Any], step: int) -> float:
    """Linear warm-up over ``warmup_fraction`` of the steps, then cosine decay to
    ``min_lr_fraction`` of the peak at the last step (``step`` counts from 1)."""
    peak, steps = cfg["learning_rate"], cfg["steps"]
    warmup = max(1, round(cfg["warmup_fraction"] * steps))
    if step <= warmup:
        return peak * step / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    floor = cfg["min_lr_fraction"]
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def evaluate(model: TinyTransformer, batches: dict[str, np.ndarray]) -> dict[str, float]:
    losses = {f"eval/{s}/loss": model.loss_and_grads(b, grads=False)[0] for s, b in batches.items()}
    losses["eval/loss"] = float(np.mean(list(losses.values())))
    return losses


def _say(text: str, stream: Any = None) -> None:
    """A progress line on the run's log (the executor captures stdout and stderr)."""
    stream = stream or sys.stdout
    stream.write(text + "\n")
    stream.flush()


def train(cfg: dict[str, Any], client: RunClient | None, out_dir: Path) -> dict[str, float]:
    """Train ``cfg`` (validated) and return the last value of every metric, plus run_seconds."""
    started = time.perf_counter()
    corpus = load_corpus()
    rng = np.random.default_rng(cfg["seed"])
    held_out = eval_batches(corpus, cfg["eval_rows"], cfg["seq_len"])
    model = TinyTransformer(cfg, rng)
    params = model.params
    moments = {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in params.items()}
    decayed = {k for k, v in params.items() if v.ndim >= 2}  # not the norms' gains
    beta1, beta2 = 0.9, 0.95
    tokens_per_step = cfg["batch_size"] * cfg["seq_len"]
    flops_per_step = flops_per_token(cfg) * tokens_per_step
    _say(
        f"tiny-moe: {len(corpus.files)} standard-library files, "
        + ", ".join(f"{s} {len(corpus.train[s]):,}/{len(corpus.eval[s]):,}" for s in SOURCES)
        + " bytes train/eval; "
        f"{param_count(cfg, active=True):,} active of {param_count(cfg, active=False):,} "
        f"parameters; {cfg['steps']} steps of {tokens_per_step} tokens"
    )
    summary: dict[str, float] = {}
    for step in range(1, cfg["steps"] + 1):
        tick = time.perf_counter()
        batch, _ = sample_batch(
            corpus.train, cfg["data_mix"], cfg["batch_size"], cfg["seq_len"], rng
        )
        loss, grads, stats = model.loss_and_grads(batch)
        if not math.isfinite(loss):
            raise FloatingPointError(f"train/loss became {loss} at step {step}")
        norm = math.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads.values()))
        clip = min(1.0, cfg["grad_clip"] / (norm + 1e-12)) if cfg["grad_clip"] > 0 else 1.0
        lr = learning_rate(cfg, step)
        for name, raw in grads.items():
            m, v = moments[name]
            grad = raw * clip
            m *= beta1
            m += (1 - beta1) * grad
            v *= beta2
            v += (1 - beta2) * grad * grad
            if name in decayed:
                params[name] *= 1 - lr * cfg["weight_decay"]
            params[name] -= (lr / (1 - beta1**step)) * m / (np.sqrt(v / (1 - beta2**step)) + 1e-8)
        seconds = max(time.perf_counter() - tick, 1e-9)
        metrics = {
            "train/loss": loss,
            "throughput/tokens_per_second": tokens_per_step / seconds,
            "throughput/mfu": 100.0 * flops_per_step / seconds / cfg["peak_flops"],
            "moe/drop_fraction": stats.drop_fraction,
            "moe/load_balance_loss": stats.balance_loss / cfg["depth"],
        }
        if step % cfg["eval_every"] == 0 or step == cfg["steps"]:
            metrics.update(evaluate(model, held_out))
        summary.update(metrics)
        if client is not None:
            client.log_many(metrics, step)
        if step % cfg["log_every"] == 0 or step == cfg["steps"] or "eval/loss" in metrics:
            _say(
                f"step {step}/{cfg['steps']} train/loss {loss:.4f}"
                + (f" eval/loss {metrics['eval/loss']:.4f}" if "eval/loss" in metrics else "")
                + f" drop {stats.drop_fraction:.3f} lr {lr:.2e}"
                f" {metrics['throughput/tokens_per_second']:,.0f} tokens/s"
            )
    summary["run_seconds"] = time.perf_counter() - started
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Train the tiny MoE transformer on a CPU.")
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--output", type=Path, default=Path())
    args = parser.parse_args(argv)
    try:
        given = json.loads(args.config.read_text())
    except (OSError, ValueError) as exc:
        _say(f"tiny-moe: cannot read the config: {exc}", sys.stderr)
        return 2
    client = RunClient.from_env(spill_path=args.output / "unsent_metrics.jsonl")
    cfg = {**DEFAULTS, **given} if isinstance(given, dict) else {}
    problems = validate(cfg) if cfg else ["the config must be a JSON object"]
    if problems:
        _say(f"tiny-moe: refused: {'; '.join(problems)}", sys.stderr)
        if client is not None:
            client.finish("failed", failure_kind="config", message="; ".join(problems))
        return 2
    if client is not None:
        client.start()
    try:
        summary = train(cfg, client, args.output)
    except CorpusError as exc:  # this machine's standard library, not the run's code
        _say(f"tiny-moe: {exc}", sys.stderr)
        if client is not None:
            client.finish("failed", failure_kind="infra", message=str(exc))
        return 1
    except Exception as exc:
        if client is not None:
            client.finish("failed", failure_kind="code", message=f"{type(exc).__name__}: {exc}")
        raise
    line = json.dumps({"config": cfg, "summary": summary})
    with (args.output / "tracker_metrics.jsonl").open("a") as tracker:
        tracker.write(line + "\n")
    if client is not None:
        client.import_tracker_metrics(line)
        client.finish("finished")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
