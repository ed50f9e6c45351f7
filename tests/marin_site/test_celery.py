"""The Celery app on the embedded default: the filesystem broker keeps everything under var/."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PUBLISH = """
from marin_site.celery import app
app.send_task("celery.accumulate", args=(1,))
"""


def test_a_worker_and_a_publish_on_the_filesystem_broker_write_nothing_outside_var(
    tmp_path: Path,
) -> None:
    """As bin/run starts them, from another working directory: kombu's folders default to
    paths relative to it (a `control/` folder beside the code), Celery beat's schedule too."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    var = cwd / "var"
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"CELERY_BROKER_URL", "DATABASE_URL", "CACHE_URL"}
    }
    env |= {
        "DJANGO_SETTINGS_MODULE": "marin_site.settings",
        "MARIN_VAR_DIR": str(var),
        "PYTHONPATH": str(ROOT),
    }
    command = [sys.executable, "-m", "celery", "-A", "marin_site", "worker", "--beat"]
    command += ["--pool", "solo", "--loglevel", "INFO", "--without-mingle", "--without-gossip"]
    worker = subprocess.Popen(  # noqa: S603  (our own interpreter and code)
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        published = subprocess.run(  # noqa: S603
            [sys.executable, "-c", PUBLISH],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert published.returncode == 0, published.stderr
        queue = var / "broker" / "queue"
        deadline = time.monotonic() + 60
        while any(queue.glob("*.msg")) and time.monotonic() < deadline:
            assert worker.poll() is None, "the worker stopped"
            time.sleep(0.2)
        assert not any(queue.glob("*.msg")), "the worker took nothing from the queue"
        time.sleep(1)  # beat's first tick writes its schedule file
    finally:
        worker.send_signal(signal.SIGTERM)
        output, _ = worker.communicate(timeout=30)
    assert "celery.accumulate" in output, output
    assert (var / "broker" / "control" / "celery.exchange").is_file()
    assert (var / "celerybeat-schedule").exists() or any(var.glob("celerybeat-schedule*"))
    outside = sorted(
        str(path.relative_to(cwd))
        for path in cwd.rglob("*")
        if not path.is_relative_to(var) and path.is_file()
    )
    assert outside == []
