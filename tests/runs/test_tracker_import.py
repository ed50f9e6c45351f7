"""Whole ``tracker_metrics.jsonl`` imports: by file (the command), by API, by upload."""

from __future__ import annotations

import io
import json
import math
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from rest_framework.authtoken.models import Token

from runs import queue, tracker_import
from runs.models import MetricPoint, MetricSummary, Run, RunEvent, RunState, TrackerImport
from tests.runs.runs_helpers import eager_tasks, launched_plan  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("eager_tasks")]


def json_logger_lines(steps: int, *, nan_at: int | None = None) -> list[str]:
    """What Levanter's json_logger writes: hparams, a log event per step, summary, finish."""
    lines = [
        json.dumps(
            {
                "tracker": "json_logger",
                "event": "hparams",
                "hparams": {"model": {"width": 32}, "lr": 0.003},
            }
        )
    ]
    for step in range(steps):
        loss = math.nan if step == nan_at else 3.0 - step / steps
        lines.append(
            json.dumps(
                {
                    "tracker": "json_logger",
                    "event": "log",
                    "step": step,
                    "metrics": {
                        "train": {"loss": loss},
                        "throughput/tokens_per_second": 1000.0 + step,
                        "optim/learning_rate": 0.003,
                        "note": "text is not a metric",
                        "grads": {
                            "min": 0,
                            "max": 1,
                            "num": 3,
                            "sum": 1,
                            "sum_squares": 1,
                            "bucket_limits": [0, 1],
                            "bucket_counts": [1, 2],
                        },
                    },
                }
            )
        )
    lines.append(
        json.dumps(
            {"tracker": "json_logger", "event": "summary", "metrics": {"parameter_count": 1234}}
        )
    )
    lines.append(
        json.dumps(
            {
                "tracker": "json_logger",
                "event": "artifact",
                "path": "gs://bucket/ckpt/step-10",
                "name": "checkpoint",
                "artifact_type": "model",
            }
        )
    )
    lines.append(
        json.dumps(
            {
                "tracker": "json_logger",
                "event": "finish",
                "summary": {"train/loss": 2.1, "eval/loss": 2.4},
            }
        )
    )
    return lines


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
        run.artifacts,
    )


def test_every_step_of_every_key_the_config_and_the_summary_are_imported(
    run: Run, tmp_path: Path
) -> None:
    path = write(tmp_path, json_logger_lines(50, nan_at=10))
    upload = tracker_import.tracker_import_file(run_id=run.pk, path=path)
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
    assert run.artifacts == [
        {"uri": "gs://bucket/ckpt/step-10", "name": "checkpoint", "type": "model"}
    ]
    assert upload.points_written == 49 + 50 + 50
    assert upload.points_skipped == 1 + 50 * 2  # the NaN, the notes, the histograms
    assert upload.error_count == 0
    assert RunEvent.objects.filter(run=run, verb="tracker_import", door="cli").exists()


def test_importing_the_same_file_twice_changes_nothing(run: Run, tmp_path: Path) -> None:
    path = write(tmp_path, json_logger_lines(30))
    tracker_import.tracker_import_file(run_id=run.pk, path=path)
    first = snapshot(run)
    tracker_import.tracker_import_file(run_id=run.pk, path=path)
    assert snapshot(run) == first


def test_a_corrupt_line_is_reported_by_number_and_the_rest_imports(
    run: Run, tmp_path: Path
) -> None:
    lines = json_logger_lines(10)
    lines[3] = '{"tracker": "json_logger", "event": "log", "step": 2, "metr'  # cut short
    lines[7] = "[1, 2, 3]"
    path = write(tmp_path, lines)
    upload = tracker_import.tracker_import_file(run_id=run.pk, path=path)
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
        upload = tracker_import.tracker_import_file(run_id=run.pk, path=path)
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
    tracker_import.tracker_import_file(run_id=run.pk, path=path)
    run.refresh_from_db()
    assert run.final_metrics == {"eval/loss": 2.5}
    assert run.tracker_config == {"width": 32}


def test_an_import_reaches_a_finished_run(run: Run, tmp_path: Path) -> None:
    """Imports come after training: a run that ended takes its history all the same."""
    queue.run_transition(run_id=run.pk, to_state=RunState.RUNNING, door="worker")
    queue.run_transition(run_id=run.pk, to_state=RunState.FINISHED, door="worker")
    tracker_import.tracker_import_file(run_id=run.pk, path=write(tmp_path, json_logger_lines(5)))
    assert MetricPoint.objects.filter(run=run, key="train/loss").count() == 5


# --- the API: streamed -------------------------------------------------------------------------


def maintainer_client(maintainer: Any) -> tuple[Client, str]:
    token = Token.objects.create(user=maintainer).key
    return Client(), token


def test_the_api_streams_a_file_and_imports_it_in_a_task(
    run: Run, maintainer: Any, django_capture_on_commit_callbacks: Any
) -> None:
    client, token = maintainer_client(maintainer)
    body = ("\n".join(json_logger_lines(40)) + "\n").encode()
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            f"/api/v1/runs/{run.pk}/tracker-metrics/?filename=t.jsonl",
            data=body,
            content_type="application/x-ndjson",
            HTTP_AUTHORIZATION=f"Token {token}",
        )
    assert response.status_code == 202, response.content
    assert response.json()["state"] == "pending"
    assert response.json()["lines"] == 44
    progress = client.get(f"/api/v1/runs/{run.pk}/tracker-imports/").json()["imports"][0]
    assert progress["state"] == "done"
    assert progress["percent"] == 100
    assert progress["points_written"] == 120
    assert MetricPoint.objects.filter(run=run).count() == 120
    assert not TrackerImport.objects.get(run=run).chunks.exists()  # dropped once imported


def test_the_api_with_the_runs_token(run: Run, django_capture_on_commit_callbacks: Any) -> None:
    run = queue.run_transition(
        run_id=run.pk,
        to_state=RunState.RUNNING,
        door="worker",
        changes={"token_hash": queue.token_hash(queue.run_token(run=run))},
    )
    with django_capture_on_commit_callbacks(execute=True):
        response = Client().post(
            f"/api/v1/runs/{run.pk}/tracker-metrics/",
            data="\n".join(json_logger_lines(3)).encode(),
            content_type="application/x-ndjson",
            HTTP_AUTHORIZATION=f"Bearer {queue.run_token(run=run)}",
        )
    assert response.status_code == 202
    assert MetricPoint.objects.filter(run=run, key="train/loss").count() == 3


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (b"this is, not json\n", 400, "not a JSON lines file: line 1"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", 400, "not a JSON lines file"),
        (b"", 400, "holds no tracker record"),
        (
            b'{"event": "log", "step": 1, "metrics": {"a": "'
            + b"x" * (1024 * 1024 + 10)
            + b'"}}\n',
            413,
            "line 1 is longer than",
        ),
    ],
)
def test_the_api_refuses_what_is_not_a_tracker_file(
    run: Run, maintainer: Any, body: bytes, status: int, fragment: str
) -> None:
    client, token = maintainer_client(maintainer)
    response = client.post(
        f"/api/v1/runs/{run.pk}/tracker-metrics/",
        data=body,
        content_type="application/x-ndjson",
        HTTP_AUTHORIZATION=f"Token {token}",
    )
    assert response.status_code == status, response.content
    assert fragment in response.json()["detail"]
    assert not TrackerImport.objects.exists()
    assert not MetricPoint.objects.exists()


def test_the_api_refuses_a_ten_gigabyte_claim_before_reading(run: Run, maintainer: Any) -> None:
    client, token = maintainer_client(maintainer)
    response = client.post(
        f"/api/v1/runs/{run.pk}/tracker-metrics/",
        data=b"{}",
        content_type="application/x-ndjson",
        HTTP_AUTHORIZATION=f"Token {token}",
        CONTENT_LENGTH=str(10 * 1024**3),
    )
    assert response.status_code == 413
    assert "limit" in response.json()["detail"]


def test_the_api_strict_flag_refuses_the_whole_file(run: Run, maintainer: Any) -> None:
    client, token = maintainer_client(maintainer)
    lines = json_logger_lines(5)
    lines[2] = "{broken"
    response = client.post(
        f"/api/v1/runs/{run.pk}/tracker-metrics/?strict=1",
        data="\n".join(lines).encode(),
        content_type="application/x-ndjson",
        HTTP_AUTHORIZATION=f"Token {token}",
    )
    assert response.status_code == 400
    assert "line 3" in json.dumps(response.json())
    assert not TrackerImport.objects.exists()


def test_the_api_refuses_contributors(run: Run, contributor: Any) -> None:
    token = Token.objects.create(user=contributor).key
    response = Client().post(
        f"/api/v1/runs/{run.pk}/tracker-metrics/",
        data=b'{"config": {}}\n',
        content_type="application/x-ndjson",
        HTTP_AUTHORIZATION=f"Token {token}",
    )
    assert response.status_code == 403


# --- the run page's upload ------------------------------------------------------------------


def test_the_run_page_uploads_and_shows_the_import(
    run: Run, maintainer: Any, django_capture_on_commit_callbacks: Any
) -> None:
    client = Client()
    client.force_login(maintainer)
    lines = json_logger_lines(20)
    lines[4] = "garbage"
    upload = io.BytesIO(("\n".join(lines) + "\n").encode())
    upload.name = "tracker_metrics.jsonl"
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/runs/{run.pk}/import/", {"file": upload})
    assert response.status_code == 302
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "tracker_metrics.jsonl" in page
    assert "imported 57 points from 24 lines" in page
    assert "line 5: not JSON" in page
    assert MetricPoint.objects.filter(run=run).count() == 57


def test_the_run_page_shows_progress_while_importing(run: Run, maintainer: Any) -> None:
    """Without a worker yet, the upload waits: the page says so and refreshes itself."""
    client = Client()
    client.force_login(maintainer)
    upload = io.BytesIO(("\n".join(json_logger_lines(5)) + "\n").encode())
    upload.name = "t.jsonl"
    client.post(f"/runs/{run.pk}/import/", {"file": upload})  # on_commit never runs here
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'data-import-state="pending"' in page
    assert '<meta http-equiv="refresh" content="3">' in page
    assert "0 of 9 lines" in page


def test_the_run_page_upload_refuses_contributors_and_non_json(
    run: Run, contributor: Any, maintainer: Any
) -> None:
    client = Client()
    client.force_login(contributor)
    upload = io.BytesIO(b'{"config": {}}\n')
    upload.name = "t.jsonl"
    assert client.post(f"/runs/{run.pk}/import/", {"file": upload}).status_code == 403
    client.force_login(maintainer)
    upload = io.BytesIO(b"<html>not this</html>\n")
    upload.name = "t.jsonl"
    response = client.post(f"/runs/{run.pk}/import/", {"file": upload})
    assert response.status_code == 400
    assert "not a JSON lines file" in response.content.decode()
    assert not TrackerImport.objects.exists()


def test_a_lost_worker_is_picked_up_by_the_resume_pass(run: Run, maintainer: Any) -> None:
    client = Client()
    client.force_login(maintainer)
    upload = io.BytesIO(("\n".join(json_logger_lines(5)) + "\n").encode())
    upload.name = "t.jsonl"
    client.post(f"/runs/{run.pk}/import/", {"file": upload})  # the nudge is lost
    assert tracker_import.tracker_imports_resume() == 1
    assert TrackerImport.objects.get(run=run).state == "done"
    assert tracker_import.tracker_imports_resume() == 0  # nothing left; done stays done
    assert MetricPoint.objects.filter(run=run).count() == 15
