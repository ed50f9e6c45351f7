"""The MLflow door answers what the client logged: a declared unit changes how pages show a
value, never what MLflow's reads give back (the stock ``mlflow`` client, a live server)."""

from __future__ import annotations

from typing import Any

import pytest
import requests

from runs.models import MetricPoint, Run
from tests.runs.test_mlflow import _mlflow_env, job  # noqa: F401  (fixtures)

pytestmark = pytest.mark.django_db(transaction=True)

AS_FRACTION = [
    {"key": "throughput/mfu", "unit": "percent", "logged_as": "fraction", "display": "MFU"},
]


@pytest.fixture
def recipe(recipe: Any) -> Any:
    """The run's recipe declares MFU shown in percent and logged as a fraction."""
    recipe.metrics = AS_FRACTION
    recipe.save(update_fields=["metrics"])
    return recipe


def test_the_stock_client_reads_back_what_it_logged_and_the_page_shows_percent(
    job: tuple[Run, str],  # noqa: F811
    live_server: Any,
) -> None:
    import mlflow
    from mlflow.tracking import MlflowClient

    run, _ = job
    with mlflow.start_run():
        mlflow.log_metric("throughput/mfu", 0.25, step=1)
        client = MlflowClient()
        history = client.get_metric_history(str(run.pk), "throughput/mfu")
        assert [m.value for m in history] == [pytest.approx(0.25)]
        assert client.get_run(str(run.pk)).data.metrics["throughput/mfu"] == pytest.approx(0.25)
    assert list(MetricPoint.objects.filter(run=run).values_list("value", flat=True)) == [
        pytest.approx(0.25)
    ]
    page = requests.get(f"{live_server.url}/runs/{run.pk}/", timeout=20).text
    row = page.split('data-metric-key="throughput/mfu"', 1)[1].split("</tr>", 1)[0]
    assert "MFU (%)" in row
    assert "<td>25.0%</td>" in row
