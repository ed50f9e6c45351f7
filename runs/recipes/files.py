"""Recipes as reviewed data files: one YAML file per recipe, loaded by ``manage.py load_recipes``.

The project's own recipes are in ``runs/recipes/``; a site may keep its own elsewhere and name
them on the command line. A file holds the fields of ``runs.services.recipes.RECIPE_FIELDS``: this module
only reads files and checks their shape (known fields, the right types); the rules of a valid
recipe are the services' (``recipe_validate``), so a file, the site's form, the API and the
admin all pass the same checks. It imports nothing from Django, as the trainer
(``trainers/tiny_moe/train.py``) reads its defaults from here too.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

RECIPES_DIR = Path(__file__).resolve().parent
SUFFIXES = (".yaml", ".yml")
MAX_FILE_BYTES = 256 * 1024

REQUIRED = (
    "name",
    "version",
    "title",
    "command_template",
    "default_config",
    "parameter_schema",
    "compute_model",
)
TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "version": (str, int),  # `version: 2` reads as a number; it is stored as text
    "title": (str,),
    "description": (str,),
    "command_template": (str, list),
    "launch": (dict,),
    "default_config": (dict,),
    "parameter_schema": (dict,),
    "compute_model": (dict,),
    "scales": (dict,),
    "executor": (str,),
    "metrics": (list,),
    "requires_labels": (list,),
    "verdict_rules": (list,),
    "resources": (dict,),
    "is_active": (bool,),
}
TYPE_NAMES = {
    str: "text",
    int: "a whole number",
    dict: "a mapping",
    list: "a list",
    bool: "true or false",
}


class RecipeFileError(Exception):
    """A recipe file that cannot be read as a recipe: its path and, per field, what is wrong."""

    def __init__(self, path: Path, problems: dict[str, list[str]]) -> None:
        self.path = path
        self.problems = problems
        super().__init__(recipe_file_problems(path, problems))


def recipe_file_problems(path: Path, problems: dict[str, list[str]]) -> str:
    """``path: field: message`` lines, one per problem."""
    return "\n".join(
        f"{path}: {field}: {message}" if field else f"{path}: {message}"
        for field, messages in problems.items()
        for message in messages
    )


def recipe_file_paths(paths: Iterable[Path]) -> list[Path]:
    """The recipe files named: files as given, folders as their ``*.yaml``/``*.yml`` files."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found.extend(sorted(p for p in path.iterdir() if p.suffix in SUFFIXES and p.is_file()))
        else:
            found.append(path)
    return found


class _NoAliasLoader(yaml.SafeLoader):
    """YAML's safe subset, without anchors and aliases (a small file cannot grow big)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.YAMLError(f"anchors and aliases are not accepted{event.start_mark}")
        return super().compose_node(parent, index)


def _type_ok(value: Any, allowed: tuple[type, ...]) -> bool:
    if isinstance(value, bool):  # to Python a bool is an int: `version: yes` is no version
        return bool in allowed
    return isinstance(value, allowed)


def recipe_file_read(path: Path) -> dict[str, Any]:
    """The recipe data a file defines; RecipeFileError naming the file and field otherwise."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise RecipeFileError(path, {"": [f"cannot be read: {exc.strerror or exc}"]}) from exc
    if len(raw) > MAX_FILE_BYTES:
        raise RecipeFileError(path, {"": [f"is over {MAX_FILE_BYTES // 1024} KiB"]})
    try:
        data = yaml.load(raw.decode("utf-8"), Loader=_NoAliasLoader)  # noqa: S506  (a safe loader)
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise RecipeFileError(path, {"": [f"is not valid YAML: {exc}"]}) from exc
    if not isinstance(data, dict):
        raise RecipeFileError(path, {"": ["must be a mapping of recipe fields (name: ..., ...)"]})
    problems: dict[str, list[str]] = {}
    for key in data:
        if key not in TYPES:
            known = ", ".join(TYPES)
            problems[str(key)] = [f"is not a recipe field (the fields are: {known})"]
    for key in REQUIRED:
        if key not in data:
            problems[key] = ["is required"]
    for key, allowed in TYPES.items():
        if key in data and not _type_ok(data[key], allowed):
            wanted = " or ".join(TYPE_NAMES[t] for t in allowed)
            problems.setdefault(key, []).append(f"must be {wanted}")
    if problems:
        raise RecipeFileError(path, problems)
    if isinstance(data["version"], int):
        data["version"] = str(data["version"])
    return data
