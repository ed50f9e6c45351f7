"""Whole ``tracker_metrics.jsonl`` imports: every step, the config, the summary; re-imports,
corrupt lines, strict refusal, bounded memory, the command."""

from __future__ import annotations

import io
import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from runs.models import MetricPoint, MetricSummary, Run, RunEvent, RunState, TrackerImport
from runs.services import runs as run_writes
from runs.trackers import jsonl as tracker_import
from runs.trackers import uploads as tracker_uploads
from tests.runs.runs_helpers import eager_tasks, launched_plan  # noqa: F401
from tests.runs.tracker_helpers import json_logger_lines

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("eager_tasks")]


def write(tmp_path: Path, lines: list[str], name: str = "tracker_metrics.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def run(recipe: Any) -> Run:
    run = Run.objects.filter(plan=launched_plan(recipe)).order_by("pk").first()
    assert run is not None
    return run


def snapshot(run: Run) -> tuple[Any, ...]:
    run.refresh_from_db()
    return (
        sorted(MetricPoint.objects.filter(run=run).values_list("key", "step", "value")),
        sorted(
            MetricSummary.objects.filter(run=run).values_list(
                "key", "last", "min", "max", "step", "count"
            )
        ),
        run.final_metrics,
        run.tracker_config,
        run.tracker_artifacts,
    )


def test_every_step_of_every_key_the_config_and_the_summary_are_imported(
    run: Run, tmp_path: Path
) -> None:
    path = write(tmp_path, json_logger_lines(50, nan_at=10))
    upload = tracker_uploads.tracker_import_file(run_id=run.pk, path=path)
    assert upload.state == "done"
    points = MetricPoint.objects.filter(run=run)
    assert points.filter(key="train/loss").count() == 49  # NaN at step 10 is not stored
    assert points.filter(key="throughput/tokens_per_second").count() == 50
    assert points.filter(key="optim/learning_rate").count() == 50
    assert not points.filter(key__startswith="grads").exists()  # a histogram
    assert not points.filter(key="note").exists()
    assert MetricSummary.objects.get(run=run, key="train/loss").step == 49
    run.refresh_from_db()
    assert run.tracker_config == {"model": {"width": 32}, "lr": 0.003}
    assert run.final_metrics == {"parameter_count": 1234.0, "train/loss": 2.1, "eval/loss": 2.4}
    assert run.tracker_artifacts == [
        {"uri": "gs://bucket/ckpt/step-10", "name": "checkpoint", "type": "model"}
    ]
    assert upload.points_written == 49 + 50 + 50
    assert upload.points_skipped == 1 + 50 * 2  # the NaN, the notes, the histograms
    assert upload.error_count == 0
    assert RunEvent.objects.filter(run=run, verb="tracker_import", door="system").exists()


def test_importing_the_same_file_twice_changes_nothing(run: Run, tmp_path: Path) -> None:
    path = write(tmp_path, json_logger_lines(30))
    tracker_uploads.tracker_import_file(run_id=run.pk, path=path)
    first = snapshot(run)
    tracker_uploads.tracker_import_file(run_id=run.pk, path=path)
    assert snapshot(run) == first


def test_a_corrupt_line_is_reported_by_number_and_the_rest_imports(
    run: Run, tmp_path: Path
) -> None:
    lines = json_logger_lines(10)
    lines[3] = '{"tracker": "json_logger", "event": "log", "step": 2, "metr'  # cut short
    lines[7] = "[1, 2, 3]"
    path = write(tmp_path, lines)
    upload = tracker_uploads.tracker_import_file(run_id=run.pk, path=path)
    assert upload.error_count == 2
    assert [e["line"] for e in upload.errors] == [4, 8]
    assert upload.errors[0]["problem"].startswith("not JSON")
    assert upload.errors[1]["problem"] == "not a JSON object"
    steps = set(
        MetricPoint.objects.filter(run=run, key="train/loss").values_list("step", flat=True)
    )
    assert steps == set(range(10)) - {2, 6}
    assert "2 lines with problems: line 4" in upload.message


def test_strict_refuses_a_file_with_a_corrupt_line_and_stores_nothing(
    run: Run, tmp_path: Path
) -> None:
    lines = json_logger_lines(10)
    lines[5] = "not json at all"
    path = write(tmp_path, lines)
    with pytest.raises(CommandError, match="line 6: not JSON"):
        call_command(
            "import_tracker_metrics",
            str(path),
            "--run",
            str(run.pk),
            "--strict",
            stdout=io.StringIO(),
        )
    assert not MetricPoint.objects.filter(run=run).exists()
    run.refresh_from_db()
    assert run.tracker_config is None and run.final_metrics == {}
    assert TrackerImport.objects.get(run=run).state == "failed"


def test_the_command_shows_progress_and_what_it_imported(
    run: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tracker_import, "POINTS_PER_INGEST", 200)
    path = write(tmp_path, json_logger_lines(400))
    out = io.StringIO()
    call_command("import_tracker_metrics", str(path), "--run", str(run.pk), stdout=out)
    text = out.getvalue()
    assert "100.0%" in text
    assert f"Run {run.pk}: imported 1200 points from 404 lines" in text
    assert MetricPoint.objects.filter(run=run).count() == 1200


def test_a_large_file_is_streamed_with_bounded_memory(run: Run, tmp_path: Path) -> None:
    """30 MB of lines imported while Python never holds more than a few MB of it."""
    path = tmp_path / "big.jsonl"
    line_template = '{{"tracker": "json_logger", "event": "log", "step": {step}, "metrics": {{"train/loss": {loss}, "pad": "{pad}"}}}}\n'
    pad = "x" * 400
    with path.open("w") as handle:
        step = 0
        while handle.tell() < 30_000_000:
            handle.write(line_template.format(step=step, loss=1.0 + 1.0 / (step + 1), pad=pad))
            step += 1
    size = path.stat().st_size
    tracemalloc.start()
    try:
        upload = tracker_uploads.tracker_import_file(run_id=run.pk, path=path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert upload.points_written == step
    assert MetricPoint.objects.filter(run=run).count() == step
    assert peak < size / 6, f"peak {peak / 1e6:.1f} MB for a {size / 1e6:.0f} MB file"


def test_the_replicated_one_line_record_still_imports(run: Run, tmp_path: Path) -> None:
    path = write(
        tmp_path, ['{"config": {"width": 32}, "summary": {"eval/loss": 2.5, "note": "x"}}']
    )
    tracker_uploads.tracker_import_file(run_id=run.pk, path=path)
    run.refresh_from_db()
    assert run.final_metrics == {"eval/loss": 2.5}
    assert run.tracker_config == {"width": 32}


def test_an_import_reaches_a_finished_run(run: Run, tmp_path: Path) -> None:
    """Imports come after training: a run that ended takes its history all the same."""
    run_writes.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door="worker")
    run_writes.run_transition(run_id=run.pk, to_state=RunState.FINISHED, door="worker")
    tracker_uploads.tracker_import_file(run_id=run.pk, path=write(tmp_path, json_logger_lines(5)))
    assert MetricPoint.objects.filter(run=run, key="train/loss").count() == 5


def test_a_key_that_does_not_fit_its_declaration_is_imported_and_flagged(
    run: Run, tmp_path: Path
) -> None:
    """An import keeps what the trainer logged, as the other doors do: the drop fraction
    logged as 250 is stored, flagged once, and named in the import's message."""
    from marin_site.events import Verb
    from runs.metrics import declarations as metric_declarations
    from runs.models import MetricFlag, Recipe

    recipe = Recipe.objects.get(name=run.recipe_name, version=run.recipe_version)
    recipe.metrics = [{"key": "moe/drop_fraction", "unit": "fraction"}]
    recipe.save()
    metric_declarations.declarations_forget()
    lines = [
        json.dumps({"step": s, "train/loss": 3 - s / 10, "moe/drop_fraction": v})
        for s, v in ((0, 0.05), (1, 250.0), (2, 0.04))
    ]
    upload = tracker_uploads.tracker_import_file(run_id=run.pk, path=write(tmp_path, lines))
    assert upload.state == "done"
    stored = MetricPoint.objects.filter(run=run, key="moe/drop_fraction")
    assert sorted(stored.values_list("value", flat=True)) == [0.04, 0.05, 250.0]
    assert MetricPoint.objects.filter(run=run, key="train/loss").count() == 3
    flag = MetricFlag.objects.get(run=run, key="moe/drop_fraction")
    assert (flag.step, flag.value, flag.resolved_at) == (1, 250.0, None)
    assert "flagged" in upload.message and "moe/drop_fraction" in upload.message
    assert RunEvent.objects.filter(run=run, verb=Verb.METRIC_FLAGGED).count() == 1
