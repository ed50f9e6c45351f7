"""Uploads of a ``tracker_metrics.jsonl``: the streamed API, the run page's form, the task
and its progress, refusals before anything is kept."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.test import Client
from rest_framework.authtoken.models import Token

from runs import tokens
from runs.models import MetricPoint, Run, RunState, TrackerImport
from runs.services import runs as run_writes
from runs.trackers import uploads as tracker_uploads
from tests.runs.runs_helpers import eager_tasks, launched_plan  # noqa: F401
from tests.runs.tracker_helpers import json_logger_lines

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("eager_tasks")]


@pytest.fixture
def run(recipe: Any) -> Run:
    run = Run.objects.filter(plan=launched_plan(recipe)).order_by("pk").first()
    assert run is not None
    return run


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
    run = run_writes.run_transition(
        run_id=run.pk,
        to_state=RunState.RUNNING,
        door="worker",
        changes={"token_hash": tokens.token_hash(tokens.run_token(run=run))},
    )
    with django_capture_on_commit_callbacks(execute=True):
        response = Client().post(
            f"/api/v1/runs/{run.pk}/tracker-metrics/",
            data="\n".join(json_logger_lines(3)).encode(),
            content_type="application/x-ndjson",
            HTTP_AUTHORIZATION=f"Bearer {tokens.run_token(run=run)}",
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
    assert tracker_uploads.tracker_imports_resume() == 1
    assert TrackerImport.objects.get(run=run).state == "done"
    assert tracker_uploads.tracker_imports_resume() == 0  # nothing left; done stays done
    assert MetricPoint.objects.filter(run=run).count() == 15
