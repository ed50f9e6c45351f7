"""Register recipes from their reviewed YAML files: the production way to get recipes.

``manage.py load_recipes`` loads ``runs/recipes/``; ``manage.py load_recipes PATH ...`` loads
the files and folders named. Each recipe (by name and version) is created, updated to match its
file, or left as it is, and the command says which; running it twice changes nothing. Every
file goes through the recipe services' validation; if any file is refused, the command names
the file and the field and writes nothing at all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from runs.recipes.files import (
    RECIPES_DIR,
    RecipeFileError,
    recipe_file_paths,
    recipe_file_problems,
    recipe_file_read,
)
from runs.services.recipes import recipe_load


def _shown(path: Path) -> Path:
    try:
        return path.resolve().relative_to(Path.cwd())
    except ValueError:
        return path


def _problems(exc: ValidationError) -> dict[str, list[str]]:
    if hasattr(exc, "error_dict"):
        return {
            "" if field == "__all__" else field: messages
            for field, messages in exc.message_dict.items()
        }
    return {"": exc.messages}


class Command(BaseCommand):
    help = (
        "Create or update recipes from reviewed YAML files (default: runs/recipes/). "
        "Idempotent; if any file is invalid, nothing is written."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "paths",
            nargs="*",
            type=Path,
            help="recipe files, or folders of *.yaml files (default: runs/recipes/)",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="check every file and say what would change; write nothing",
        )

    def handle(self, *args: Any, paths: list[Path], dry_run: bool, **options: Any) -> None:
        files = recipe_file_paths(paths or [RECIPES_DIR])
        if not files:
            raise CommandError(f"no recipe files (*.yaml, *.yml) in {', '.join(map(str, paths))}")
        problems: list[str] = []
        done: list[tuple[str, str, Path]] = []
        seen: dict[tuple[str, str], Path] = {}
        with transaction.atomic():
            for path in files:
                shown = _shown(path)
                try:
                    data = recipe_file_read(path)
                except RecipeFileError as exc:
                    problems.append(recipe_file_problems(shown, exc.problems))
                    continue
                key = (data["name"], data["version"])
                if key in seen:
                    problems.append(
                        f"{shown}: name: {key[0]} version {key[1]} is also defined in {seen[key]}"
                    )
                    continue
                seen[key] = shown
                try:
                    with transaction.atomic():  # a refused file leaves the others checkable
                        recipe, outcome = recipe_load(actor=None, data=data)
                except ValidationError as exc:
                    problems.append(recipe_file_problems(shown, _problems(exc)))
                    continue
                done.append((outcome, str(recipe), shown))
            if problems or dry_run:
                transaction.set_rollback(True)
        if problems:
            count = len(problems)
            raise CommandError(
                f"{count} recipe file{'s' if count > 1 else ''} refused; nothing was written.\n"
                + "\n".join(problems)
            )
        would = "would be " if dry_run else ""
        for outcome, label, shown in done:
            self.stdout.write(f"{label}: {would}{outcome} ({shown})")
        counts = {name: sum(1 for o, _, _ in done if o == name) for name in ("created", "updated")}
        unchanged = len(done) - sum(counts.values())
        summary = (
            f"{len(done)} recipe{'s' if len(done) != 1 else ''}: {counts['created']} {would}created, "
            f"{counts['updated']} {would}updated, {unchanged} unchanged"
        )
        self.stdout.write(
            self.style.SUCCESS(summary + (" (dry run: nothing written)" if dry_run else ""))
        )
