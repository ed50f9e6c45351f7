"""The runner's report door (``POST /api/v1/runs/{id}/report/``): config, summary and
artifacts a tracker reports besides points, merged into the run; bad input refused."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.test import APIClient

from runs import tokens
from runs.models import Run, RunState
from runs.services import runs as run_writes
from tests.runs.runs_helpers import launched_plan

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(recipe: Any) -> tuple[Run, str]:
    runs = list(Run.objects.filter(plan=launched_plan(recipe)).order_by("pk"))
    run = run_writes.run_transition(
        run_id=runs[0].pk,
        to_state=RunState.RUNNING,
        door="worker",
        changes={"token_hash": tokens.token_hash(tokens.run_token(run=runs[0]))},
    )
    return run, tokens.run_token(run=run)


def report(run: Run, token: str, body: Any) -> Any:
    return APIClient().post(
        f"/api/v1/runs/{run.pk}/report/",
        data=json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )


def test_config_summary_and_artifacts_merge_into_the_run(running: tuple[Run, str]) -> None:
    run, token = running
    assert report(run, token, {"config": {"lr": 0.1, "model": {"width": 32}}}).status_code == 200
    assert report(run, token, {"config": {"steps": 10}}).status_code == 200
    answer = report(
        run,
        token,
        {
            "summary": {"eval/loss": 2.5, "bad key": 1.0, "ok": 3},
            "artifacts": [{"uri": "https://example.org/ckpt", "name": "ckpt"}],
        },
    )
    assert answer.status_code == 200
    assert answer.json()["left_out"] == ["bad key"]
    report(run, token, {"artifacts": [{"uri": "https://example.org/ckpt", "name": "ckpt"}]})
    run.refresh_from_db()
    assert run.tracker_config == {"lr": 0.1, "model": {"width": 32}, "steps": 10}
    assert run.final_metrics == {"eval/loss": 2.5, "ok": 3.0}
    assert run.tracker_artifacts == [
        {"uri": "https://example.org/ckpt", "name": "ckpt", "type": ""}
    ]


@pytest.mark.parametrize(
    "body",
    [
        [1, 2],
        {"unknown": 1},
        {"config": "not an object"},
        {"summary": [1]},
        {"artifacts": [{"name": "no uri"}]},
        {"artifacts": [{"uri": "x" * 2001}]},
        {"artifacts": [{"uri": "u"}] * 101},
    ],
)
def test_bad_reports_are_refused_and_change_nothing(running: tuple[Run, str], body: Any) -> None:
    run, token = running
    assert report(run, token, body).status_code == 400
    run.refresh_from_db()
    assert run.tracker_config is None and run.final_metrics == {} and run.tracker_artifacts == []


def test_a_token_reports_for_its_own_run_only(running: tuple[Run, str]) -> None:
    run, token = running
    other = Run.objects.filter(plan=run.plan).exclude(pk=run.pk).get()
    assert report(other, token, {"config": {"a": 1}}).status_code == 403
    other.refresh_from_db()
    assert other.tracker_config is None
    assert APIClient().post(f"/api/v1/runs/{run.pk}/report/", {}, format="json").status_code == 401


def test_the_page_links_http_artifacts_only(running: tuple[Run, str]) -> None:
    run, token = running
    report(
        run,
        token,
        {
            "artifacts": [
                {"uri": "https://example.org/a", "name": "web"},
                {"uri": "javascript:alert(1)", "name": "js"},
                {"uri": "gs://bucket/ckpt", "name": "gcs"},
            ]
        },
    )
    page = APIClient().get(f"/runs/{run.pk}/").content.decode()
    assert '<a href="https://example.org/a"' in page
    assert 'href="javascript' not in page
    assert "<code>gs://bucket/ckpt</code>" in page
