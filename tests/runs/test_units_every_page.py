"""One unit rule on every page that shows a declared metric (issue #32, item 2).

Seeded runs of the tiny recipe report what Levanter logs: ``throughput/mfu`` in percent
(22.87, declared ``unit: percent``) and ``moe/drop_fraction`` as a fraction (0.078, declared
``unit: fraction``). Each page and export that shows them is rendered through the Django test
client (or, for the result comment, built as the worker builds it), and the values must read
the same everywhere: MFU ``22.9%``, the drop fraction ``0.078``. Never MFU multiplied by 100
again (``2287.0%``, an interquartile range of ``2287.0%-2287.0%``) or divided by it
(``0.229``), nor the drop fraction as a percent (``7.8%``).
"""

from __future__ import annotations

import csv
import io
import json
import re
from typing import Any

import pytest
from django.test import Client

from proposals.models import State
from runs.alerts import rules
from runs.campaigns import services as campaign_services
from runs.metrics import ingest
from runs.metrics.declarations import declarations_forget
from runs.metrics.parse import PointBatch
from runs.models import Plan, Run, RunState
from runs.results import summary as results
from runs.series import rollup
from runs.services import runs as run_writes
from tests.factories import ProposalFactory
from tests.runs.runs_helpers import eager_tasks, launched_plan  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("eager_tasks")]

MFU = 22.87  # percent, as Levanter logs it: the hero runs' 21-27 %
DROP = 0.078  # a fraction of the tokens
MFU_TEXT, DROP_TEXT = "22.9%", "0.078"
# What a page showing either value in the wrong unit would say.
WRONG = {
    "MFU multiplied by 100": re.compile(r"2,?28[67](\.\d+)?\s?%"),
    "MFU divided by 100": re.compile(r"(?<![\d.])0\.229"),
    "the drop fraction as a percent": re.compile(r"(?<![\d.])7\.8\d*\s?%"),
}
SPEC = """axes:
  capacity_factor: [2.0]
seeds: [0, 1]
"""
STEPS = 20


@pytest.fixture(autouse=True)
def _fresh_declarations() -> None:
    """The processes' caches by run id: another test's run of the same id (SQLite gives ids
    again after a rollback) must not lend this one its declarations."""
    declarations_forget()
    rules.rules_forget()


def report(run: Run) -> None:
    """What the trainer sends over its run (the steady state starts after step 5), through
    the metrics service, and the chart rollup brought up to date."""
    keys = {
        "train/loss": lambda s: 3.0 - s * 0.01,
        "eval/loss": lambda s: 3.1 - s * 0.01,
        "throughput/mfu": lambda s: MFU,
        "moe/drop_fraction": lambda s: DROP,
        "throughput/tokens_per_second": lambda s: 5e4,
    }
    points = [(key, step, value(step)) for step in range(STEPS) for key, value in keys.items()]
    batch = PointBatch(
        keys=[k for k, _, _ in points],
        steps=[s for _, s, _ in points],
        values=[v for _, _, v in points],
        times=[None] * len(points),
    )
    ingest.metrics_ingest(run=Run.objects.get(pk=run.pk), batch=batch)
    rollup.series_refresh(run_id=run.pk)


def finished_plan(recipe: Any, spec: str) -> tuple[Plan, list[Run]]:
    plan: Plan = launched_plan(recipe, spec)
    runs = list(Run.objects.filter(plan=plan).order_by("pk"))
    for run in runs:
        if run.state != RunState.QUEUED:
            continue  # a run the plan reuses from an earlier one (its cache): done already
        run_writes.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door="worker")
        report(run)
        run_writes.run_transition(run_id=run.pk, to_state=RunState.FINISHED, door="worker")
    return plan, runs


@pytest.fixture
def seeded(recipe: Any, contributor: Any, maintainer: Any) -> dict[str, Any]:
    """A finished plan of four runs (baseline and one variant, two seeds each) and its
    proposal judged on MFU; a second finished plan whose proposal is judged on the drop
    fraction; a campaign of a run with an intervention on both keys."""
    plan, runs = finished_plan(recipe, SPEC)
    assert len(runs) == 4
    on_mfu = ProposalFactory.create(
        author=contributor,
        recipe=recipe,
        state=State.APPROVED,
        plan=plan,
        success_metric="throughput/mfu",
        success_direction="higher",
    )
    on_drop = ProposalFactory.create(
        author=contributor,
        recipe=recipe,
        state=State.APPROVED,
        plan=finished_plan(recipe, "axes:\n  capacity_factor: [4.0]\n")[0],
        success_metric="moe/drop_fraction",
        success_direction="lower",
    )
    campaign = campaign_services.campaign_create(
        actor=maintainer,
        data={
            "slug": "units",
            "name": "Units",
            "description": "Every page, one unit.",
            "target_tokens": 1e6,
            "target_flops": 6e15,
            "hardware": "v5p-8",
            "links": [],
        },
    )
    campaign_services.campaign_run_add(actor=maintainer, campaign=campaign, run=runs[0])
    campaign_services.intervention_record(
        actor=maintainer,
        campaign=campaign,
        step=12,
        kind="kernel",
        title="Kernels",
        keys=["throughput/mfu", "moe/drop_fraction"],
        window_steps=6,
    )
    return {"plan": plan, "runs": runs, "on_mfu": on_mfu, "on_drop": on_drop, "campaign": campaign}


def read(client: Client, url: str) -> str:
    response: Any = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    body = b"".join(response.streaming_content) if response.streaming else response.content
    return body.decode()


def in_one_unit(where: str, text: str, *, mfu: bool = True, drop: bool = True) -> None:
    """``text`` shows MFU as 22.9% and the drop fraction as 0.078, and neither otherwise."""
    if mfu:
        assert MFU_TEXT in text, f"{where}: MFU is not shown as {MFU_TEXT}"
    if drop:
        assert DROP_TEXT in text, f"{where}: the drop fraction is not shown as {DROP_TEXT}"
    for mistake, pattern in WRONG.items():
        found = pattern.search(text)
        assert found is None, f"{where} shows {mistake}: {found.group(0) if found else ''}"


def test_every_page_that_shows_a_declared_metric_reads_the_same_unit(
    client: Client, seeded: dict[str, Any], maintainer: Any
) -> None:
    plan, runs = seeded["plan"], seeded["runs"]
    on_mfu, on_drop = seeded["on_mfu"], seeded["on_drop"]
    ids = "&".join(f"ids={run.pk}" for run in runs)

    # The proposal page (its results: run table, seed spreads) and its live run table.
    in_one_unit("the proposal page", read(client, f"/proposals/{on_mfu.pk}/"))
    in_one_unit("the run table", read(client, f"/plans/{plan.pk}/runs/"))
    # A run's own page.
    in_one_unit("the run page", read(client, f"/runs/{runs[0].pk}/"))
    # The compare page, and its table alone.
    in_one_unit("the compare page", read(client, f"/runs/compare/?{ids}"))
    in_one_unit("the compare table", read(client, f"/runs/compare/?{ids}&partial=table"))
    # The campaign page: its intervention's before and after, and their ranges.
    campaign_page = read(client, f"/campaigns/{seeded['campaign'].slug}/")
    in_one_unit("the campaign page", campaign_page)
    assert f"{MFU_TEXT} → {MFU_TEXT}" in campaign_page
    assert f"{MFU_TEXT}–{MFU_TEXT}" in campaign_page  # the interquartile range
    assert f"{DROP_TEXT} → {DROP_TEXT}" in campaign_page

    # The exports: each proposal's best value of its success metric, in JSON and in CSV.
    exported = json.loads(read(client, "/export/proposals.json"))
    best = {row["id"]: row["best_value_text"] for row in exported["results"]}
    assert (best[on_mfu.pk], best[on_drop.pk]) == (MFU_TEXT, DROP_TEXT)
    table = list(csv.DictReader(io.StringIO(read(client, "/export/proposals.csv"))))
    best = {int(row["id"]): row["best_value_text"] for row in table}
    assert (best[on_mfu.pk], best[on_drop.pk]) == (MFU_TEXT, DROP_TEXT)

    # The result comment the worker posts on the proposal's issue when the plan finishes.
    in_one_unit("the result comment", results.plan_summarize(plan_id=plan.pk)["markdown"])

    # The chart data the pages draw from: the stored values, with the unit the charts'
    # script formats them in (static/js/units.js writes what MetricDisplay.text writes).
    series = json.loads(
        read(client, f"/api/v1/plans/{plan.pk}/series/?keys=throughput/mfu,moe/drop_fraction")
    )
    meta = series["metrics"]
    assert (meta["throughput/mfu"]["unit"], meta["throughput/mfu"]["format"]) == (
        "percent",
        "percent",
    )
    assert (meta["moe/drop_fraction"]["unit"], meta["moe/drop_fraction"]["format"]) == (
        "fraction",
        "fraction",
    )
