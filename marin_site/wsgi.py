"""WSGI entry point for production servers (gunicorn marin_site.wsgi)."""

import gc
import os

from django.core.wsgi import get_wsgi_application
from django.urls import get_resolver

from marin_site import celery_app

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marin_site.settings")

application = get_wsgi_application()

# Celery sets itself up on the first task a process sends: it finalizes the app, makes its
# result backend and imports the broker's transport (kombu's Redis transport imports
# redis.asyncio), 150-300 ms in all, during which the first webhook acknowledgements of
# every worker waited (bench/webhooks.py). Do it now; none of it connects to the broker.
celery_app.finalize(auto=True)
celery_app.backend  # noqa: B018  (a property that builds the backend)
celery_app.producer_pool  # noqa: B018  (builds the pool and resolves the transport class)

# Import every view now, then move what start-up allocated (some 130,000 long-lived objects:
# modules, classes, URL patterns) out of the garbage collector's sight. Otherwise every full
# collection walks them all, about 60 ms on these machines, and the request in flight waits:
# that was the slowest 1 % of webhook acknowledgements. New objects are collected as usual.
get_resolver().resolve("/")
gc.collect()
gc.freeze()
