"""W&B run history onto a run (runs/imports/wandb.py), from W&B's own export formats
(tests/fixtures/wandb/): the history Parquet, run.history() as CSV, config and summary."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import pytest

from marin_site import importing
from runs.models import MetricPoint, Run
from tests.runs.runs_helpers import launched_plan

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "wandb"
SPEEDRUN = (
    Path(__file__).resolve().parents[2]
    / "fixtures/speedrun/experiments/speedrun/adamw_llama_scaling/130m/speedrun_results.json"
)

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]  # JSON lookups, the ingest


@pytest.fixture
def run(recipe: Any) -> Run:
    run = Run.objects.filter(plan=launched_plan(recipe)).order_by("pk").first()
    assert run is not None
    return run


def _points(run: Run) -> dict[str, list[tuple[int, float]]]:
    curves: dict[str, list[tuple[int, float]]] = {}
    for key, step, value in (
        MetricPoint.objects.filter(run=run)
        .order_by("key", "step")
        .values_list("key", "step", "value")
    ):
        curves.setdefault(key, []).append((step, value))
    return curves


def _import(source: str | io.BytesIO, **options: str) -> importing.ImportReport:
    return importing.import_run(
        kind="wandb_history", source=source, options=options, source_name="history"
    )


@pytest.mark.parametrize("name", ["history.parquet", "history.csv"])
def test_full_curves_config_and_summary_come_onto_the_run(run: Run, name: str) -> None:
    report = _import(
        str(FIXTURES / name),
        run=str(run.pk),
        wandb_run="example-org/speedrun/abc123",
        config=str(FIXTURES / "config.json"),
        summary=str(FIXTURES / "summary.json"),
    )
    assert report.matched_count == 10 and report.refused_count == 0
    assert [(line.place, line.outcome) for line in report.lines] == [("column samples", "skipped")]
    curves = _points(run)
    assert curves["train/loss"] == [(s, 4.0 - 0.25 * s) for s in range(10)]
    assert curves["eval/paloma/c4_en/bpb"] == [
        (0, 1.6),
        (3, pytest.approx(1.45)),
        (6, pytest.approx(1.3)),
        (9, pytest.approx(1.15)),
    ]  # NaN where a step did not log it: no point
    assert len(curves["throughput/mfu"]) == 10
    assert set(curves) == {"train/loss", "eval/paloma/c4_en/bpb", "throughput/mfu"}
    point = MetricPoint.objects.get(run=run, key="train/loss", step=3)
    assert math.isclose(point.time.timestamp(), 1751000090.0)
    run.refresh_from_db()
    assert run.tracker_config == {
        "optimizer": {"learning_rate": 0.008, "weight_decay": 0.1},
        "model": {"hidden_dim": 512, "num_layers": 6},
    }
    assert run.final_metrics["eval/paloma/c4_en/bpb"] == 1.15
    assert not any(key.startswith("_") for key in run.final_metrics)
    assert run.tracker_tags["wandb.run"] == "example-org/speedrun/abc123"
    assert run.wandb_url.endswith("/example-org/speedrun/runs/abc123")
    event = run.events.get(verb="tracker_import")
    assert event.message.startswith("imported W&B history: 24 points from 10 rows")
    assert event.message.endswith("(wandb:example-org/speedrun/abc123)")


def test_importing_again_doubles_nothing(run: Run) -> None:
    _import(str(FIXTURES / "history.parquet"), run=str(run.pk))
    first = _points(run)
    _import(str(FIXTURES / "history.parquet"), run=str(run.pk))
    assert _points(run) == first


def test_a_parquet_without_step_is_refused_naming_the_file_and_column(run: Run) -> None:
    path = str(FIXTURES / "history_without_step.parquet")
    report = importing.import_run(kind="wandb_history", source=path, options={"run": str(run.pk)})
    assert report.refused_count == 1 and report.matched_count == 0
    reason = report.lines[0].reason
    assert "history_without_step.parquet has no '_step' column" in reason
    assert "step, train/loss" in reason
    assert _points(run) == {}


def test_an_upload_that_cannot_seek_is_read_too(run: Run) -> None:
    class Pipe(io.RawIOBase):
        def __init__(self, data: bytes) -> None:
            self.data = io.BytesIO(data)

        def readable(self) -> bool:
            return True

        def readinto(self, buffer: Any) -> int:
            chunk = self.data.read(len(buffer))
            buffer[: len(chunk)] = chunk
            return len(chunk)

    pipe = Pipe((FIXTURES / "history.parquet").read_bytes())
    report = importing.import_run(
        kind="wandb_history", source=pipe, options={"run": str(run.pk)}, source_name="pipe"
    )
    assert report.matched_count == 10 and len(_points(run)["train/loss"]) == 10


def test_dry_run_stores_nothing(run: Run) -> None:
    report = importing.import_run(
        kind="wandb_history",
        source=str(FIXTURES / "history.csv"),
        options={"run": str(run.pk), "summary": str(FIXTURES / "summary.json")},
        dry_run=True,
    )
    assert report.matched_count == 10
    assert "would import 24 points from 10 rows" in report.as_text()
    assert _points(run) == {}
    run.refresh_from_db()
    assert "eval/paloma/c4_en/bpb" not in run.final_metrics


def test_the_w_and_b_run_finds_a_speedrun_imported_before() -> None:
    importing.import_run(kind="speedrun", source=str(SPEEDRUN))
    speedrun = Run.objects.get()
    report = _import(
        str(FIXTURES / "history.parquet"),
        wandb_run="https://wandb.ai/example-org/speedrun/runs/llama_130m_adamw_4096-ab2740",
        summary=str(FIXTURES / "summary.json"),
    )
    assert report.matched_count == 10
    speedrun.refresh_from_db()
    assert len(_points(speedrun)["train/loss"]) == 10
    assert speedrun.final_metrics["model_flops"] == pytest.approx(1.777337490915459e18)  # kept


def test_bad_options_and_rows_are_refused_in_words(run: Run, tmp_path: Path) -> None:
    report = _import(str(FIXTURES / "history.csv"), wandb_run="not a run")
    assert "'not a run' is not entity/project/run_id" in report.lines[0].reason
    report = _import(str(FIXTURES / "history.csv"), wandb_run="a/b/c")
    assert "no run was imported from wandb:a/b/c" in report.lines[0].reason
    report = _import(str(FIXTURES / "history.csv"), run=str(run.pk), config="ftp://x/c.json")
    assert report.lines[0].place == "option config" and "'ftp:'" in report.lines[0].reason
    bad = tmp_path / "rows.csv"
    bad.write_text("_step,train/loss\n0,1.0\nlast,2.0\n-1,3.0\n")
    report = _import(str(bad), run=str(run.pk))
    assert [(line.place, line.outcome) for line in report.lines] == [
        ("row 2", "refused"),
        ("row 3", "refused"),
    ]
    assert report.matched_count == 1
    text = tmp_path / "x.csv"
    text.write_text("step,loss\n1,2\n")
    report = _import(str(text), run=str(run.pk))
    assert "has no '_step' column (its columns: step, loss)" in report.lines[0].reason
