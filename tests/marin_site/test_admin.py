"""Every model has a working admin: its list and add pages load for a superuser; maintainers
open it for what they manage, and other roles do not."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from runs.models import Recipe
from runs.recipes.demo import TINY_MOE
from tests.factories import ProposalFactory, RecipeFactory, ReviewFactory, UserFactory

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


def _recipe_form(**changes: Any) -> dict[str, Any]:
    data = {**copy.deepcopy(TINY_MOE), "name": "admin-moe", **changes}
    form = {key: json.dumps(data[key]) for key in JSON_FIELDS}
    form |= {key: data[key] for key in ("name", "version", "title", "description")}
    return form | {"command_template": data["command_template"], "executor": "", "is_active": "on"}


JSON_FIELDS = ("default_config", "parameter_schema", "compute_model", "scales")


def test_a_maintainer_who_is_not_staff_opens_the_admin_for_what_they_manage(
    client: Client, maintainer: User
) -> None:
    assert not (maintainer.is_staff or maintainer.is_superuser)
    RecipeFactory.create()
    client.force_login(maintainer)
    index = client.get("/admin/")
    assert index.status_code == 200
    assert b"Recipes" in index.content
    assert b"GitHub outbox rows" in index.content
    for url in (
        "/admin/runs/recipe/",
        "/admin/runs/recipe/add/",
        f"/admin/runs/recipe/{Recipe.objects.get().pk}/change/",
        "/admin/runs/run/",
        "/admin/proposals/githuboutbox/",
        "/admin/proposals/webhookdelivery/",
        "/admin/proposals/proposal/",
    ):
        assert client.get(url).status_code == 200, url
    # What maintainers do on the site stays there; accounts and tokens stay with superusers.
    for url in (
        "/admin/proposals/proposal/add/",
        "/admin/auth/user/",
        "/admin/auth/group/",
        "/admin/authtoken/tokenproxy/",
        f"/admin/runs/recipe/{Recipe.objects.get().pk}/delete/",
    ):
        assert client.get(url).status_code == 403, url


@pytest.mark.parametrize("role", ["contributor", "reviewer"])
def test_the_admin_stays_closed_to_other_roles(client: Client, role: str) -> None:
    client.force_login(UserFactory.create(username=f"a-{role}", roles=[role]))
    response = client.get("/admin/runs/recipe/")
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_a_maintainer_signs_in_on_the_admin_login_page_and_a_contributor_does_not(
    client: Client, maintainer: User, contributor: User
) -> None:
    refused = client.post(
        "/admin/login/?next=/admin/",
        {"username": contributor.username, "password": "correct-horse-battery"},
    )
    assert refused.status_code == 200
    assert b"errornote" in refused.content
    signed_in = client.post(
        "/admin/login/?next=/admin/",
        {"username": maintainer.username, "password": "correct-horse-battery"},
    )
    assert signed_in.status_code == 302
    assert signed_in["Location"] == "/admin/"


def test_recipes_written_in_the_admin_pass_the_recipe_services_checks(
    client: Client, maintainer: User
) -> None:
    client.force_login(maintainer)
    bad_config = {**TINY_MOE["default_config"], "top_k": 99}
    refused = client.post("/admin/runs/recipe/add/", _recipe_form(default_config=bad_config))
    assert refused.status_code == 200
    assert b"top_k" in refused.content
    assert not Recipe.objects.filter(name="admin-moe").exists()

    added = client.post("/admin/runs/recipe/add/", _recipe_form())
    assert added.status_code == 302, added.content.decode()[:2000]
    recipe = Recipe.objects.get(name="admin-moe")
    assert recipe.created_by == maintainer
    assert recipe.default_config == TINY_MOE["default_config"]

    url = f"/admin/runs/recipe/{recipe.pk}/change/"
    no_schema = client.post(url, _recipe_form(parameter_schema={"type": "object"}))
    assert no_schema.status_code == 200
    assert b"overridable parameters" in no_schema.content
    edited = client.post(url, _recipe_form(title="Edited in the admin"))
    assert edited.status_code == 302
    recipe.refresh_from_db()
    assert recipe.title == "Edited in the admin"


def _english_plural(singular: str) -> str:
    """The plural of the last word, by the rules Django's default (add "s") ignores."""
    head, _, last = singular.rpartition(" ")
    if last.endswith("series"):
        plural = last
    elif last.endswith(("s", "x", "ch", "sh")):
        plural = f"{last}es"
    elif last.endswith("y") and last[-2:-1] not in "aeiou":
        plural = f"{last[:-1]}ies"
    else:
        plural = f"{last}s"
    return f"{head} {plural}" if head else plural


def test_admin_names_are_spelled_right() -> None:
    """Every model the admin lists is named in words: "plan entries", "metric series" and
    "GitHub role grants", never "plan entrys", "metric seriess" or "git hub role grants"."""
    problems = []
    for model in admin.site._registry:
        meta = model._meta
        singular, plural = str(meta.verbose_name), str(meta.verbose_name_plural)
        if plural.lower() != _english_plural(singular).lower():
            problems.append(f"{meta.label}: {singular!r} / {plural!r}")
        if "git hub" in singular.lower():
            problems.append(f"{meta.label}: {singular!r} splits GitHub")
    assert problems == []
    names = {m._meta.label: str(m._meta.verbose_name_plural) for m in admin.site._registry}
    assert names["runs.PlanEntry"] == "plan entries"
    assert names["runs.MetricSeries"] == "metric series"
    assert names["proposals.GitHubRoleGrant"] == "GitHub role grants"
