"""Web doors of runs/: the recipes' pages and their form for maintainers; a run's page with
its actions (cancel, rerun, retry), its tracker import, its claim and give-back; a plan's run
table and loss chart as a PNG; the compare page. Pools' pages are ``runs/pools/views.py``,
campaigns' ``runs/campaigns/views.py``."""

from __future__ import annotations

import copy
import json
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotModified
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.cache import add_never_cache_headers, patch_cache_control
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from marin_site.doors import Door
from marin_site.errors import DomainError
from marin_site.input import PolicyModelForm
from runs import permissions as run_perms
from runs import selectors
from runs.alerts import selectors as alert_selectors
from runs.executors import EXECUTORS, ExecutorError, get_executor
from runs.metrics import flags as metric_flags
from runs.metrics.display import MetricDisplay
from runs.models import Plan, PlanLaunch, Recipe, Run
from runs.pools.models import Pool
from runs.results import charts_png, run_table
from runs.services import claims
from runs.services import recipes as recipe_services
from runs.services import runs as run_writes
from runs.signals import plan_pages
from runs.trackers import jsonl as tracker_import
from runs.trackers import uploads as tracker_uploads

MANAGE_RECIPES = run_perms.MANAGE_RECIPES
JSON_FIELDS = ("default_config", "parameter_schema", "compute_model", "scales", "metrics")


class RecipeForm(PolicyModelForm):
    class Meta:
        model = Recipe
        fields = [
            "name",
            "version",
            "title",
            "description",
            "command_template",
            *JSON_FIELDS,
            "executor",
            "time_limit_seconds",
            "is_active",
        ]
        widgets = {
            field: forms.Textarea(attrs={"rows": 8, "class": "mono"}) for field in JSON_FIELDS
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        pools = Pool.objects.filter(retired_at__isnull=True).order_by("name")
        choices = [("", "the site's default"), *((name, name) for name in EXECUTORS)]
        choices += [(pool.executor, f"{pool.executor} (agents)") for pool in pools]
        current = self.initial.get("executor") or ""
        if current and current not in dict(choices):
            choices.append((current, current))
        self.fields["executor"] = forms.ChoiceField(
            choices=choices, required=False, help_text=Recipe._meta.get_field("executor").help_text
        )


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
            "history": recipe.events.select_related("actor"),
        },
    )


def _save(request: HttpRequest, recipe: Recipe | None) -> HttpResponse:
    if not request.user.has_perm(MANAGE_RECIPES):
        raise PermissionDenied("Only maintainers manage recipes.")
    # The form writes what it read onto its instance as it validates: a copy, so a refused
    # name never reaches the page's links (the recipe's URL is built from its name).
    form = RecipeForm(request.POST or None, instance=copy.copy(recipe))
    if request.method == "POST" and form.is_valid():
        data = {field: form.cleaned_data[field] for field in form.Meta.fields}
        try:
            if recipe is None:
                saved = recipe_services.recipe_create(actor=request.user, data=data, door=Door.WEB)
            else:
                saved = recipe_services.recipe_update(
                    recipe=Recipe.objects.get(pk=recipe.pk),
                    data=data,
                    actor=request.user,
                    door=Door.WEB,
                )
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
    """A run's public page: state, its recipe's declared metrics and the others, what the
    trackers reported (config, tags, summary, artifacts), imports, config, timeline, log."""
    return _run_page(request, pk)


def _run_page(
    request: HttpRequest, pk: int, *, claim: Any = None, status: int = 200
) -> HttpResponse:
    run = selectors.run_detail(run_id=pk)
    if run is None:
        raise Http404("No such run.")
    logs = ""
    if run.external_id:
        try:
            logs = get_executor(run.executor).logs(run.external_id, tail_bytes=16_384)
        except ExecutorError:
            logs = ""
    declarations = selectors.run_metric_declarations(run=run)
    summaries = list(run.summaries.all())
    imports = list(selectors.run_tracker_imports(run_id=run.pk)[:5])
    newer = (
        Run.objects.filter(entry_id=run.entry_id, sequence__gt=run.sequence)
        .order_by("-sequence")
        .only("pk", "state")
        .first()
    )
    charted = run_table.ordered_keys(s.key for s in summaries)
    chart_keys = charted[: run_table.DEFAULT_CHARTS]
    series_query = run_table.series_query(chart_keys, {"ids": str(run.pk)})
    return render(
        request,
        "runs/run_detail.html",
        {
            "run": run,
            "summaries": summaries,
            "declared": [
                (
                    d,
                    next((s for s in summaries if s.key == d.key), None),
                    run.final_metrics.get(d.key),
                )
                for d in declarations.values()
                if d.summary
            ],
            "other_summaries": [s for s in summaries if s.key not in declarations],
            "other_final": sorted(
                (k, v) for k, v in (run.final_metrics or {}).items() if k not in declarations
            ),
            "events": run.events.select_related("actor"),
            "alerts": list(alert_selectors.run_alerts(run_id=run.pk)[:20]),
            "metric_flags": metric_flags.run_flags(run_id=run.pk),
            "config_json": json.dumps(run.config, indent=2, sort_keys=True),
            "tracker_config_json": json.dumps(run.tracker_config, indent=2, sort_keys=True)
            if run.tracker_config
            else "",
            "tags": sorted((run.tracker_tags or {}).items()),
            "imports": imports,
            "import_active": any(i.state in {"pending", "running"} for i in imports),
            "can_import": request.user.has_perm(run_perms.IMPORT_METRICS, run),
            "logs": logs,
            "leases": run.leases.select_related("agent__pool").order_by("pk"),
            "artifacts": run.artifacts.all(),
            "claim": claim,
            "plan_page": _plan_page(run.plan_id),
            "newer": newer,
            "run_actions": (
                run_perms.run_allowed_actions(
                    run=run,
                    user=request.user,
                    latest=newer is None,
                    plan_live=PlanLaunch.objects.filter(
                        plan_id=run.plan_id, canceled_at__isnull=True
                    ).exists(),
                )
                if request.user.is_authenticated
                else []
            ),
            "chart_keys": [
                (key, MetricDisplay.of(key, declarations.get(key)).label) for key in chart_keys
            ],
            "other_chart_keys": charted[run_table.DEFAULT_CHARTS :],
            "series_url": f"{reverse('api-root')}runs/series/?{series_query}",
            "results_config": {"pollMs": run_table.POLL_MILLISECONDS, "runAxes": {}},
            "log_url": reverse("run-logs", kwargs={"pk": run.pk}),
            "run_url": reverse("run-detail", kwargs={"pk": run.pk}),
            "can_claim": run.state == "queued" and request.user.has_perm(run_perms.CLAIM_RUN, run),
            "can_give_back": run.executor == "external"
            and run.state == "running"
            and request.user.is_authenticated
            and (
                run.claimed_by_id == request.user.pk
                or request.user.has_perm(run_perms.CANCEL_RUN, run)
            ),
        },
        status=status,
    )


def _plan_page(plan_id: int) -> tuple[str, str] | None:
    """(label, url) of the page showing the plan (its proposal's), as ``plan_pages`` tells."""
    for _receiver, answer in plan_pages.send_robust(sender=Plan, plan_id=plan_id):
        if isinstance(answer, tuple) and len(answer) == 2:
            return (str(answer[0]), str(answer[1]))
    return None


RUN_ACTION_DONE = {
    "rerun": "Run #{new} queued: a rerun of run #{old}.",
    "retry": "Run #{new} queued: a retry of run #{old}.",
}


@login_required
@require_POST
def run_action(request: HttpRequest, pk: int, action: str) -> HttpResponse:
    """Cancel, rerun or retry a run from its page: the services the API calls, which check
    the permission and the state themselves (``runs.services.runs``)."""
    services_by_action = {
        "cancel": run_writes.run_cancel,
        "rerun": run_writes.run_rerun,
        "retry": run_writes.run_retry,
    }
    if action not in services_by_action:
        raise Http404("No such run action.")
    run = get_object_or_404(Run, pk=pk)
    try:
        result = services_by_action[action](run_id=run.pk, actor=request.user, door=Door.WEB)
    except DomainError as exc:
        return render(
            request,
            "refused.html",
            {"problems": [exc.message], "back": run.get_absolute_url()},
            status=exc.status_code,
        )
    if action == "cancel":
        messages.success(
            request,
            f"Run #{run.pk} canceled before it started."
            if result.state == "killed"
            else f"Cancel requested for run #{run.pk}: it stops once its executor confirms.",
        )
    else:
        messages.success(request, RUN_ACTION_DONE[action].format(new=result.pk, old=run.pk))
    return redirect(result)


@require_POST
def run_import(request: HttpRequest, pk: int) -> HttpResponse:
    """Upload a ``tracker_metrics.jsonl`` on the run's page (maintainers): checked as it
    arrives, then imported by a task whose progress the page shows."""
    run = get_object_or_404(Run, pk=pk)
    if not request.user.has_perm(run_perms.IMPORT_METRICS, run):
        raise PermissionDenied("Only maintainers import metrics.")
    upload = request.FILES.get("file")
    if upload is None:
        messages.error(request, "Choose a tracker_metrics.jsonl file to import.")
        return redirect(run)
    try:
        tracker_uploads.tracker_import_receive(
            run_id=run.pk,
            stream=upload.chunks(),
            door=Door.WEB,
            actor=request.user,
            filename=upload.name or "",
            strict=request.POST.get("strict") == "on",
        )
    except tracker_import.TrackerFileRefused as exc:
        return render_refused(request, run, exc.message, exc.status_code)
    except ValidationError as exc:
        return render_refused(request, run, "; ".join(exc.messages), 400)
    messages.success(request, f"{upload.name} received; importing it now.")
    return redirect(run)


def render_refused(request: HttpRequest, run: Run, message: str, status: int) -> HttpResponse:
    return render(
        request,
        "refused.html",
        {
            "problems": [f"The file was not imported into run {run.pk}: {message}"],
            "back": run.get_absolute_url(),
        },
        status=status,
    )


@login_required
@require_POST
def run_claim(request: HttpRequest, pk: int) -> HttpResponse:
    """Claim a queued run to execute by hand; the answer shows its token and command once."""
    try:
        claim = claims.run_claim(run_id=pk, actor=request.user, where=request.POST.get("where", ""))
    except ValidationError as exc:
        messages.error(request, " ".join(" ".join(v) for v in exc.message_dict.values()))
        return redirect("run-page", pk=pk)
    except DomainError as exc:
        if exc.status_code == 403:
            raise PermissionDenied(exc.message) from exc
        messages.error(request, exc.message)
        return redirect("run-page", pk=pk)
    return _run_page(request, pk, claim=claim, status=201)


@login_required
@require_POST
def run_give_back(request: HttpRequest, pk: int) -> HttpResponse:
    try:
        claims.run_claim_release(run_id=pk, actor=request.user)
    except DomainError as exc:
        if exc.status_code == 403:
            raise PermissionDenied(exc.message) from exc
        messages.error(request, exc.message)
    return redirect("run-page", pk=pk)


# --- results: the run table's live partial, the loss PNG, compare -------------------------


@never_cache
def plan_run_table(request: HttpRequest, plan_id: int) -> HttpResponse:
    """The run table alone: the proposal page polls it while runs are active."""
    plan = get_object_or_404(Plan, pk=plan_id)
    table = run_table.plan_run_table(
        plan=plan,
        sort=request.GET.get("sort", ""),
        group=request.GET.get("group", ""),
        columns=run_table.columns_parse(request.GET.getlist("columns")),
    )
    return render(request, "runs/_run_table.html", {"table": table, "launch": table.launch})


def plan_loss_png(request: HttpRequest, plan_id: int) -> HttpResponse:
    """The plan's main loss chart as a PNG at a stable address (``?key=``, ``?log=1``)."""
    key = request.GET.get("key", "")[:200]
    log_y = request.GET.get("log") in {"1", "true"}
    chart = charts_png.loss_chart_find(plan_id=plan_id, key=key)
    if chart is None:
        raise Http404("No metrics to draw for this plan.")
    etag = f'"{chart.version}-{int(log_y)}"'
    if chart.settled and etag in request.headers.get("If-None-Match", ""):
        response: HttpResponse = HttpResponseNotModified()
    else:
        png = charts_png.loss_chart_png(chart, log_y=log_y)
        if png is None:
            raise Http404("No metrics to draw for this plan.")
        response = HttpResponse(png, content_type="image/png")
    if chart.settled:
        response["ETag"] = etag
        patch_cache_control(response, public=True, max_age=60)
    else:  # the rollup is catching up with new points: ask again soon
        add_never_cache_headers(response)
    return response


def run_compare(request: HttpRequest) -> HttpResponse:
    """Runs picked across proposals (``?ids=1,2,3``, at most 100): overlaid charts and the
    config keys whose values differ between them."""
    ids, asked = run_table.parse_run_ids(request.GET.getlist("ids"))
    ids_text = ",".join(str(i) for i in ids)
    context: dict[str, Any] = {
        "ids_text": ids_text,
        "asked": asked,
        "truncated": asked > len(ids),
        "max_runs": run_table.COMPARE_MAX_RUNS,
    }
    if ids:
        comparison = run_table.compare_build(
            run_ids=ids,
            sort=request.GET.get("sort", ""),
            ids_text=ids_text,
            columns=run_table.columns_parse(request.GET.getlist("columns")),
        )
        table = comparison.table
        if request.GET.get("partial") == "table":
            response = render(request, "runs/_run_table.html", {"table": table})
            add_never_cache_headers(response)
            return response
        found = {row.run.pk for row in table.rows}
        series_query = run_table.series_query(table.chart_keys, {"ids": ids_text})
        context.update(
            table=table,
            missing=[i for i in ids if i not in found],
            config_keys=comparison.config_keys,
            config_rows=comparison.config_rows,
            table_url=f"{reverse('run-compare')}?{urlencode({'ids': ids_text, 'partial': 'table'}, safe=',')}",
            series_url=f"{reverse('api-root')}runs/series/?{series_query}",
            results_config={
                "pollMs": run_table.POLL_MILLISECONDS,
                "runAxes": {str(k): v for k, v in comparison.run_axes.items()},
            },
        )
    return render(request, "runs/compare.html", context)
