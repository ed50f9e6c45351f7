"""Nudges: Celery tasks enqueued by their stable name, once the transaction commits.

The database is the truth and a nudge only speeds things up: a lost one is picked up by a
periodic pass (the reconcilers, the series sweep, the notices' reconcile). Services ask for a
task by the name it is registered under (``@shared_task(name="runs.dispatch")``) rather than
importing the module that defines it: a tasks module imports the services it runs, so an
import the other way would be a circle.

The task is looked up in the Celery application's registry, so a test that makes Celery
eager (``task_always_eager``) runs it in place, as it would ``task.delay``.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.db import transaction

logger = logging.getLogger(__name__)
_importing = threading.Lock()


def nudge(name: str, **kwargs: Any) -> None:
    """Enqueue the task registered as ``name`` after commit; a lost nudge is picked up later."""
    transaction.on_commit(lambda: task_send(name, **kwargs), robust=True)


def task_send(name: str, *, countdown: int | None = None, **kwargs: Any) -> None:
    """Enqueue the task registered as ``name`` now; a broker that is down is logged, not raised."""
    from marin_site.celery import app

    if name not in app.tasks:  # the apps' tasks modules are imported on first need
        with _importing:
            # One thread at a time: Celery's autodiscovery answers a second caller at once,
            # with nothing, while the first is still importing (a web process whose threads
            # all nudge for the first time together would see the task missing).
            if name not in app.tasks:
                app.loader.import_default_modules()
    task = app.tasks[name]  # KeyError: no task has this name (a typo, caught by the tests)
    options: dict[str, Any] = {"retry": False}
    if countdown is not None:
        options["countdown"] = countdown
    try:
        task.apply_async(kwargs=kwargs, **options)
    except Exception:  # the broker is down: a periodic pass will do it
        logger.warning("could not enqueue %s%s; a periodic pass will", name, kwargs)
