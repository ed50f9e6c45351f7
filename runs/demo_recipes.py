"""The project's recipes as data, read from their reviewed files in ``runs/recipes/`` (the
files ``manage.py load_recipes`` registers); the demo data, the tests and the benchmarks use them.

``tiny-moe`` is sized for a laptop CPU (its trainer is ``runs/tiny_moe.py``);
``marin-moe`` prices runs at the scale of Marin 535B-A23B on TPU v5p.
"""

from __future__ import annotations

from typing import Any

from runs.recipe_files import RECIPES_DIR, recipe_file_read

TINY_MOE: dict[str, Any] = recipe_file_read(RECIPES_DIR / "tiny-moe.yaml")
MARIN_MOE: dict[str, Any] = recipe_file_read(RECIPES_DIR / "marin-moe.yaml")

DEMO_RECIPES = [TINY_MOE, MARIN_MOE]
