"""POST /api/v1/verdicts/check/ answers what manage.py verdict_check prints."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from runs.verdicts.rules import RULES

pytestmark = pytest.mark.django_db

SPEEDUP: dict[str, Any] = {
    "rule": {"kind": "effective_speedup", "asymptote": 1.6, "alpha": 0.0941},
    "scales": [
        {
            "name": "d512",
            "budget": 2.19e17,
            "baseline": {"loss": 3.71, "tokens_per_second": 400000},
            "variant": {"loss": 3.69, "tokens_per_second": 390000},
        }
    ],
}
REFIT: dict[str, Any] = {
    "rule": {"kind": "pinned_refit", "asymptote": 1.6, "project_to": [1e21, 1e23]},
    "points": [{"budget": 1e18, "loss": 3.6}, {"budget": 1e20, "loss": 2.6}],
}


def command(path: str, *args: str) -> Any:
    out = StringIO()
    call_command("verdict_check", path, *args, stdout=out)
    return json.loads(out.getvalue())


@pytest.mark.parametrize("payload", [SPEEDUP, REFIT])
def test_the_command_and_the_api_answer_alike(
    payload: dict, api: APIClient, tmp_path: Path
) -> None:
    path = tmp_path / "claim.json"
    path.write_text(json.dumps(payload))
    printed = command(str(path))
    answered = api.post("/api/v1/verdicts/check/", payload, format="json")
    assert answered.status_code == 200
    assert answered.json() == printed
    if payload is SPEEDUP:
        assert printed["passed"] is True
        assert [s["name"] for s in printed["scales"]] == ["d512"]
    else:
        assert set(printed) == {"A", "alpha", "r2", "projections"}
        assert printed["projections"][0]["budget"] == 1e21


def test_the_command_reads_standard_input(monkeypatch: pytest.MonkeyPatch) -> None:
    class Stdin:
        buffer = __import__("io").BytesIO(json.dumps(SPEEDUP).encode())

    monkeypatch.setattr("sys.stdin", Stdin)
    printed = command("-", "--explain")
    assert printed["verdict"]["rule"] == "effective_speedup"
    assert printed["verdict"]["parameters"] == {
        "asymptote": 1.6,
        "alpha": 0.0941,
        "metric": "eval/paloma/macro_loss",
    }
    assert any("stepwise" in step for step in printed["verdict"]["steps"])


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**SPEEDUP, "rule": {"kind": "nope"}}, "rule.kind"),
        ({**SPEEDUP, "rule": {"kind": "effective_speedup", "alpha": 5}}, "rule.alpha"),
        ({**REFIT, "points": REFIT["points"][:1]}, "points"),
    ],
)
def test_refusals_exit_non_zero_and_answer_400(
    body: dict, field: str, api: APIClient, tmp_path: Path
) -> None:
    path = tmp_path / "claim.json"
    path.write_text(json.dumps(body))
    with pytest.raises(CommandError, match=field.replace("[", r"\[").replace("]", r"\]")):
        command(str(path))
    answered = api.post("/api/v1/verdicts/check/", body, format="json")
    assert answered.status_code == 400
    assert answered.json()["field"] == field
    assert body["rule"]["kind"] in answered.json()["detail"]


def test_not_json_and_not_an_object_are_refused(api: APIClient, tmp_path: Path) -> None:
    path = tmp_path / "claim.json"
    path.write_text("{not json")
    with pytest.raises(CommandError, match="not JSON"):
        command(str(path))
    with pytest.raises(CommandError, match="cannot be read"):
        command(str(tmp_path / "missing.json"))
    answered = api.post("/api/v1/verdicts/check/", [1, 2], format="json")
    assert answered.status_code == 400


def test_the_rules_are_listed_with_their_parameters(api: APIClient) -> None:
    answered = api.get("/api/v1/verdicts/rules/")
    assert answered.status_code == 200
    rules = {r["kind"]: r for r in answered.json()["rules"]}
    assert set(rules) == set(RULES)
    alpha = next(p for p in rules["effective_speedup"]["parameters"] if p["name"] == "alpha")
    assert alpha["default"] == 0.0941 and alpha["range"] == "a number in (0, 3]"
