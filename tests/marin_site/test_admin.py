"""Every model has a working admin: its list and add pages load for a superuser."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from tests.factories import ProposalFactory, ReviewFactory

pytestmark = pytest.mark.django_db

OWN_APPS = ("proposals", "runs")


def test_every_model_is_registered() -> None:
    for app in OWN_APPS:
        for model in apps.get_app_config(app).get_models():
            if model._meta.auto_created or model._meta.is_composite_pk:
                continue  # the admin refuses composite primary keys (MetricPoint)
            assert admin.site.is_registered(model), model


def test_admin_pages_load(client: Client) -> None:
    ReviewFactory.create(proposal=ProposalFactory.create(state="submitted"))
    client.force_login(User.objects.create_superuser("root", "root@example.org", "pw"))
    for app in OWN_APPS:
        for model in apps.get_app_config(app).get_models():
            if model._meta.auto_created or not admin.site.is_registered(model):
                continue
            opts = model._meta
            url = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
            assert client.get(url).status_code == 200, url
