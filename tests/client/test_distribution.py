"""client/ is a distribution of its own: no Django in it, it installs alone into a fresh
Python 3.11 environment, it declares the Pythons it runs on, and the site serves its files."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import marin_client
import pytest
from django.test import Client

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "client"
SITE_PACKAGES = ("django", "rest_framework", "celery", "marin_site", "proposals", "runs")


def imported_modules(path: Path) -> set[str]:
    """The top-level modules a file imports, function-level imports included."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_no_module_of_the_distribution_imports_django_or_the_site() -> None:
    modules = sorted((CLIENT / "marin_client").glob("*.py"))
    assert {m.name for m in modules} >= {"__init__.py", "client.py", "agent.py", "levanter.py"}
    for module in modules:
        assert not imported_modules(module) & set(SITE_PACKAGES), module.name
    # The run client and the agent are standard library only; the tracker adds Levanter.
    for name in ("client.py", "agent.py", "__init__.py"):
        extra = imported_modules(CLIENT / "marin_client" / name) - set(sys.stdlib_module_names)
        assert extra <= {"__future__", "marin_client"}, (name, extra)
    assert imported_modules(CLIENT / "marin_client" / "levanter.py") - set(
        sys.stdlib_module_names
    ) == {"marin_client", "jax", "levanter"}


def test_the_distribution_declares_its_pythons_and_commands() -> None:
    project = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "marin-site-client"
    assert project["requires-python"] == ">=3.10"
    assert project["dependencies"] == []
    assert project["scripts"] == {
        "marin-site-agent": "marin_client.agent:main",
        "marin-site-client": "marin_client.client:main",
    }
    site = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "marin-site-client" in site["dependencies"]  # the site uses this copy of the code


@pytest.mark.parametrize(
    ("served", "module"), [("marin_run_client.py", "client"), ("marin-site-agent.py", "agent")]
)
@pytest.mark.django_db
def test_the_site_serves_the_distribution_s_own_files(served: str, module: str) -> None:
    response = Client().get(f"/agent/{served}")
    assert response.status_code == 200
    assert response.getvalue() == (CLIENT / "marin_client" / f"{module}.py").read_bytes()
    assert Path(marin_client.__file__).resolve().parent == CLIENT / "marin_client"


@pytest.mark.slow
def test_the_client_installs_alone_in_a_fresh_python_3_11_venv(tmp_path: Path) -> None:
    """pip builds and installs client/ into an empty venv: no Django, no site, and the run
    client, the agent and the replay command work there."""
    assert sys.version_info[:2] == (3, 11)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, symlinks=True).create(env_dir)
    python = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # Built from a copy (a build leaves build/ behind) with this environment's setuptools
    # (nothing fetched), installed with no index.
    source = tmp_path / "client"
    shutil.copytree(
        CLIENT, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    subprocess.run(  # noqa: S603  (this checkout's client, pip of this Python)
        [
            *(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps"),
            *("--no-build-isolation", "--wheel-dir", str(tmp_path / "wheels"), str(source)),
        ],
        check=True,
        timeout=300,
        cwd=tmp_path,
    )
    (wheel,) = (tmp_path / "wheels").glob("marin_site_client-*.whl")
    subprocess.run(  # noqa: S603  (the wheel just built, the venv's own pip)
        [str(python), "-m", "pip", "install", "--quiet", "--no-index", str(wheel)],
        check=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    check = (
        "import sys, importlib.util\n"
        "import marin_client.client, marin_client.agent\n"
        "assert importlib.util.find_spec('django') is None\n"
        "assert 'site-packages' in marin_client.client.__file__\n"
        "print(marin_client.client.RunClient.__name__)\n"
    )
    result = subprocess.run(  # noqa: S603
        [str(python), "-c", check],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "RunClient"
    spill = tmp_path / "unsent.jsonl"
    spill.write_text('{"key": "a", "step": 1, "value": 1.0}\n')
    replay = subprocess.run(  # noqa: S603
        [str(env_dir / "bin" / "marin-site-client"), "replay", str(spill), "--run-id", "1"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "RUN_TOKEN": ""},
        cwd=tmp_path,
    )
    assert replay.returncode == 2
    assert "replay needs --api-url, RUN_TOKEN" in replay.stderr
    agent = subprocess.run(  # noqa: S603
        [str(env_dir / "bin" / "marin-site-agent"), "--help"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert agent.returncode == 0, agent.stderr
