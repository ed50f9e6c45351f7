"""What a production server process does when it loads marin_site.wsgi."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHECK = """
import sys
import marin_site.wsgi
from marin_site import celery_app
print(celery_app.finalized, "kombu.transport.redis" in sys.modules, "redis" in sys.modules)
"""


def test_loading_the_app_sets_celery_up_without_connecting_to_the_broker() -> None:
    """The first webhook acknowledgement of a worker must not wait for Celery's set-up."""
    with socket.socket() as closed:  # a port nothing listens on: a broker that is down
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "marin_site.settings",
        "CELERY_BROKER_URL": f"redis://127.0.0.1:{port}/0",
        "CACHE_URL": "",
    }
    result = subprocess.run(  # noqa: S603  (our own interpreter and code)
        [sys.executable, "-c", CHECK],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True", "True"]
