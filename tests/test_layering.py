"""DESIGN.md's one-way dependency: ``runs`` knows plans, not proposals."""

from __future__ import annotations

import ast
from pathlib import Path

RUNS = Path(__file__).resolve().parent.parent / "runs"
OURS = {"runs", "proposals", "marin_site"}  # the project's own packages


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_runs_never_imports_proposals() -> None:
    sources = sorted(RUNS.rglob("*.py"))
    assert len(sources) > 10
    offenders = {
        str(path.relative_to(RUNS.parent)): sorted(
            m for m in _imported_modules(path) if m.split(".")[0] == "proposals"
        )
        for path in sources
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_no_module_of_runs_reaches_for_another_modules_private_names() -> None:
    """A helper shared between modules is public (renamed), not imported with its underscore:
    ``from x import _helper`` or ``x._helper(...)`` across modules is what the split of
    ``runs/`` by noun removed."""
    offenders: dict[str, list[str]] = {}
    for path in sorted(RUNS.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        imported_modules: set[str] = set()
        found: list[str] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(f"from {node.module} import {alias.name}")
                    if node.module.split(".")[0] in OURS:
                        imported_modules.add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                imported_modules.update(
                    (a.asname or a.name).split(".")[0]
                    for a in node.names
                    if a.name.split(".")[0] in OURS
                )
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in imported_modules
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and node.attr != "_meta"
            ):
                found.append(f"{node.value.id}.{node.attr}")
        if found:
            offenders[str(path.relative_to(RUNS.parent))] = sorted(set(found))
    assert offenders == {}


def test_the_old_run_modules_are_gone() -> None:
    """``runs.queue`` was split by noun; no shim is left behind to import it through."""
    assert not (RUNS / "queue.py").exists()
    for package in ("services", "metrics", "series"):
        assert not (RUNS / f"{package}.py").exists()
        assert (RUNS / package / "__init__.py").exists()
