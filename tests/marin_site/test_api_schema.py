"""The OpenAPI schema: valid, without generator warnings, and saying what the API answers."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
import yaml
from django.core.management import call_command
from django.test import Client

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def schema(django_db_blocker: Any) -> dict[str, Any]:
    out = StringIO()
    with django_db_blocker.unblock():
        call_command("spectacular", "--validate", "--fail-on-warn", stdout=out)
    loaded: dict[str, Any] = yaml.safe_load(out.getvalue())
    return loaded


def _operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (path, method, op)
        for path, item in schema["paths"].items()
        for method, op in item.items()
        if isinstance(op, dict) and "responses" in op
    ]


def test_every_read_is_open_to_visitors(schema: dict[str, Any]) -> None:
    reads = [(p, op) for p, m, op in _operations(schema) if m == "get"]
    assert len(reads) > 15
    for path, op in reads:
        assert {} in op.get("security", [{}]), path


def test_every_write_documents_its_refusals(schema: dict[str, Any]) -> None:
    for path, method, op in _operations(schema):
        if method in {"post", "put", "patch", "delete"}:
            assert {"400", "401", "403", "413", "415"} <= set(op["responses"]), (method, path)
            if "{" in path:
                assert {"404", "409"} <= set(op["responses"]), (method, path)


def test_a_body_of_a_media_type_nothing_parses_is_a_documented_415(
    schema: dict[str, Any],
) -> None:
    # The agent's register door parses its body before any account is known.
    answer = Client().post("/api/v1/agent/register/", data="name=x", content_type="text/plain")
    assert answer.status_code == 415
    assert "415" in schema["paths"]["/api/v1/agent/register/"]["post"]["responses"]


def test_a_transition_refusal_names_the_allowed_states(schema: dict[str, Any]) -> None:
    approve = schema["paths"]["/api/v1/proposals/{id}/approve/"]["post"]
    ref = approve["responses"]["409"]["content"]["application/json"]["schema"]["$ref"]
    component = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert {"detail", "current_state", "allowed_states"} <= set(component["properties"])


def test_the_csv_export_is_documented_as_csv(schema: dict[str, Any]) -> None:
    csv = schema["paths"]["/api/v1/runs/{id}/metrics.csv/"]["get"]
    assert "text/csv" in csv["responses"]["200"]["content"]


def test_logs_and_series_answers_have_their_shapes(schema: dict[str, Any]) -> None:
    components = schema["components"]["schemas"]
    logs = schema["paths"]["/api/v1/runs/{id}/logs/"]["get"]["responses"]["200"]
    ref = logs["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    assert components[ref]["properties"]["logs"]["type"] == "string"
    chart = schema["paths"]["/api/v1/plans/{plan_id}/series/"]["get"]["responses"]["200"]
    ref = chart["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    assert {"active", "keys", "runs", "series"} <= set(components[ref]["properties"])


def test_optional_links_and_unset_verdicts_are_nullable(schema: dict[str, Any]) -> None:
    proposal = schema["components"]["schemas"]["Proposal"]["properties"]
    for name in ("wandb_url", "pr_url", "data_browser_url"):
        assert proposal[name].get("nullable") is True, name
    for name in ("outcome", "confidence"):
        assert proposal[name].get("nullable") is True or "oneOf" in proposal[name], name


def test_an_unset_link_and_verdict_read_as_null_and_null_clears_a_link(
    api_as: Any, proposal: Any, contributor: Any
) -> None:
    api = api_as(contributor)
    body = api.get(f"/api/v1/proposals/{proposal.pk}/").json()
    assert (body["wandb_url"], body["outcome"], body["confidence"]) == (None, None, None)
    url = f"/api/v1/proposals/{proposal.pk}/"
    set_link = api.patch(url, {"wandb_url": "https://wandb.ai/x/y"}, format="json")
    assert set_link.status_code == 200
    assert set_link.json()["wandb_url"] == "https://wandb.ai/x/y"
    cleared = api.patch(url, {"wandb_url": None}, format="json")
    assert cleared.status_code == 200
    assert cleared.json()["wandb_url"] is None
    proposal.refresh_from_db()
    assert proposal.wandb_url == ""
