"""A tiny mixture-of-experts language model that really trains, on a CPU, with numpy.

The ``tiny-moe`` recipe's entrypoint: ``python -m runs.tiny_moe --config config.json``.
Byte-level next-token prediction on a corpus generated here from several sources (prose-like
``web``, ``code`` and ``math`` text) mixed by ``data_mix``. Each layer is a token-choice MoE
feed-forward block (router, top-k, capacity limit: tokens over an expert's capacity are
dropped and pass through the residual) trained with AdamW. Reports ``train/loss``,
``eval/loss``, ``throughput/tokens_per_second``, ``throughput/mfu`` (model FLOP/s over the
stated ``peak_flops``) and ``moe/drop_fraction`` through ``runs.client``, and writes
``tracker_metrics.jsonl`` (``config`` and ``summary``, as Levanter does). Exit code 2 means
the config was refused.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path
from typing import Any

# The matrices are small: BLAS threads only fight each other (and other runs) for the cores.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

from runs.client import RunClient

# The recipe's defaults (runs/recipes/tiny-moe.yaml; a test keeps the two equal), written out
# so the trainer needs numpy only, plus the trainer's own knobs.
DEFAULTS: dict[str, Any] = {
    "learning_rate": 0.003,
    "weight_decay": 0.0,
    "num_experts": 4,
    "top_k": 1,
    "capacity_factor": 1.0,
    "width": 64,
    "depth": 2,
    "steps": 200,
    "batch_size": 16,
    "seq_len": 64,
    "vocab_size": 256,
    "seed": 0,
    "data_mix": {"web": 0.6, "code": 0.3, "math": 0.1},
    "eval_every": 25,
    "peak_flops": 1.0e11,
}

WORDS = [
    "the",
    "model",
    "data",
    "train",
    "loss",
    "open",
    "expert",
    "router",
    "token",
    "mixture",
    "scale",
    "run",
    "result",
    "public",
    "experiment",
    "hypothesis",
    "baseline",
    "budget",
    "review",
    "learning",
    "rate",
    "weight",
    "decay",
    "capacity",
]
CODE_LINES = (
    "def f(x):\n    return x + 1\n",
    "for i in range(10):\n    total += i\n",
    "if loss < best:\n    best = loss\n",
    "import numpy as np\n",
    "class Expert:\n    pass\n",
)


def make_corpus(seed: int, size: int = 60_000) -> dict[str, np.ndarray]:
    """Three sources with different statistics, deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    web = " ".join(rng.choice(WORDS, size // 5)) + ". "
    code = "".join(rng.choice(CODE_LINES, size // 25))
    math_text = "".join(
        f"{a}+{b}={a + b}; {a}*{b}={a * b}\n"
        for a, b in rng.integers(0, 100, size=(size // 16, 2)).tolist()
    )
    return {
        name: np.frombuffer(text.encode()[:size], dtype=np.uint8).astype(np.int64)
        for name, text in {"web": web, "code": code, "math": math_text}.items()
    }


def sample_batch(
    corpus: dict[str, np.ndarray], mix: dict[str, float], batch: int, seq: int, rng: Any
) -> np.ndarray:
    names = [n for n, w in mix.items() if w > 0]
    weights = np.array([mix[n] for n in names], dtype=float)
    sources = rng.choice(len(names), size=batch, p=weights / weights.sum())
    rows = []
    for source in sources:
        text = corpus[names[source]]
        start = rng.integers(0, len(text) - seq - 1)
        rows.append(text[start : start + seq + 1])
    return np.stack(rows)


class TinyMoE:
    def __init__(self, cfg: dict[str, Any], rng: Any) -> None:
        d, v, e = cfg["width"], cfg["vocab_size"], cfg["num_experts"]
        self.cfg = cfg
        scale = 1.0 / math.sqrt(d)
        self.params: dict[str, np.ndarray] = {
            "embed": rng.normal(0, 0.5, (v, d)),
            "prev": rng.normal(0, 0.5, (v, d)),
            "out": rng.normal(0, scale, (d, v)),
        }
        for layer in range(cfg["depth"]):
            self.params[f"router{layer}"] = rng.normal(0, scale, (d, e))
            self.params[f"w1_{layer}"] = rng.normal(0, scale, (e, d, 4 * d))
            self.params[f"w2_{layer}"] = rng.normal(0, 0.5 / math.sqrt(4 * d), (e, 4 * d, d))

    def loss_and_grads(
        self, tokens: np.ndarray, *, grads: bool = True
    ) -> tuple[float, dict[str, np.ndarray], float]:
        """Cross-entropy of predicting each next byte; returns loss, grads, drop fraction."""
        p, cfg = self.params, self.cfg
        x, prev, y = tokens[:, 1:-1], tokens[:, :-2], tokens[:, 2:]
        x, prev, y = x.reshape(-1), prev.reshape(-1), y.reshape(-1)
        n = x.shape[0]
        h = p["embed"][x] + p["prev"][prev]
        caches = []
        dropped = assigned = 0
        for layer in range(cfg["depth"]):
            out, cache, layer_dropped = self._moe_forward(layer, h)
            caches.append(cache)
            dropped += layer_dropped
            assigned += n * cfg["top_k"]
            h = out
        logits = h @ p["out"]
        logits -= logits.max(axis=1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=1, keepdims=True)
        loss = float(-np.log(probs[np.arange(n), y] + 1e-12).mean())
        drop_fraction = dropped / max(assigned, 1)
        if not grads:
            return loss, {}, drop_fraction
        g: dict[str, np.ndarray] = {}
        dlogits = probs
        dlogits[np.arange(n), y] -= 1
        dlogits /= n
        g["out"] = h.T @ dlogits
        dh = dlogits @ p["out"].T
        for layer in reversed(range(cfg["depth"])):
            dh = self._moe_backward(layer, dh, caches[layer], g)
        g["embed"] = np.zeros_like(p["embed"])
        g["prev"] = np.zeros_like(p["prev"])
        np.add.at(g["embed"], x, dh)
        np.add.at(g["prev"], prev, dh)
        return loss, g, drop_fraction

    def _moe_forward(self, layer: int, h: np.ndarray) -> tuple[np.ndarray, dict[str, Any], int]:
        p, cfg = self.params, self.cfg
        n, e, k = h.shape[0], cfg["num_experts"], cfg["top_k"]
        logits = h @ p[f"router{layer}"]
        logits -= logits.max(axis=1, keepdims=True)
        gate_probs = np.exp(logits)
        gate_probs /= gate_probs.sum(axis=1, keepdims=True)
        chosen = np.argsort(-gate_probs, axis=1)[:, :k]
        capacity = max(1, math.ceil(cfg["capacity_factor"] * n * k / e))
        out = h.copy()
        experts = []
        dropped = 0
        for expert in range(e):
            rows, slots = np.nonzero(chosen == expert)
            order = np.argsort(rows, kind="stable")
            rows, slots = rows[order], slots[order]
            dropped += max(0, len(rows) - capacity)
            rows, slots = rows[:capacity], slots[:capacity]
            gate = gate_probs[rows, expert]
            pre = h[rows] @ p[f"w1_{layer}"][expert]
            act = np.maximum(pre, 0)
            y = act @ p[f"w2_{layer}"][expert]
            out[rows] += gate[:, None] * y
            experts.append((rows, gate, pre, act, y))
        return out, {"h": h, "probs": gate_probs, "experts": experts}, dropped

    def _moe_backward(
        self, layer: int, dout: np.ndarray, cache: dict[str, Any], g: dict[str, np.ndarray]
    ) -> np.ndarray:
        p = self.params
        h, probs = cache["h"], cache["probs"]
        dh = dout.copy()
        dprobs = np.zeros_like(probs)
        w1, w2 = p[f"w1_{layer}"], p[f"w2_{layer}"]
        dw1, dw2 = np.zeros_like(w1), np.zeros_like(w2)
        for expert, (rows, gate, pre, act, y) in enumerate(cache["experts"]):
            if len(rows) == 0:
                continue
            dy_rows = dout[rows]
            dprobs[rows, expert] += (dy_rows * y).sum(axis=1)
            dy = dy_rows * gate[:, None]
            dw2[expert] = act.T @ dy
            dpre = (dy @ w2[expert].T) * (pre > 0)
            dw1[expert] = h[rows].T @ dpre
            dh[rows] += dpre @ w1[expert].T
        dlogits = probs * (dprobs - (dprobs * probs).sum(axis=1, keepdims=True))
        g[f"router{layer}"] = h.T @ dlogits
        g[f"w1_{layer}"], g[f"w2_{layer}"] = dw1, dw2
        return dh + dlogits @ p[f"router{layer}"].T


def active_params(cfg: dict[str, Any]) -> float:
    d = cfg["width"]
    return (
        cfg["depth"] * (cfg["num_experts"] * d + cfg["top_k"] * 8 * d * d)
        + 3 * cfg["vocab_size"] * d
    )


def validate(cfg: dict[str, Any]) -> list[str]:
    problems = []
    for key in ("width", "depth", "steps", "batch_size", "seq_len", "num_experts", "top_k"):
        if not isinstance(cfg.get(key), int) or cfg[key] < 1:
            problems.append(f"{key} must be a positive integer")
    if not problems and cfg["top_k"] > cfg["num_experts"]:
        problems.append("top_k cannot exceed num_experts")
    mix = cfg.get("data_mix")
    if not isinstance(mix, dict) or not mix or any(n not in ("web", "code", "math") for n in mix):
        problems.append("data_mix must weigh some of: web, code, math")
    elif sum(float(w) for w in mix.values()) <= 0:
        problems.append("data_mix weights must not all be zero")
    if not float(cfg.get("learning_rate", 0)) > 0:
        problems.append("learning_rate must be positive")
    return problems


def train(cfg: dict[str, Any], client: RunClient | None, out_dir: Path) -> dict[str, float]:
    rng = np.random.default_rng(cfg["seed"])
    corpus = make_corpus(cfg["seed"])
    eval_rng = np.random.default_rng(10_000 + cfg["seed"])
    eval_batch = sample_batch(corpus, cfg["data_mix"], 32, cfg["seq_len"], eval_rng)
    model = TinyMoE(cfg, rng)
    moments = {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in model.params.items()}
    lr, wd, beta1, beta2 = cfg["learning_rate"], cfg["weight_decay"], 0.9, 0.95
    tokens_per_step = cfg["batch_size"] * (cfg["seq_len"] - 1)
    flops_per_step = 6 * active_params(cfg) * tokens_per_step
    summary: dict[str, float] = {}
    started = time.perf_counter()
    for step in range(1, cfg["steps"] + 1):
        tick = time.perf_counter()
        batch = sample_batch(corpus, cfg["data_mix"], cfg["batch_size"], cfg["seq_len"], rng)
        loss, grads, drop = model.loss_and_grads(batch)
        if not math.isfinite(loss):
            raise FloatingPointError(f"train/loss became {loss} at step {step}")
        for name, grad in grads.items():
            m, v = moments[name]
            m *= beta1
            m += (1 - beta1) * grad
            v *= beta2
            v += (1 - beta2) * grad * grad
            m_hat = m / (1 - beta1**step)
            v_hat = v / (1 - beta2**step)
            model.params[name] *= 1 - lr * wd
            model.params[name] -= lr * m_hat / (np.sqrt(v_hat) + 1e-8)
        seconds = max(time.perf_counter() - tick, 1e-9)
        metrics = {
            "train/loss": loss,
            "throughput/tokens_per_second": tokens_per_step / seconds,
            "throughput/mfu": flops_per_step / seconds / cfg["peak_flops"],
            "moe/drop_fraction": drop,
        }
        if step % cfg["eval_every"] == 0 or step == cfg["steps"]:
            metrics["eval/loss"] = model.loss_and_grads(eval_batch, grads=False)[0]
        summary.update(metrics)
        if client is not None:
            client.log_many(metrics, step)
    summary["run_seconds"] = time.perf_counter() - started
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Train the tiny MoE on a CPU.")
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--output", type=Path, default=Path())
    args = parser.parse_args(argv)
    try:
        given = json.loads(args.config.read_text())
    except (OSError, ValueError):
        return 2
    cfg = {**DEFAULTS, **given}
    client = RunClient.from_env(spill_path=args.output / "unsent_metrics.jsonl")
    problems = validate(cfg)
    if problems:
        if client is not None:
            client.finish("failed", failure_kind="config", message="; ".join(problems))
        return 2
    if client is not None:
        client.start()
    try:
        summary = train(cfg, client, args.output)
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
