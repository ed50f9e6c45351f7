"""Helpers for the admin tests: change an object through the admin's own change form."""

from __future__ import annotations

from typing import Any

from django.db.models import Model
from django.test import Client
from django.urls import reverse


def _form_data(form: Any) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for name in form.fields:
        value = form[name].value()
        if value is None:
            continue
        if isinstance(value, list | tuple):
            data[form.add_prefix(name)] = [str(v) for v in value]
        elif isinstance(value, bool):
            if value:
                data[form.add_prefix(name)] = "on"
        else:
            data[form.add_prefix(name)] = str(value)
    return data


def admin_change(client: Client, obj: Model, **changes: Any) -> Any:
    """POST the admin change form of ``obj`` as the page shows it, with ``changes`` applied."""
    opts = obj._meta
    url = reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk])
    page = client.get(url)
    assert page.status_code == 200, url
    data = _form_data(page.context["adminform"].form)
    for inline in page.context["inline_admin_formsets"]:
        formset = inline.formset
        data.update(_form_data(formset.management_form))
        for form in formset.forms:
            data.update(_form_data(form))
    data.update({key: str(value) for key, value in changes.items()})
    return client.post(url, data)


def admin_delete(client: Client, obj: Model) -> Any:
    opts = obj._meta
    url = reverse(f"admin:{opts.app_label}_{opts.model_name}_delete", args=[obj.pk])
    return client.post(url, {"post": "yes"})
