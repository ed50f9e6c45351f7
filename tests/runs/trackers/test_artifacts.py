"""Links a run reports about itself (W&B, checkpoints, others): checked, kept once, shown."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from runs import tokens
from runs.models import Run, RunArtifact, RunState
from runs.services import runs as run_writes
from tests.runs.runs_helpers import launched_plan

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(recipe: Any) -> tuple[Run, APIClient]:
    plan = launched_plan(recipe, "")
    run = Run.objects.get(plan=plan)
    run_writes.run_transition(
        run_id=run.pk,
        to_state=RunState.RUNNING,
        door="worker",
        changes={"token_hash": tokens.token_hash(tokens.run_token(run=run))},
    )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {tokens.run_token(run=run)}")
    return Run.objects.get(pk=run.pk), client


def test_a_run_reports_its_wandb_run_and_checkpoints(running: tuple[Run, APIClient]) -> None:
    run, runner = running
    url = f"/api/v1/runs/{run.pk}/artifacts/"

    wandb = runner.post(
        url, {"kind": "wandb", "uri": "https://wandb.ai/marin/runs/abc"}, format="json"
    )
    checkpoint = runner.post(
        url, {"kind": "checkpoint", "uri": "gs://marin/ckpt/step-100", "step": 100}, format="json"
    )
    again = runner.post(
        url, {"kind": "checkpoint", "uri": "gs://marin/ckpt/step-100"}, format="json"
    )

    assert (wandb.status_code, checkpoint.status_code, again.status_code) == (201, 201, 201)
    assert again.json()["id"] == checkpoint.json()["id"]
    run.refresh_from_db()
    assert run.wandb_url == "https://wandb.ai/marin/runs/abc"
    assert RunArtifact.objects.filter(run=run).count() == 2
    page = Client().get(f"/runs/{run.pk}/").content.decode()
    assert 'href="https://wandb.ai/marin/runs/abc"' in page
    assert "<code>gs://marin/ckpt/step-100</code>" in page  # shown, never a link
    detail = APIClient().get(f"/api/v1/runs/{run.pk}/").json()
    assert [a["kind"] for a in detail["artifacts"]] == ["wandb", "checkpoint"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "video", "uri": "https://x.org"}, "kind"),
        ({"kind": "link", "uri": "javascript:alert(1)"}, "uri"),
        ({"kind": "link", "uri": "https://x.org/a b"}, "uri"),
        ({"kind": "wandb", "uri": "http://wandb.ai/x"}, "uri"),
        ({"kind": "link", "uri": "https://x.org", "step": -1}, "step"),
        ({"kind": "link", "uri": "https://x.org", "name": "a\nb"}, "name"),
    ],
)
def test_a_bad_artifact_is_refused_naming_the_field(
    running: tuple[Run, APIClient], body: dict[str, Any], field: str
) -> None:
    run, runner = running

    response = runner.post(f"/api/v1/runs/{run.pk}/artifacts/", body, format="json")

    assert response.status_code == 400
    assert list(response.json()) == [field]
    assert not RunArtifact.objects.exists()


def test_a_finished_run_takes_no_artifacts(running: tuple[Run, APIClient]) -> None:
    run, runner = running
    run_writes.run_transition(run_id=run.pk, to_state=RunState.FINISHED, door="runner")

    response = runner.post(
        f"/api/v1/runs/{run.pk}/artifacts/", {"kind": "link", "uri": "https://x.org"}, format="json"
    )

    assert response.status_code == 409
    assert not RunArtifact.objects.exists()
