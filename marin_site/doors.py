"""The doors a change can come through: one enum for both apps' timelines.

A timeline row (a proposal's, a run's, a recipe's) names its door, so a reader can tell a
click on the site from an API call, a slash command, the worker, a runner's report or an
edit in Django's admin. ``runs`` and ``proposals`` both import it from here (``runs`` never
imports ``proposals``).
"""

from __future__ import annotations

from django.db import models


class Door(models.TextChoices):
    WEB = "web", "Web"
    API = "api", "API"
    GITHUB = "github", "GitHub"
    WORKER = "worker", "Worker"
    RUNNER = "runner", "Runner"
    AGENT = "agent", "Agent"
    MLFLOW = "mlflow", "MLflow"
    ADMIN = "admin", "Admin"
    SYSTEM = "system", "System"
