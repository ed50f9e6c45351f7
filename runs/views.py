"""Web doors for recipes: public pages, and a form for maintainers."""

from __future__ import annotations

import json

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render

from runs import selectors, services
from runs import permissions as run_perms
from runs.models import Recipe

MANAGE_RECIPES = run_perms.MANAGE_RECIPES
JSON_FIELDS = ("default_config", "parameter_schema", "compute_model", "scales")


class RecipeForm(forms.ModelForm):
    class Meta:
        model = Recipe
        fields = [
            "name",
            "version",
            "title",
            "description",
            "command_template",
            *JSON_FIELDS,
            "is_active",
        ]
        widgets = {
            field: forms.Textarea(attrs={"rows": 8, "class": "mono"}) for field in JSON_FIELDS
        }


def recipe_list(request: HttpRequest) -> HttpResponse:
    recipes = selectors.recipe_list(include_inactive=True)
    return render(request, "runs/recipe_list.html", {"recipes": recipes})


def recipe_detail(request: HttpRequest, name: str, version: str) -> HttpResponse:
    recipe = get_object_or_404(Recipe, name=name, version=version)
    return render(
        request,
        "runs/recipe_detail.html",
        {
            "recipe": recipe,
            "default_config": json.dumps(recipe.default_config, indent=2),
            "compute_model": json.dumps(recipe.compute_model, indent=2),
            "scales": json.dumps(recipe.scales, indent=2),
            "can_manage": request.user.has_perm(MANAGE_RECIPES),
        },
    )


def _save(request: HttpRequest, recipe: Recipe | None) -> HttpResponse:
    if not request.user.has_perm(MANAGE_RECIPES):
        raise PermissionDenied("Only maintainers manage recipes.")
    form = RecipeForm(request.POST or None, instance=recipe)
    if request.method == "POST" and form.is_valid():
        data = {field: form.cleaned_data[field] for field in form.Meta.fields}
        try:
            if recipe is None:
                saved = services.recipe_create(actor=request.user, data=data)
            else:
                saved = services.recipe_update(recipe=Recipe.objects.get(pk=recipe.pk), data=data)
        except ValidationError as exc:
            for field, errors in exc.message_dict.items():
                form.add_error(field if field in form.fields else None, errors)
        else:
            messages.success(request, f"Recipe {saved} saved.")
            return redirect(saved)
    status = 400 if form.is_bound and form.errors else 200
    return render(request, "runs/recipe_form.html", {"form": form, "recipe": recipe}, status=status)


@login_required
def recipe_create(request: HttpRequest) -> HttpResponse:
    return _save(request, None)


@login_required
def recipe_edit(request: HttpRequest, name: str, version: str) -> HttpResponse:
    return _save(request, get_object_or_404(Recipe, name=name, version=version))


def run_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """A run's public page: state, metrics summary, config, timeline and log tail."""
    from runs.executors import ExecutorError, get_executor

    run = selectors.run_detail(run_id=pk)
    if run is None:
        raise Http404("No such run.")
    logs = ""
    if run.external_id:
        try:
            logs = get_executor(run.executor).logs(run.external_id, tail_bytes=16_384)
        except ExecutorError:
            logs = ""
    return render(
        request,
        "runs/run_detail.html",
        {
            "run": run,
            "summaries": run.summaries.all(),
            "events": run.events.select_related("actor"),
            "config_json": json.dumps(run.config, indent=2, sort_keys=True),
            "logs": logs,
        },
    )
