"""Reads for alerts: a run's alerts for its page, the site's for the feeds and the API."""

from __future__ import annotations

from django.db.models import QuerySet

from runs.alerts.models import Alert


def alert_list() -> QuerySet[Alert]:
    """Every alert, newest first, with its run (alerts are public, like runs)."""
    return Alert.objects.select_related("run").order_by("-opened_at", "-pk")


def run_alerts(*, run_id: int) -> QuerySet[Alert]:
    return Alert.objects.filter(run_id=run_id).order_by("-opened_at", "-pk")


def plan_open_alerts(*, plan_id: int) -> QuerySet[Alert]:
    return Alert.objects.filter(run__plan_id=plan_id, closed_at__isnull=True).order_by("-opened_at")
