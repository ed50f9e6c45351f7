"""One way to show a run: the run table, the charts' series, the PNG, the ladder and the
result comment write its label and values with the same functions."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
from django.test import Client

from runs.metrics import ingest
from runs.metrics.declarations import MetricDeclaration
from runs.metrics.parse import PointBatch
from runs.models import Run, RunState
from runs.results import charts_png, presentation
from runs.results import summary as results
from runs.series import rollup
from runs.services import runs as run_writes
from tests.runs.runs_helpers import launched_plan

pytestmark = pytest.mark.django_db

SPEC = """axes:
  capacity_factor: [1.0, 1.25]
seeds: [0]
"""


@pytest.mark.parametrize(
    ("value", "text"),
    [(1.0, "1"), (1.25, "1.25"), (0, "0"), (True, "true"), ("top-2", "top-2"), (None, "–")],
)
def test_a_value_is_written_as_in_the_canonical_config(value: Any, text: str) -> None:
    assert presentation.value_text(value) == text


def test_a_run_label_names_changes_scale_seed_and_rerun() -> None:
    label = presentation.run_label(
        changes={"capacity_factor": {"value": 1.0, "baseline": 1.25}, "weight_decay": 0.1},
        scale="small",
        seed=0,
        sequence=2,
    )
    assert label == "capacity_factor=1 · weight_decay=0.1 · small · seed 0 · rerun 2"
    assert presentation.run_label(changes={}) == "baseline"


def _report(run: Run, values: list[float]) -> None:
    batch = PointBatch(
        keys=["train/loss"] * len(values),
        steps=[i * 4 for i in range(len(values))],
        values=values,
        times=[None] * len(values),
    )
    ingest.metrics_ingest(run=Run.objects.get(pk=run.pk), batch=batch)
    rollup.series_refresh(run_id=run.pk)


def _finish(run: Run, values: list[float]) -> None:
    run_writes.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door="worker")
    _report(run, values)
    run_writes.run_transition(run_id=run.pk, to_state=RunState.FINISHED, door="worker")


def test_the_run_table_the_charts_and_the_png_label_runs_alike(client: Client, recipe: Any) -> None:
    plan = launched_plan(recipe, SPEC, baseline={"steps": 12, "width": 32, "capacity_factor": 1.5})
    runs = list(Run.objects.filter(plan=plan).order_by("entry__index"))
    for n, run in enumerate(runs):
        _finish(run, [5.0 - n, 4.0 - n, 3.0 - n])

    table = client.get(f"/plans/{plan.pk}/runs/").content.decode()
    chart = orjson.loads(
        client.get(f"/api/v1/plans/{plan.pk}/series/?keys=train/loss&points=100").content
    )
    labels = {run["id"]: run["label"] for run in chart["runs"]}
    png = charts_png.loss_chart_find(plan_id=plan.pk)
    assert png is not None
    png_labels = {line.label for line in charts_png.loss_lines(png)}
    # its y axis titled as the pages title it: the declared name and unit
    assert {line.title for line in charts_png.loss_lines(png)} == {"Train loss (nats)"}

    assert "capacity_factor=1 " in labels[runs[1].pk] + " "
    assert "capacity_factor=1.0" not in table + "".join(labels.values())
    for run in runs:
        row = table.split(f'id="run-row-{run.pk}"')[1].split("</tr>")[0]
        shown = re.findall(r"<code>([^<]*)</code>", row.split('class="diff"')[1].split("</td>")[0])
        label = labels[run.pk]
        if run.entry.is_baseline:
            assert label.startswith("baseline")
        else:
            assert label.startswith(" · ".join(shown)), (shown, label)
        assert f"#{run.pk} {label}" in png_labels

    summary = results.plan_summarize(plan_id=plan.pk)
    for run in runs:
        if not run.entry.is_baseline:
            cells = next(
                line
                for line in summary["markdown"].splitlines()
                if line.startswith(f"| {run.pk} |")
            )
            assert f"| {presentation.run_label(changes=run.entry.diff)} |" in cells
            assert (
                presentation.metric_text(
                    summary["runs"][runs.index(run)]["metrics"]["train/loss"], "train/loss"
                )
                in cells
            )


def test_the_presentation_names_write_values_by_the_one_display_rule() -> None:
    """The results' names for a value's text are ``runs.metrics.display``'s rule."""
    mfu = MetricDeclaration(key="throughput/mfu", unit="percent", display="MFU")
    assert presentation.metric_text(41.0, mfu.key, mfu) == "41.0%"
    assert presentation.metric_text(0.41, mfu.key) == "0.4100"  # undeclared: as logged
    logged_as = MetricDeclaration(key="x", unit="percent", logged_as="fraction", display="X")
    assert presentation.metric_text(0.41, "x", logged_as) == "41.0%"
    drop = MetricDeclaration(key="moe/drop_fraction", unit="fraction")
    assert presentation.metric_text(0.125, drop.key, drop) == "0.125"
    seconds = MetricDeclaration(key="run_seconds", unit="seconds")
    assert presentation.metric_text(12.34, seconds.key, seconds) == "12.3 s"
    loss = MetricDeclaration(key="train/loss", unit="nats")
    assert presentation.metric_text(2.5, loss.key, loss) == "2.5000"
    assert presentation.spread_text({"mean": 41.0, "std": 1.0}, mfu.key, mfu) == "41.0% ± 1.0%"
    assert presentation.delta_text(-0.5, 0.25, "x", logged_as) == "−50.0% ± 25.0%"


def test_a_declared_metric_is_labelled_with_its_name_and_unit() -> None:
    assert presentation.metric_label("throughput/mfu") == "throughput/mfu"
    mfu = MetricDeclaration(key="throughput/mfu", unit="percent", display="MFU")
    assert presentation.metric_label(mfu.key, mfu) == "MFU (%)"
    drop = MetricDeclaration(key="moe/drop_fraction", unit="fraction", display="Dropped")
    assert presentation.metric_label(drop.key, drop) == "Dropped (fraction)"
    loss = MetricDeclaration(key="train/loss", unit="nats", direction="lower")
    assert presentation.metric_label(loss.key, loss) == "train/loss (nats)"
    assert presentation.direction_text(loss) == "lower is better"
    assert presentation.direction_text(None) == ""


def test_a_suggested_verdict_is_written_in_words() -> None:
    assert presentation.verdict_text("did_not_work") == "Did not work"
    assert presentation.verdict_text("worked") == "Worked"
    assert presentation.verdict_text("anything else") == "–"


def test_the_verdict_words_are_the_outcomes_labels() -> None:
    from proposals.models import Outcome

    assert dict(Outcome.choices) == presentation.VERDICT_LABELS
