"""Nudges: a task enqueued by its name, its module imported on first need."""

from __future__ import annotations

import threading
import time
from typing import Any

from celery.loaders import base as celery_loaders

from marin_site import nudges
from marin_site.celery import app


def test_threads_nudging_a_task_not_yet_imported_all_find_it(monkeypatch: Any) -> None:
    """As in a web process whose threads all report at once: Celery's autodiscovery answers
    a second caller at once, with nothing, while the first is still importing; each thread
    waits for the import instead of being told the task does not exist."""
    app.loader.import_default_modules()
    task = app.tasks["runs.dispatch"]
    sent: list[str] = []
    monkeypatch.setattr(task, "apply_async", lambda **kw: sent.append("runs.dispatch"))
    monkeypatch.delitem(app.tasks, "runs.dispatch")  # not imported yet in this process
    importing = threading.Lock()

    def import_default_modules() -> list[Any]:
        if not importing.acquire(blocking=False):  # celery_loaders._RACE_PROTECTION
            return []
        try:
            time.sleep(0.3)  # importing the apps' tasks modules
            app.tasks.register(task)
            return []
        finally:
            importing.release()

    assert hasattr(celery_loaders, "_RACE_PROTECTION")  # the behaviour mimicked above
    monkeypatch.setattr(app.loader, "import_default_modules", import_default_modules)
    errors: list[BaseException] = []

    def nudge() -> None:
        try:
            nudges.task_send("runs.dispatch")
        except BaseException as exc:  # handed to the test
            errors.append(exc)

    threads = [threading.Thread(target=nudge) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)

    assert errors == []
    assert sent == ["runs.dispatch"] * 8
