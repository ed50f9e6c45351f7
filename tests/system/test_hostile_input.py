"""Hostile values through the doors that take structured input: every one answers 4xx
naming where the problem is, and nothing is stored.

The table is crossed with the doors below, so a value class added here is tried everywhere.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.test import APIClient

from proposals.models import Comment, Proposal
from runs.models import Recipe
from tests.factories import WALKTHROUGH_SPEC

pytestmark = pytest.mark.django_db

DEEP = "[" * 200 + "]" * 200


# Raw JSON fragments (so surrogates and huge numbers reach the server exactly as a hostile
# client would send them), each put where a string or a config value is expected.
HOSTILE_JSON_VALUES = {
    "nul": '"a\\u0000b"',
    "lone surrogate": '"\\ud800"',
    "low surrogate alone": '"x\\udfffy"',
    "deep nesting": DEEP,
    "integer past 64 bits": str(10**30),
    "integer of 5000 digits": "9" * 5000,
}
HOSTILE_JSON_KEYS = {
    "nul in a key": '"k\\u0000"',
    "surrogate in a key": '"\\ud83d"',
}


def _proposal_body(recipe: Recipe) -> dict[str, Any]:
    return {
        "title": "Capacity factor ablation",
        "summary": "Does a higher capacity factor lower the drop fraction?",
        "description": "We vary it.",
        "hypothesis": "A higher capacity factor lowers the drop fraction.",
        "success_metric": "moe/drop_fraction",
        "success_direction": "lower",
        "success_threshold": 0.01,
        "recipe": recipe.pk,
        "baseline": {"learning_rate": 0.002},
        "ablation_spec": WALKTHROUGH_SPEC,
        "budget_accelerator_hours": 1.0,
    }


def _with(body: dict[str, Any], field: str, raw: str) -> str:
    """``body`` as JSON text with ``field``'s value replaced by the raw fragment."""
    marker = "__HOSTILE__"
    text = json.dumps({**body, field: marker})
    return text.replace(json.dumps(marker), raw)


def _post_raw(api: APIClient, path: str, text: str) -> Any:
    body: Any = text.encode("utf-8", "surrogatepass")  # bytes as a hostile client sends them
    return api.generic("POST", path, body, "application/json")


@pytest.mark.parametrize("field", ["title", "hypothesis", "baseline", "ablation_spec"])
@pytest.mark.parametrize("name", sorted(HOSTILE_JSON_VALUES))
def test_proposal_create_refuses_hostile_values(
    api_as: Any, contributor: Any, recipe: Recipe, name: str, field: str
) -> None:
    raw = HOSTILE_JSON_VALUES[name]
    if field == "baseline":
        raw = '{"learning_rate": ' + raw + "}"
    response = _post_raw(
        api_as(contributor), "/api/v1/proposals/", _with(_proposal_body(recipe), field, raw)
    )
    assert 400 <= response.status_code < 500, (name, field, response.status_code)
    assert Proposal.objects.count() == 0


@pytest.mark.parametrize("name", sorted(HOSTILE_JSON_KEYS))
def test_hostile_keys_in_baseline_are_refused_naming_the_field(
    api_as: Any, contributor: Any, recipe: Recipe, name: str
) -> None:
    raw = "{" + HOSTILE_JSON_KEYS[name] + ": 1}"
    response = _post_raw(
        api_as(contributor), "/api/v1/proposals/", _with(_proposal_body(recipe), "baseline", raw)
    )
    assert response.status_code == 400
    assert "baseline" in json.dumps(response.json())
    assert Proposal.objects.count() == 0


WRONG_TYPES = {
    "title": ["a", "list"],
    "summary": {"a": "mapping"},
    "success_threshold": "not a number",
    "recipe": "tiny",
    "baseline": ["not", "a", "mapping"],
    "ablation_spec": {"axes": "as an object"},
    "labels": {"moe": True},
}


@pytest.mark.parametrize("field", sorted(WRONG_TYPES))
def test_values_of_the_wrong_type_are_refused_naming_the_field(
    api_as: Any, contributor: Any, recipe: Recipe, field: str
) -> None:
    body = {**_proposal_body(recipe), field: WRONG_TYPES[field]}
    response = api_as(contributor).post("/api/v1/proposals/", body, format="json")
    assert response.status_code == 400
    assert field in response.json() or field in json.dumps(response.json())
    assert Proposal.objects.count() == 0


@pytest.mark.parametrize("field", ["budget_accelerator_hours", "success_threshold"])
@pytest.mark.parametrize("raw", ["1e400", "-1e400", "NaN", "Infinity"])
def test_numbers_json_cannot_spell_are_refused(
    api_as: Any, contributor: Any, recipe: Recipe, field: str, raw: str
) -> None:
    text = _with(_proposal_body(recipe), field, raw)
    response = _post_raw(api_as(contributor), "/api/v1/proposals/", text)
    assert response.status_code == 400, (field, raw, response.content[:300])
    assert Proposal.objects.count() == 0


HOSTILE_SPECS = {
    "duplicate key": "axes:\n  weight_decay: [0.0]\n  weight_decay: [0.1]\n",
    "duplicate top-level key": "seeds: [0]\nseeds: [1]\n",
    "bool tag on a word": "axes:\n  weight_decay: !!bool maybe\n",
    "int tag on a word": "axes:\n  weight_decay: [!!int abc]\n",
    "float tag on a word": "axes:\n  weight_decay: [!!float abc]\n",
    "binary": "axes:\n  weight_decay: !!binary aGVsbG8=\n",
    "set": "axes: !!set {a, b}\n",
    "python object": "axes: !!python/object:os.system {}\n",
    "integer of 5000 digits": "seeds: [" + "9" * 5000 + "]\n",
    "integer past 64 bits in an axis": "axes:\n  weight_decay: [" + str(10**30) + "]\n",
    "nul escape": 'axes:\n  "weight\\0decay": [0.1]\n',
    "surrogate escape": 'axes:\n  weight_decay: ["\\ud800"]\n',
    "list as a key": "axes:\n  ? [a, b]\n  : [1]\n",
    "seed of 10^30": "seeds: [" + str(10**30) + "]\n",
}


@pytest.mark.parametrize("name", sorted(HOSTILE_SPECS))
def test_hostile_specs_are_refused_at_every_door_that_reads_them(
    api_as: Any, contributor: Any, recipe: Recipe, name: str
) -> None:
    api = api_as(contributor)
    body = {**_proposal_body(recipe), "ablation_spec": HOSTILE_SPECS[name]}
    created = api.post("/api/v1/proposals/", body, format="json")
    assert created.status_code == 400, (name, created.content[:300])
    assert "ablation_spec" in created.json()
    assert Proposal.objects.count() == 0

    preview = api.post(
        "/api/v1/plans/preview/",
        {"recipe": recipe.pk, "ablation_spec": HOSTILE_SPECS[name]},
        format="json",
    )
    assert preview.status_code == 400, (name, preview.content[:300])

    form = _form_client(contributor).post(
        "/proposals/new/", _form_data(recipe, HOSTILE_SPECS[name])
    )
    assert form.status_code == 400  # the form again, with the error beside the field
    assert "ablation_spec" in form.content.decode() or "spec" in form.content.decode()
    assert Proposal.objects.count() == 0


def _form_client(user: Any) -> Any:
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client


def _form_data(recipe: Recipe, spec: str) -> dict[str, Any]:
    body = _proposal_body(recipe)
    return {
        **{k: v for k, v in body.items() if k not in {"baseline", "recipe"}},
        "recipe": recipe.pk,
        "baseline": "learning_rate: 0.002",
        "ablation_spec": spec,
        "action": "save",
    }


@pytest.mark.parametrize("name", sorted(HOSTILE_JSON_VALUES))
def test_comments_refuse_hostile_bodies(
    api_as: Any, contributor: Any, proposal: Proposal, name: str
) -> None:
    text = _with({"proposal": proposal.pk, "body": "ok"}, "body", HOSTILE_JSON_VALUES[name])
    response = _post_raw(api_as(contributor), "/api/v1/comments/", text)
    assert 400 <= response.status_code < 500
    assert Comment.objects.count() == 0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("version", "1/2"),
        ("version", "../x"),
        ("version", ""),
        ("name", "Tiny MoE"),
        ("name", "a/b"),
    ],
)
def test_recipe_names_and_versions_that_would_break_urls_are_refused(
    api_as: Any, maintainer: Any, recipe: Recipe, field: str, value: str
) -> None:
    from runs.recipes.demo import TINY_MOE

    before = Recipe.objects.count()
    body = {**TINY_MOE, "name": "fresh", "version": "2", field: value}
    response = api_as(maintainer).post("/api/v1/recipes/", body, format="json")
    assert response.status_code == 400, response.content[:300]
    assert field in response.json()
    assert Recipe.objects.count() == before


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/search/?q=moe",
        "/api/v1/search/?q=%28",
        "/api/v1/search/?q=moe&format=csv",
        "/api/v1/proposals/",
        "/api/v1/proposals/?q=state:approved",
        "/api/v1/runs/",
        "/api/v1/recipes/",
        "/api/v1/board/",
        "/api/v1/board/?track=nope&page=x",
        "/api/v1/board/tracks/",
        "/board/chart.json?track=nope",
        "/board/feed/?track=nope",
    ],
)
@pytest.mark.parametrize("accept", ["text/html", "application/xml", "*/*", "text/csv"])
def test_api_reads_answer_any_accept_header_without_a_server_error(
    client: Any, proposal: Proposal, path: str, accept: str
) -> None:
    response = client.get(path, HTTP_ACCEPT=accept)
    assert response.status_code < 500, (path, accept, response.status_code)
