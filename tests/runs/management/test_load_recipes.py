"""manage.py load_recipes: reviewed recipe files in, idempotent, all or nothing."""

from __future__ import annotations

import shlex
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import CommandError, call_command

from runs.models import Recipe
from runs.recipes.demo import MARIN_MOE, TINY_MOE
from runs.recipes.files import RECIPES_DIR
from runs.services.recipes import RECIPE_FIELDS
from tests.factories import RecipeFactory

pytestmark = pytest.mark.django_db


def load(*paths: Path | str, dry_run: bool = False) -> str:
    out = StringIO()
    args = [str(p) for p in paths] + (["--dry-run"] if dry_run else [])
    call_command("load_recipes", *args, stdout=out)
    return out.getvalue()


def write(folder: Path, name: str, data: dict[str, Any] | str) -> Path:
    path = folder / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def stored(recipe: Recipe) -> dict[str, Any]:
    return {field: getattr(recipe, field) for field in RECIPE_FIELDS}


def test_the_project_recipes_load_and_a_second_load_changes_nothing() -> None:
    first = load()
    assert "tiny-moe v1: created" in first
    assert "marin-moe v1: created" in first
    assert "grug-moe-gate1 v1: created" in first
    assert "3 recipes: 3 created, 0 updated, 0 unchanged" in first
    grug = Recipe.objects.get(name="grug-moe-gate1")  # a YAML list, stored as its words
    assert shlex.split(grug.command_template) == [
        "python",
        "-m",
        "{config.launch_module}",
        "--version",
        "{config.artifact_version}",
        "--run",
    ]
    assert grug.launch["trainings"] == "plan"
    assert grug.launch["dry_run"] == {"drop": ["--run"]}
    tiny = Recipe.objects.get(name="tiny-moe")
    assert {k: v for k, v in stored(tiny).items() if k in TINY_MOE} == TINY_MOE
    assert (tiny.executor, tiny.is_active, tiny.created_by) == ("", True, None)
    assert Recipe.objects.get(name="marin-moe").executor == MARIN_MOE["executor"] == "ray"
    before = {r.pk: r.updated_at for r in Recipe.objects.all()}

    second = load(RECIPES_DIR)
    assert "tiny-moe v1: unchanged" in second
    assert "3 recipes: 0 created, 0 updated, 3 unchanged" in second
    assert {r.pk: r.updated_at for r in Recipe.objects.all()} == before


def test_an_edited_file_updates_its_recipe_and_fields_it_leaves_out_return_to_defaults(
    tmp_path: Path,
) -> None:
    recipe = RecipeFactory.create(executor="ray", description="Edited on the site.")
    data = {**TINY_MOE, "title": "Tiny MoE, reviewed", "scales": {"small": {"width": 32}}}
    del data["description"]
    out = load(write(tmp_path, "tiny.yaml", data))
    assert "tiny-moe v1: updated" in out
    recipe.refresh_from_db()
    assert (recipe.title, recipe.scales) == ("Tiny MoE, reviewed", {"small": {"width": 32}})
    assert (recipe.description, recipe.executor) == ("", "")  # the file is the whole recipe
    assert "unchanged" in load(tmp_path)


def test_a_new_version_is_a_new_recipe_and_a_numeric_version_is_read_as_text(
    tmp_path: Path,
) -> None:
    load()
    out = load(write(tmp_path, "tiny-2.yaml", {**TINY_MOE, "version": 2}))
    assert "tiny-moe v2: created" in out
    assert sorted(Recipe.objects.filter(name="tiny-moe").values_list("version", flat=True)) == [
        "1",
        "2",
    ]


def test_a_dry_run_says_what_would_change_and_writes_nothing() -> None:
    out = load(dry_run=True)
    assert "tiny-moe v1: would be created" in out
    assert "nothing written" in out
    assert not Recipe.objects.exists()


def test_an_invalid_file_is_refused_naming_the_file_and_field_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    write(tmp_path, "a-good.yaml", TINY_MOE)
    bad = {**MARIN_MOE, "default_config": {**MARIN_MOE["default_config"], "top_k": 99}}
    write(tmp_path, "b-bad.yaml", bad)
    with pytest.raises(CommandError) as refused:
        load(tmp_path)
    message = str(refused.value)
    assert "nothing was written" in message
    assert "b-bad.yaml: default_config: 'top_k'" in message
    assert "a-good.yaml" not in message
    assert not Recipe.objects.exists()  # not even the good file: all or nothing


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ({**TINY_MOE, "entrypoint": "x"}, "bad.yaml: entrypoint: is not a recipe field"),
        ({k: v for k, v in TINY_MOE.items() if k != "title"}, "bad.yaml: title: is required"),
        ({**TINY_MOE, "default_config": [1, 2]}, "bad.yaml: default_config: must be a mapping"),
        ({**TINY_MOE, "is_active": "yes please"}, "bad.yaml: is_active: must be true or false"),
        ({**TINY_MOE, "version": True}, "bad.yaml: version: must be text or a whole number"),
        ({**TINY_MOE, "name": "Tiny MoE!"}, "bad.yaml: name: "),
        ({**TINY_MOE, "executor": "slurm"}, "bad.yaml: executor: "),
        ({**TINY_MOE, "requires_labels": "gpu:a5000"}, "bad.yaml: requires_labels: must be a list"),
        (
            {**TINY_MOE, "requires_labels": ["gpu a5000"]},
            "bad.yaml: requires_labels: 'gpu a5000' is no label",
        ),
        (
            {**TINY_MOE, "executor": "local", "requires_labels": ["gpu:a5000"]},
            "bad.yaml: executor: only a pool has labels",
        ),
        (
            {**TINY_MOE, "compute_model": {**TINY_MOE["compute_model"], "tokens": "steps * __x"}},
            "bad.yaml: compute_model: ",
        ),
        (
            {**TINY_MOE, "parameter_schema": {"type": "object"}},
            "bad.yaml: parameter_schema: must declare the overridable parameters",
        ),
        ("- just\n- a list\n", "bad.yaml: must be a mapping of recipe fields"),
        ("name: [unclosed\n", "bad.yaml: is not valid YAML"),
        ("base: &b {a: 1}\ndefault_config: *b\n", "anchors and aliases are not accepted"),
    ],
    ids=[
        "unknown-field",
        "missing-field",
        "wrong-type",
        "not-a-boolean",
        "boolean-version",
        "bad-name",
        "unknown-executor",
        "labels-not-a-list",
        "bad-label",
        "labels-on-no-pool",
        "bad-formula",
        "no-properties",
        "not-a-mapping",
        "not-yaml",
        "alias",
    ],
)
def test_refusals_name_the_file_and_the_field(
    tmp_path: Path, content: dict[str, Any] | str, expected: str
) -> None:
    with pytest.raises(CommandError) as refused:
        load(write(tmp_path, "bad.yaml", content))
    assert expected in str(refused.value)
    assert not Recipe.objects.exists()


def test_a_recipe_file_declares_the_labels_its_pool_must_have(tmp_path: Path) -> None:
    load(write(tmp_path, "gpu.yaml", {**TINY_MOE, "requires_labels": ["gpu:a5000", "cuda:12"]}))
    assert Recipe.objects.get(name="tiny-moe").requires_labels == ["gpu:a5000", "cuda:12"]

    out = load(write(tmp_path, "gpu.yaml", TINY_MOE))  # left out: back to none
    assert "tiny-moe v1: updated" in out
    assert Recipe.objects.get(name="tiny-moe").requires_labels == []


def test_one_recipe_defined_twice_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "one.yaml", TINY_MOE)
    write(tmp_path, "two.yaml", {**TINY_MOE, "title": "Another"})
    with pytest.raises(CommandError, match=r"two\.yaml: name: tiny-moe version 1 is also defined"):
        load(tmp_path)
    assert not Recipe.objects.exists()


def test_a_folder_without_recipe_files_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a recipe")
    with pytest.raises(CommandError, match="no recipe files"):
        load(tmp_path)


def test_an_oversized_file_is_refused(tmp_path: Path) -> None:
    padding = "# " + "x" * (300 * 1024) + "\n"
    with pytest.raises(CommandError, match=r"big\.yaml: is over 256 KiB"):
        load(write(tmp_path, "big.yaml", padding + yaml.safe_dump(TINY_MOE)))
