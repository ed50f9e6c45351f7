"""Nudges: Celery tasks of runs/ enqueued by the services, by name, once their transaction
commits. The database is the truth and a nudge only speeds things up: a lost one is picked
up by the reconciler (or the periodic series sweep).

``runs.tasks`` imports the services it runs, and the services ask for tasks here: that is a
true cycle between the entry layer and the services, broken by the one function-level import
of ``runs.tasks`` in ``task_send``.
"""

from __future__ import annotations

import logging

from django.db import transaction

logger = logging.getLogger(__name__)


def nudge(task_name: str, **kwargs: int) -> None:
    """Enqueue ``runs.tasks.<task_name>`` after commit; a lost nudge is picked up later."""
    transaction.on_commit(lambda: task_send(task_name, **kwargs), robust=True)


def task_send(task_name: str, *, countdown: int | None = None, **kwargs: int) -> None:
    """Enqueue ``runs.tasks.<task_name>`` now; a broker that is down is logged, not raised."""
    from runs import tasks  # runs.tasks imports the services: see the module's docstring

    task = getattr(tasks, task_name)
    try:
        if countdown is None:
            task.apply_async(kwargs=kwargs, retry=False)
        else:
            task.apply_async(kwargs=kwargs, countdown=countdown, retry=False)
    except Exception:  # the broker is down: the reconciler (or a sweep) will do it
        logger.warning("could not enqueue %s%s; a periodic pass will", task.name, kwargs)
