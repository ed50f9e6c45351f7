"""The Celery application; tasks are found in each app's tasks.py."""

from __future__ import annotations

import gc
import os

from celery import Celery
from celery.signals import worker_process_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marin_site.settings")

app = Celery("marin_site")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_configure.connect
def _ensure_filesystem_broker_folders(sender: Celery, **kwargs: object) -> None:
    """The filesystem broker (the embedded default) needs its folders to exist."""
    options = sender.conf.broker_transport_options or {}
    for key in ("data_folder_in", "data_folder_out", "processed_folder", "control_folder"):
        folder = options.get(key)
        if folder:
            os.makedirs(folder, exist_ok=True)


@worker_process_init.connect
def _freeze_start_up_objects(**kwargs: object) -> None:
    """As in wsgi.py: what a worker process inherits is kept out of every full collection."""
    gc.collect()
    gc.freeze()
