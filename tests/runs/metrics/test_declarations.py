"""Recipes declare their metrics: values are stored as logged (and flagged outside the
range of the unit they are logged in: ``runs.metrics.flags``), shown in the declared unit (``runs.metrics.display``),
labels and columns follow the declarations, undeclared keys still show under "other metrics"."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.cache import cache
from django.test import Client
from rest_framework.test import APIClient

from marin_site.events import Verb
from runs import tokens
from runs.metrics import declarations as metric_declarations
from runs.metrics.display import MetricDisplay
from runs.models import MetricFlag, MetricPoint, Recipe, Run, RunEvent, RunState
from runs.recipes.demo import MARIN_MOE, TINY_MOE
from runs.results import run_table
from runs.results import summary as results_summary
from runs.services import recipes as recipe_writes
from runs.services import runs as run_writes
from tests.runs.runs_helpers import eager_tasks, launched_plan  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("eager_tasks")]

DECLARED: list[dict[str, Any]] = [
    {
        "key": "throughput/mfu",
        "unit": "percent",
        "direction": "higher",
        "display": "MFU",
        "column": True,
    },
    {
        "key": "train/loss",
        "unit": "nats",
        "direction": "lower",
        "display": "Train loss",
        "column": True,
    },
    {
        "key": "hw/util",
        "unit": "percent",
        "logged_as": "fraction",
        "display": "Utilisation",
        "column": True,
    },
    {"key": "moe/drop_fraction", "unit": "fraction", "display": "Dropped tokens"},
]


@pytest.fixture(autouse=True)
def _fresh() -> None:
    cache.clear()
    metric_declarations.declarations_forget()


@pytest.fixture
def running(recipe: Recipe) -> tuple[Run, str]:
    recipe.metrics = DECLARED
    recipe.save()
    run = Run.objects.filter(plan=launched_plan(recipe)).order_by("pk").first()
    assert run is not None
    run = run_writes.run_transition(
        run_id=run.pk,
        to_state=RunState.RUNNING,
        door="worker",
        changes={"token_hash": tokens.token_hash(tokens.run_token(run=run))},
    )
    return run, tokens.run_token(run=run)


def send(run: Run, token: str, points: list[tuple[str, int, float]]) -> Any:
    body = {"points": [{"key": k, "step": s, "value": v} for k, s, v in points]}
    return APIClient().post(
        f"/api/v1/runs/{run.pk}/metrics/",
        data=json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )


def stored(run: Run, key: str) -> list[float]:
    return list(
        MetricPoint.objects.filter(run=run, key=key)
        .order_by("step")
        .values_list("value", flat=True)
    )


def test_a_percent_is_stored_as_logged(running: tuple[Run, str]) -> None:
    """Levanter's MFU, a percent: stored as it came, 22.8 (never multiplied again)."""
    run, token = running
    assert (
        send(run, token, [("throughput/mfu", 1, 22.8), ("throughput/mfu", 2, 23.5)]).status_code
        == 200
    )
    assert stored(run, "throughput/mfu") == pytest.approx([22.8, 23.5])


def test_a_fraction_logged_in_percent_is_stored_and_flagged_naming_logged_as(
    running: tuple[Run, str],
) -> None:
    """One bad key never costs the others: the loss is stored, the drop fraction is stored as
    logged and flagged, the answer names it with its reason and first step."""
    run, token = running
    response = send(
        run,
        token,
        [("train/loss", 1, 2.0), ("moe/drop_fraction", 2, 7.8), ("moe/drop_fraction", 1, 250.0)],
    )
    assert response.status_code == 200, response.content
    answer = response.json()
    assert answer["stored"] == 3
    assert answer["refused"] == []
    [flag] = answer["flagged"]
    assert flag["key"] == "moe/drop_fraction"
    assert flag["step"] == 1 and flag["points"] == 2
    assert "moe/drop_fraction is logged as a fraction (0-1)" in flag["reason"]
    assert "250.0 at step 1" in flag["reason"]
    assert stored(run, "train/loss") == [2.0]
    assert stored(run, "moe/drop_fraction") == [250.0, 7.8]
    assert send(run, token, [("moe/drop_fraction", 3, 0.078)]).json()["flagged"] == []
    assert MetricFlag.objects.filter(run=run, resolved_at__isnull=True).count() == 1


def test_a_flag_shows_once_per_key_on_the_page_and_timeline(running: tuple[Run, str]) -> None:
    run, token = running
    for step in range(1, 4):
        assert send(run, token, [("throughput/mfu", step, 2280.0)]).status_code == 200
    events = RunEvent.objects.filter(run=run, verb=Verb.METRIC_FLAGGED)
    assert events.count() == 1
    assert "throughput/mfu is logged as a percent (0-100)" in events.get().message
    page = Client().get(f"/runs/{run.pk}/").content.decode()
    flags = page.split('aria-label="Flagged metrics"', 1)[1].split("</ul>", 1)[0]
    assert flags.count("<li") == 1
    assert "Flagged" in flags and "throughput/mfu" in flags and "from step 1" in flags


def test_the_verdict_leaves_a_flagged_key_out_until_the_declaration_is_corrected(
    running: tuple[Run, str], maintainer: Any
) -> None:
    """The declaration was the mistake (Levanter logs MFU in percent, the recipe said a
    fraction): corrected, the stored values are read again and the flag is resolved."""
    run, token = running
    recipe = Recipe.objects.get(name=run.recipe_name, version=run.recipe_version)
    wrong = [{**d, "unit": "fraction"} if d["key"] == "throughput/mfu" else d for d in DECLARED]
    recipe_writes.recipe_update(recipe=recipe, data={"metrics": wrong}, actor=maintainer)
    assert (
        send(run, token, [("throughput/mfu", 1, 22.87), ("train/loss", 1, 2.5)]).json()["flagged"][
            0
        ]["key"]
        == "throughput/mfu"
    )
    assert stored(run, "throughput/mfu") == [22.87]
    metrics = results_summary.final_metrics(runs=[run])[run.pk]
    assert "throughput/mfu" not in metrics
    assert metrics["train/loss"] == 2.5
    recipe_writes.recipe_update(recipe=recipe, data={"metrics": DECLARED}, actor=maintainer)
    flag = MetricFlag.objects.get(run=run, key="throughput/mfu")
    assert flag.resolved_at is not None
    assert RunEvent.objects.filter(run=run, verb=Verb.METRIC_FLAG_RESOLVED).count() == 1
    assert results_summary.final_metrics(runs=[run])[run.pk]["throughput/mfu"] == 22.87
    page = Client().get(f"/runs/{run.pk}/").content.decode()
    assert "22.9%" in page and "Resolved" in page


def test_a_percent_logged_as_a_fraction_is_stored_as_a_fraction(running: tuple[Run, str]) -> None:
    run, token = running
    assert send(run, token, [("hw/util", 1, 0.5)]).status_code == 200
    assert stored(run, "hw/util") == [0.5]
    assert send(run, token, [("hw/util", 2, 50.0)]).json()["flagged"][0]["key"] == "hw/util"


def test_the_mlflow_door_stores_what_the_client_logged(running: tuple[Run, str]) -> None:
    run, token = running
    body = {
        "run_id": str(run.pk),
        "metrics": [{"key": "hw/util", "value": 0.41, "timestamp": 1_800_000_000_000, "step": 3}],
    }
    response = Client().post(
        "/mlflow/api/2.0/mlflow/runs/log-batch",
        data=json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert response.status_code == 200, response.content
    assert stored(run, "hw/util") == pytest.approx([0.41])
    body["metrics"][0]["value"] = 41.0  # type: ignore[index]
    body["metrics"][0]["step"] = 4  # type: ignore[index]
    flagged = Client().post(
        "/mlflow/api/2.0/mlflow/runs/log-batch",
        data=json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert flagged.status_code == 200 and flagged.json() == {}  # MLflow's shape: it stores it
    assert stored(run, "hw/util") == pytest.approx([0.41, 41.0])
    assert MetricFlag.objects.filter(run=run, key="hw/util", resolved_at__isnull=True).exists()


def test_an_imported_summary_is_kept_as_logged(running: tuple[Run, str]) -> None:
    run, token = running
    response = APIClient().post(
        f"/api/v1/runs/{run.pk}/tracker-metrics/",
        data=json.dumps(
            {"jsonl": json.dumps({"summary": {"throughput/mfu": 31.0, "x": 1}}) + "\n"}
        ),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert response.status_code == 200
    assert response.json()["final_metrics"] == {"throughput/mfu": pytest.approx(31.0), "x": 1.0}


def test_the_run_page_shows_declared_units_and_other_metrics(running: tuple[Run, str]) -> None:
    run, token = running
    send(
        run, token, [("throughput/mfu", 1, 22.8), ("train/loss", 1, 2.5), ("custom/thing", 1, 7.0)]
    )
    page = Client().get(f"/runs/{run.pk}/").content.decode()
    assert "MFU" in page
    assert "22.8%" in page
    assert "2280" not in page
    assert "higher is better" in page
    # The "Other metrics" table (the charts below it draw every key).
    other = page.split('id="other-metrics"', 1)[1].split("</table>", 1)[0]
    assert "custom/thing" in other
    assert "train/loss" not in other


def test_the_run_table_takes_the_declared_columns_with_their_units(
    running: tuple[Run, str],
) -> None:
    run, token = running
    send(run, token, [("throughput/mfu", 1, 17.4), ("hw/util", 1, 0.5)])
    table = run_table.plan_run_table(plan=run.plan)
    assert table.metric_keys == ["throughput/mfu", "train/loss", "hw/util"]
    assert [c.label for c in table.metric_columns] == [
        "MFU (%)",
        "Train loss (nats)",
        "Utilisation (%)",
    ]
    html = Client().get(f"/plans/{run.plan_id}/runs/").content.decode()
    row = html.split(f'id="run-row-{run.pk}"', 1)[1].split("</tr>", 1)[0]
    assert '<td class="num" data-metric-key="throughput/mfu">17.4%' in row
    assert '<td class="num" data-metric-key="hw/util">50.0%' in row


def test_without_declarations_the_table_keeps_its_default_columns(recipe: Recipe) -> None:
    plan = launched_plan(recipe)
    assert run_table.plan_run_table(plan=plan).metric_keys == list(run_table.TABLE_KEYS)


@pytest.mark.parametrize(
    ("metrics", "fragment"),
    [
        ([{"key": "a", "unit": "furlongs"}], "is not one of"),
        ([{"key": "bad key"}], "does not match"),
        ([{"key": "a"}, {"key": "a"}], "repeated: a"),
        ([{"key": "a", "unit": "seconds", "logged_as": "fraction"}], "logged_as applies"),
        ({"key": "a"}, "is not of type 'array'"),
    ],
)
def test_bad_declarations_are_refused_naming_the_field(
    api_as: Any, maintainer: Any, metrics: Any, fragment: str
) -> None:
    data = {k: v for k, v in TINY_MOE.items() if k != "metrics"}
    response = api_as(maintainer).post(
        "/api/v1/recipes/", {**data, "name": "declared", "metrics": metrics}, format="json"
    )
    assert response.status_code == 400
    assert fragment in json.dumps(response.json()["metrics"])


def test_the_demo_recipes_declare_their_metrics() -> None:
    for recipe in (TINY_MOE, MARIN_MOE):
        assert metric_declarations.declarations_validate(recipe["metrics"]) == []
        declared = metric_declarations.declarations_parse(recipe["metrics"])
        assert declared["throughput/mfu"].column
        assert declared["train/loss"].direction == "lower"


def test_marin_moe_declares_what_levanter_emits_in_the_units_it_emits_them() -> None:
    """Levanter's ``log_performance_stats`` logs ``throughput/mfu`` as model FLOP/s over peak
    times 100 and its summary ``throughput/p50_mfu`` the same way: percent, no conversion;
    tokens per second, the step's duration in seconds; Marin's MoE loop logs the drop
    fraction 0-1. A hero run's 22.87 % is taken and shown as 22.9%, never 2287.0%."""
    declared = metric_declarations.declarations_parse(MARIN_MOE["metrics"])
    expected = {
        "throughput/mfu": ("percent", ""),
        "throughput/p50_mfu": ("percent", ""),
        "throughput/tokens_per_second": ("tokens/s", ""),
        "throughput/duration": ("seconds", ""),
        "moe/drop_fraction": ("fraction", ""),
    }
    for key, (unit, logged_as) in expected.items():
        assert (declared[key].unit, declared[key].logged_as) == (unit, logged_as), key
    mfu = declared["throughput/mfu"]
    assert metric_declarations.value_fits(mfu, 21.0, 27.0)
    assert MetricDisplay.of("throughput/mfu", mfu).text(22.87) == "22.9%"
    assert MetricDisplay.of("moe/drop_fraction", declared["moe/drop_fraction"]).text(0.078) == (
        "0.078"
    )
