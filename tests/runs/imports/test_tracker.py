"""A tracker_metrics.jsonl onto a run through the importers (runs/imports/tracker.py):
paths and file:// URLs, streamed as an upload is, line by line reports, bad input."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from marin_site import importing
from runs.models import MetricPoint, Run, TrackerImport, TrackerImportState
from tests.runs.runs_helpers import launched_plan

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "tracker"
GOOD = FIXTURES / "tracker_metrics.jsonl"
TRUNCATED = FIXTURES / "tracker_metrics_truncated.jsonl"

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]  # the ingest, both ways


@pytest.fixture
def run(recipe: Any) -> Run:
    run = Run.objects.filter(plan=launched_plan(recipe)).order_by("pk").first()
    assert run is not None
    return run


def _points(run: Run) -> list[tuple[str, int, float]]:
    return sorted(MetricPoint.objects.filter(run=run).values_list("key", "step", "value"))


def test_file_url_is_streamed_onto_the_run(run: Run) -> None:
    report = importing.import_run(
        kind="tracker_metrics", source=f"file://{GOOD}", options={"run": str(run.pk)}
    )
    assert report.refused_count == 0
    assert report.matched_count == 6  # hparams, four steps, the summary
    assert report.skipped_count == 2  # the blank line and the html event
    points = _points(run)
    assert ("eval/paloma/c4_en/bpb", 3, pytest.approx(1.2)) in points
    assert [p for p in points if p[0] == "train/loss"] == [
        ("train/loss", 0, 3.0),
        ("train/loss", 1, 2.5),
        ("train/loss", 2, 2.0),
        ("train/loss", 3, 1.5),
    ]
    run.refresh_from_db()
    assert run.tracker_config == {"model": {"hidden_dim": 512}, "trainer": {"num_train_steps": 4}}
    upload = TrackerImport.objects.get(run=run)
    assert upload.state == TrackerImportState.DONE and upload.filename == "tracker_metrics.jsonl"
    assert upload.points_written == 12
    assert any(note.startswith(f"Run {run.pk}: imported 12 points") for note in report.notes)


def test_importing_again_doubles_nothing(run: Run) -> None:
    options = {"run": str(run.pk)}
    importing.import_run(kind="tracker_metrics", source=str(GOOD), options=options)
    first = _points(run)
    importing.import_run(kind="tracker_metrics", source=str(GOOD), options=options)
    assert _points(run) == first


def test_a_truncated_last_line_is_refused_by_number_and_the_rest_imports(run: Run) -> None:
    report = importing.import_run(
        kind="tracker_metrics", source=str(TRUNCATED), options={"run": str(run.pk)}
    )
    assert report.refused_count == 1
    assert report.lines[0].place == "line 9" and "not JSON" in report.lines[0].reason
    assert len(_points(run)) == 12


def test_dry_run_reads_and_stores_nothing(run: Run) -> None:
    report = importing.import_run(
        kind="tracker_metrics", source=str(TRUNCATED), options={"run": str(run.pk)}, dry_run=True
    )
    assert (report.matched_count, report.refused_count) == (6, 1)
    assert _points(run) == [] and not TrackerImport.objects.exists()


def test_a_missing_run_and_a_bad_run_number_are_refused(run: Run) -> None:
    report = importing.import_run(kind="tracker_metrics", source=str(GOOD), options={"run": "0"})
    assert report.refused_count == 1 and "there is no run 0" in report.lines[0].reason
    report = importing.import_run(kind="tracker_metrics", source=str(GOOD), options={"run": "x"})
    assert "'x' is not a run's number" in report.lines[0].reason
    with pytest.raises(importing.ImportRefused, match="needs the option run"):
        importing.import_run(kind="tracker_metrics", source=str(GOOD))


def test_a_file_that_is_not_json_lines_is_refused(run: Run) -> None:
    upload = io.BytesIO(b"<html>not a tracker file</html>\n")
    report = importing.import_run(
        kind="tracker_metrics", source=upload, options={"run": str(run.pk)}, source_name="x.jsonl"
    )
    assert report.refused_count == 1 and report.matched_count == 0
    assert "not JSON" in report.lines[0].reason


def test_unknown_scheme_and_over_the_cap_are_refused(run: Run, settings: Any) -> None:
    options = {"run": str(run.pk)}
    report = importing.import_run(kind="tracker_metrics", source="s3://b/t.jsonl", options=options)
    assert "'s3:' is not one this site reads" in report.lines[0].reason
    settings.IMPORTS_MAX_BYTES = 100
    report = importing.import_run(kind="tracker_metrics", source=str(GOOD), options=options)
    assert report.refused_count == 1 and "the limit is 100 bytes" in report.lines[0].reason
    assert _points(run) == []


def test_a_stream_over_the_cap_stops_there(run: Run, settings: Any) -> None:
    settings.IMPORTS_MAX_BYTES = 400
    stream = io.BytesIO(GOOD.read_bytes())
    report = importing.import_run(
        kind="tracker_metrics", source=stream, options={"run": str(run.pk)}, source_name="pipe"
    )
    assert report.refused_count == 1 and "larger than the limit of 400" in report.lines[-1].reason
    assert TrackerImport.objects.get(run=run).state == TrackerImportState.FAILED
