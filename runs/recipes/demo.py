"""The project's recipes as data, read from their reviewed files in ``runs/recipes/`` (the
files ``manage.py load_recipes`` registers); the demo data, the tests and the benchmarks use them.

``tiny-moe`` is sized for a laptop CPU (its trainer is ``trainers/tiny_moe/train.py``);
``marin-moe`` prices runs at the scale of Marin 535B-A23B on TPU v5p.
"""

from __future__ import annotations

from typing import Any

from runs.recipes.files import RECIPES_DIR, recipe_file_read
from runs.specs.compute import evaluate

TINY_MOE: dict[str, Any] = recipe_file_read(RECIPES_DIR / "tiny-moe.yaml")
MARIN_MOE: dict[str, Any] = recipe_file_read(RECIPES_DIR / "marin-moe.yaml")

DEMO_RECIPES = [TINY_MOE, MARIN_MOE]


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
# undertrained, the loss did not fall with size and the fit meant nothing. The ratio is far
# below Chinchilla's 20 so that the largest scale (the transformer at width 64, depth 2)
# trains in well under two minutes of one core; at 4 the three scales' losses fall on a
# power law of compute (bench/RESULTS.md, "ladder": R² >= 0.99 for two seeds).
# The steps are written out in runs/recipes/tiny-moe.yaml, the file a site loads;
# tests/runs/recipes/test_demo.py checks that they are ladder_scale's with this ratio.
TINY_TOKENS_PER_PARAM = 4
