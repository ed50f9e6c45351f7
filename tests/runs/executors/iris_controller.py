"""A real Iris controller for the tests, started once per session from .venv-iris.

``bin/setup-iris`` builds the Iris environment (quick when it is there), then
``iris --config <its local.yaml> cluster start --local`` serves a controller whose tasks
run as subprocesses of this machine. It runs in its own session, with a HOME and TMPDIR of
its own (starting a cluster writes credentials under HOME); teardown stops exactly that
process group.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.conf import settings

STARTED = re.compile(r"Controller started at (http://\S+)")


@dataclass(frozen=True)
class IrisController:
    url: str
    command: str  # the `iris` command
    home: str


def setup_iris() -> str:
    done = subprocess.run(  # noqa: S603
        [str(Path(settings.BASE_DIR) / "bin" / "setup-iris")],
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    return done.stdout.strip().splitlines()[-1]


def controller_start() -> tuple[subprocess.Popen[bytes], IrisController, Path]:
    """A local controller (on a free port: a local cluster picks its own), its HOME and
    TMPDIR its own; its process, its address and its folder (``controller_stop`` ends it)."""
    iris = setup_iris()
    site_packages = next(Path(iris).parent.parent.glob("lib/python3*/site-packages"))
    config = site_packages / "iris" / "config" / "examples" / "local.yaml"
    root = Path(tempfile.mkdtemp(prefix="marin-iris-"))
    (root / "home").mkdir()
    (root / "tmp").mkdir()
    log = (root / "controller.log").open("w")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(root / "home"),
        "TMPDIR": str(root / "tmp"),
        "LANG": "C.UTF-8",
    }
    controller = subprocess.Popen(  # noqa: S603
        [iris, "--config", str(config), "cluster", "start", "--local"],
        cwd=root,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    log.close()
    try:
        deadline = time.monotonic() + 240
        url = ""
        while not url:
            if controller.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"the Iris controller did not start:\n{(root / 'controller.log').read_text()}"
                )
            found = STARTED.search((root / "controller.log").read_text())
            url = found.group(1) if found else ""
            time.sleep(0.2)
    except BaseException:
        controller_stop(controller, root)
        raise
    return controller, IrisController(url=url, command=iris, home=str(root / "home")), root


def controller_stop(
    controller: subprocess.Popen[bytes], root: Path, *, sig: int = signal.SIGTERM
) -> None:
    """Stop exactly that controller's process group (its tasks with it), then its folder."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(controller.pid, sig)
    try:
        controller.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(controller.pid, signal.SIGKILL)
        controller.wait(timeout=15)
    subprocess.run(["rm", "-rf", str(root)], check=False)  # noqa: S603, S607


@pytest.fixture(scope="session")
def iris_controller() -> Iterator[IrisController]:
    from runs.executors.iris_process import submitters_stop

    controller, address, root = controller_start()
    try:
        yield address
    finally:
        submitters_stop()  # this process's long-lived submitters
        controller_stop(controller, root)
