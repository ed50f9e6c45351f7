"""marin-site: propose, review, run and publish the experiments of an open LLM project."""

from marin_site.celery import app as celery_app

__all__ = ["celery_app"]
