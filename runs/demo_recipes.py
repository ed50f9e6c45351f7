"""The recipes the demo data and the tests register: a tiny MoE and a Marin-scale MoE.

``tiny-moe`` is sized for a laptop CPU (its trainer is ``runs/tiny_moe.py``);
``marin-moe`` prices runs at the scale of Marin 535B-A23B on TPU v5p.
"""

from __future__ import annotations

from typing import Any

from runs.compute import evaluate

# The tiny trainer's first steps allocate: its throughput and MFU are the median from step 6
# (runs.steady reads a throughput key's declared warm-up).
TINY_WARMUP_STEPS = 5

TINY_MOE: dict[str, Any] = {
    "name": "tiny-moe",
    "version": "1",
    "title": "Tiny mixture-of-experts LM (CPU)",
    "description": (
        "A small mixture-of-experts language model that trains on a CPU in seconds, on a "
        "mix of generated data sources. Use it to try an ablation before asking for real compute."
    ),
    "command_template": "{python} -m runs.tiny_moe --config {config_path}",
    "default_config": {
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
    },
    "parameter_schema": {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "learning_rate": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            "weight_decay": {"type": "number", "minimum": 0, "maximum": 1},
            "num_experts": {"type": "integer", "minimum": 1, "maximum": 64},
            "top_k": {"type": "integer", "minimum": 1, "maximum": 8},
            "capacity_factor": {"type": "number", "minimum": 0.5, "maximum": 8},
            "width": {"type": "integer", "enum": [32, 64, 128, 256]},
            "steps": {"type": "integer", "minimum": 1, "maximum": 20000},
            "seed": {"type": "integer", "minimum": 0},
            "data_mix": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "web": {"type": "number", "minimum": 0, "maximum": 1},
                    "code": {"type": "number", "minimum": 0, "maximum": 1},
                    "math": {"type": "number", "minimum": 0, "maximum": 1},
                },
            },
        },
    },
    "compute_model": {
        "total_params": "depth * (4 * width ** 2 + num_experts * 8 * width ** 2) + 2 * vocab_size * width",
        "active_params": "depth * (4 * width ** 2 + top_k * 8 * width ** 2) + 2 * vocab_size * width",
        "tokens": "steps * batch_size * seq_len",
        "peak_flops_per_accelerator": 1.0e11,
        "assumed_mfu": 0.2,
        "accelerator": "CPU core",
    },
    "metrics": [
        {
            "key": "train/loss",
            "unit": "nats",
            "direction": "lower",
            "display": "Train loss",
            "column": True,
        },
        {
            "key": "eval/loss",
            "unit": "nats",
            "direction": "lower",
            "display": "Eval loss",
            "column": True,
        },
        {
            "key": "throughput/tokens_per_second",
            "unit": "tokens/s",
            "direction": "higher",
            "display": "Throughput",
            "column": True,
            "warmup_steps": TINY_WARMUP_STEPS,
        },
        {
            "key": "throughput/mfu",
            "unit": "fraction",
            "direction": "higher",
            "display": "MFU",
            "column": True,
            "warmup_steps": TINY_WARMUP_STEPS,
        },
        {
            "key": "moe/drop_fraction",
            "unit": "fraction",
            "direction": "lower",
            "display": "Dropped tokens",
            "column": True,
        },
        {"key": "run_seconds", "unit": "seconds", "direction": "lower", "display": "Run time"},
    ],
    "scales": {},  # filled below: each scale's steps follow its parameters
}


def ladder_scale(
    recipe: dict[str, Any], *, tokens_per_param: float, **sizes: int
) -> dict[str, Any]:
    """A scale of a compute-optimal style ladder: the model ``sizes`` and the steps that give
    ``tokens_per_param`` training tokens per active parameter, both as the recipe's compute
    model counts them (so FLOPs grow as parameters squared along the ladder)."""
    config = {**recipe["default_config"], **sizes}
    active = evaluate(recipe["compute_model"]["active_params"], config)
    tokens_per_step = evaluate(recipe["compute_model"]["tokens"], {**config, "steps": 1})
    return {**sizes, "steps": max(1, round(tokens_per_param * active / tokens_per_step))}


# Every scale of the tiny ladder trains on the same number of tokens per parameter, as
# compute-optimal ladders do: with one token budget for all, the larger models were
# undertrained, the loss did not fall with size and the fit meant nothing. The ratio is
# small because this model's loss floors after a few hundred steps; 1.5 keeps all three
# scales on the falling part (bench/RESULTS.md, "ladder": R² 0.99, the largest in seconds).
TINY_TOKENS_PER_PARAM = 1.5
TINY_MOE["scales"] = {
    name: ladder_scale(TINY_MOE, tokens_per_param=TINY_TOKENS_PER_PARAM, width=width, depth=depth)
    for name, (width, depth) in {"small": (32, 2), "medium": (64, 1), "large": (64, 2)}.items()
}

MARIN_MOE: dict[str, Any] = {
    "name": "marin-moe",
    "version": "1",
    "title": "Marin MoE (535B-A23B family) on TPU v5p",
    "description": (
        "The Marin mixture-of-experts family. Scales run the same recipe from 1B active "
        "parameters to the full 535B-A23B model; costs assume TPU v5p at 40% MFU."
    ),
    "command_template": "python -m marin.run --recipe moe --config {config_path}",
    "executor": "ray",  # Marin's own trainer, on the cluster; never on the site's machine
    "default_config": {
        "learning_rate": 0.0003,
        "weight_decay": 0.1,
        "z_loss": 0.0001,
        "capacity_factor": 1.25,
        "num_experts": 128,
        "top_k": 4,
        "active_params_b": 1.0,
        "total_params_b": 20.0,
        "tokens_b": 20.0,
        "warmup_fraction": 0.01,
        "seed": 0,
        "data_mix": {"nemotron_cc": 0.7, "starcoder": 0.2, "proofpile": 0.1},
    },
    "parameter_schema": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "learning_rate": {"type": "number", "exclusiveMinimum": 0, "maximum": 0.1},
            "weight_decay": {"type": "number", "minimum": 0, "maximum": 1},
            "z_loss": {"type": "number", "minimum": 0},
            "capacity_factor": {"type": "number", "minimum": 1, "maximum": 4},
            "top_k": {"type": "integer", "minimum": 1, "maximum": 16},
            "tokens_b": {"type": "number", "exclusiveMinimum": 0, "maximum": 20000},
            "warmup_fraction": {"type": "number", "minimum": 0, "maximum": 0.5},
            "seed": {"type": "integer", "minimum": 0},
            "data_mix": {
                "type": "object",
                "additionalProperties": {"type": "number", "minimum": 0},
            },
        },
    },
    "compute_model": {
        "total_params": "total_params_b * 1e9",
        "active_params": "active_params_b * 1e9",
        "tokens": "tokens_b * 1e9",
        "peak_flops_per_accelerator": 4.59e14,
        "assumed_mfu": 0.4,
        "accelerator": "TPU v5p chip",
    },
    "metrics": [
        {
            "key": "train/loss",
            "unit": "nats",
            "direction": "lower",
            "display": "Train loss",
            "column": True,
        },
        {
            "key": "eval/paloma/macro_loss",
            "unit": "nats",
            "direction": "lower",
            "display": "Paloma macro loss",
            "column": True,
        },
        {
            "key": "throughput/tokens_per_second",
            "unit": "tokens/s",
            "direction": "higher",
            "display": "Throughput",
            "column": True,
            "warmup_steps": 100,
        },
        {
            "key": "throughput/mfu",
            "unit": "percent",
            "logged_as": "fraction",
            "direction": "higher",
            "display": "MFU",
            "column": True,
            "warmup_steps": 100,
        },
        {
            "key": "moe/drop_fraction",
            "unit": "fraction",
            "direction": "lower",
            "display": "Dropped tokens",
            "column": True,
        },
        {"key": "eval/loss", "unit": "nats", "direction": "lower", "display": "Eval loss"},
    ],
    "scales": {
        "1b": {"active_params_b": 1.0, "total_params_b": 20.0, "tokens_b": 20.0},
        "8b": {"active_params_b": 8.0, "total_params_b": 160.0, "tokens_b": 160.0},
        "23b": {"active_params_b": 23.0, "total_params_b": 535.0, "tokens_b": 460.0},
    },
}

DEMO_RECIPES = [TINY_MOE, MARIN_MOE]
