"""DESIGN.md's one-way dependency: ``runs`` knows plans, not proposals."""

from __future__ import annotations

import ast
from pathlib import Path

RUNS = Path(__file__).resolve().parent.parent / "runs"


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
