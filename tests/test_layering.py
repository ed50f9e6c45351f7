"""The layers: DESIGN.md's one-way dependency (``runs`` knows plans, not proposals), the
import contracts of pyproject.toml, and no import circle anywhere."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "runs"
PACKAGES = ("marin_site", "proposals", "runs", "trainers", "marin_client")
OURS = set(PACKAGES)  # the project's own packages


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_import_contracts_hold() -> None:
    """The layers declared in pyproject.toml (``[tool.importlinter]``): runs never imports
    proposals, the kernel no app, the client and the trainers no Django; no circles.

    In a process of its own: import-linter's command configures logging with
    ``dictConfig``, which disables every logger that exists, so in the test's process the
    site's later log lines (and the tests that read them) would go silent."""
    lint = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run(  # noqa: S603 (our own venv's command, fixed arguments)
        [str(lint), "--config", str(ROOT / "pyproject.toml")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_no_module_of_ours_imports_one_that_imports_it_back() -> None:
    """No import circle between any two modules, however long, function-level imports
    included: a task is enqueued by its name (``marin_site.nudges``), never imported by the
    services it runs."""
    import grimp

    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True)
    modules = {m for m in graph.modules if ".migrations" not in m}
    assert len(modules) > 100
    circles = [
        (module, other)
        for module in sorted(modules)
        for other in sorted(graph.find_modules_directly_imported_by(module) & modules)
        if other != module
        and graph.chain_exists(importer=other, imported=module, as_packages=False)
    ]
    assert circles == []


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
    """``runs.queue`` was split by noun, and runs/ sorted by kind; no shim is left behind to
    import them through, but the one stored recipe commands run (``-m runs.tiny_moe``)."""
    assert not (RUNS / "queue.py").exists()
    for moved in (
        "plans",
        "compute",
        "results",
        "run_table",
        "ladder",
        "seeds",
        "steady",
        "presentation",
        "metric_declarations",
        "agent",
        "client",
        "levanter_tracker",
        "agent_api",
        "tracker_import",
        "tracker_uploads",
        "tracker_reports",
        "claims",
        "nudges",
    ):
        assert not (RUNS / f"{moved}.py").exists(), moved
    assert "trainers.tiny_moe" in (RUNS / "tiny_moe.py").read_text()
    for package in ("services", "metrics", "series"):
        assert not (RUNS / f"{package}.py").exists()
        assert (RUNS / package / "__init__.py").exists()
