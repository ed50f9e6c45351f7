"""A git repository made in a test (no network): two commits of a module ``pinned_job``
that writes which commit it is to ``which.json`` in its working folder."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(  # noqa: S603
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args],  # noqa: S607
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@pytest.fixture(name="repo")
def repo_fixture(tmp_path: Path) -> Path:
    """A repository with two commits of a module ``pinned_job`` that says which it is."""
    path = tmp_path / "repo"
    (path / "pinned_job").mkdir(parents=True)
    git("init", "--quiet", "--initial-branch=main", cwd=path)
    module = path / "pinned_job" / "__main__.py"
    module.write_text(
        "import json, pathlib\n"
        "pathlib.Path('which.json').write_text(json.dumps({'version': 'first'}))\n"
    )
    git("add", ".", cwd=path)
    git("commit", "--quiet", "-m", "first", cwd=path)
    module.write_text(
        "import json, pathlib\n"
        "pathlib.Path('which.json').write_text(json.dumps({'version': 'second'}))\n"
    )
    git("commit", "--quiet", "-am", "second", cwd=path)
    return path
