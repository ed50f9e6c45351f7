"""The input policy (marin_site/input.py) at the doors where issue 29 found it missing: each
example of the issue, and others of the same classes, answers 4xx naming the field and
stores nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from proposals.models import Comment, Proposal, Review
from runs import tokens
from runs.models import Recipe, Run, RunState
from runs.recipes.demo import TINY_MOE
from runs.services import runs as run_writes
from tests.factories import UserFactory
from tests.runs.runs_helpers import launched_plan
from tests.system.test_hostile_input import _post_raw, _proposal_body, _with

pytestmark = pytest.mark.django_db

JSON_FIELDS = ("default_config", "parameter_schema", "compute_model", "scales", "metrics")
DEEP_JSON = "[" * 5000 + "]" * 5000
HOSTILE_TEXT_AREAS = {
    "deep nesting": DEEP_JSON,
    "deep objects": '{"a":' * 3000 + "1" + "}" * 3000,
    "integer of 5000 digits": "9" * 5000,
    "integer of 5000 digits inside": '{"a": [' + "9" * 5000 + "]}",
    "lone surrogate": '{"a": "\\ud800"}',
    "surrogate key": '{"\\udfff": 1}',
    "nul": '{"a": "x\\u0000"}',
    "infinity by exponent": '{"a": 1e400}',
    "NaN constant": '{"a": NaN}',
}


def _signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _recipe_form(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "fresh",
        "version": "1",
        "title": "A fresh recipe",
        "description": "",
        "command_template": TINY_MOE["command_template"],
        "executor": "",
        "time_limit_seconds": 600,
        "is_active": "on",
    }
    for field in JSON_FIELDS:
        data[field] = json.dumps(TINY_MOE[field])
    return {**data, **overrides}


@pytest.mark.parametrize("field", JSON_FIELDS)
@pytest.mark.parametrize("name", sorted(HOSTILE_TEXT_AREAS))
def test_recipe_form_refuses_hostile_json_beside_the_field(
    maintainer: Any, field: str, name: str
) -> None:
    before = Recipe.objects.count()
    response = _signed_in(maintainer).post(
        "/recipes/new/", _recipe_form(**{field: HOSTILE_TEXT_AREAS[name]})
    )
    assert response.status_code == 400, (field, name, response.status_code)
    page = response.content.decode()
    assert f'id="id_{field}"' in page and "errorlist" in page
    assert Recipe.objects.count() == before


def test_recipe_form_still_takes_a_good_recipe(maintainer: Any) -> None:
    response = _signed_in(maintainer).post("/recipes/new/", _recipe_form())
    assert response.status_code == 302, response.content.decode()[:2000]
    assert Recipe.objects.filter(name="fresh").exists()


# ------------------------------------------------------------------- MLflow's door


def _mlflow(token: str, path: str, body: Any) -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode("utf-8", "surrogatepass")
    return Client().post(
        f"/mlflow/api/2.0/mlflow/{path}",
        raw,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )


@pytest.fixture
def running(recipe: Recipe) -> tuple[Run, str]:
    run = Run.objects.filter(plan=launched_plan(recipe)).order_by("pk").first()
    assert run is not None
    run = run_writes.run_transition(
        run_id=run.pk,
        to_state=RunState.RUNNING,
        door="worker",
        changes={"token_hash": tokens.token_hash(tokens.run_token(run=run))},
    )
    return run, tokens.run_token(run=run)


@pytest.mark.parametrize("path", ["runs/log-parameter", "runs/set-tag"])
@pytest.mark.parametrize("where", ["key", "value"])
@pytest.mark.parametrize(
    "raw", ["a\x00b", "\ud800", "x\udfffy", "\x00"], ids=["nul", "high", "low", "only nul"]
)
def test_mlflow_params_and_tags_refuse_nul_and_surrogates(
    running: tuple[Run, str], path: str, where: str, raw: str
) -> None:
    run, token = running
    body = {"run_id": str(run.pk), "key": "lr", "value": "0.1", where: raw}
    response = _mlflow(token, path, body)
    assert response.status_code == 400, (path, where, response.content[:300])
    assert response.json()["error_code"] == "INVALID_PARAMETER_VALUE"
    assert f"'{where}'" in response.json()["message"]
    run.refresh_from_db()
    assert run.config.get("lr") is None
    assert run.tracker_tags == {} or "lr" not in run.tracker_tags


@pytest.mark.parametrize(
    "body",
    [b'{"run_id": "1", "key": "a", "value": ' + b"[" * 5000 + b"]" * 5000 + b"}"],
    ids=["deep"],
)
def test_mlflow_refuses_deep_json(running: tuple[Run, str], body: bytes) -> None:
    _run, token = running
    response = _mlflow(token, "runs/set-tag", body)
    assert response.status_code == 400
    assert response.json()["error_code"] in {"INVALID_PARAMETER_VALUE", "BAD_REQUEST"}


# ------------------------------------------------------------------- ids are integers

ID_NOT_INTEGERS = {
    "1e400": "1e400",
    "-1e400": "-1e400",
    "1.5": "1.5",
    "1.0": "1.0",
    "true": "true",
    "string of digits": '"1"',
    "10**30": str(10**30),
}


def _comment_body(proposal: Proposal) -> dict[str, Any]:
    return {"proposal": proposal.pk, "body": "ok"}


def _review_body(proposal: Proposal) -> dict[str, Any]:
    return {"proposal": proposal.pk, "score": 4, "recommendation": "approve", "text": "ok"}


@pytest.mark.parametrize("name", sorted(ID_NOT_INTEGERS))
@pytest.mark.parametrize("door", ["comments", "reviews"])
def test_proposal_ids_must_be_integers(
    api_as: Any, reviewer: Any, proposal: Proposal, name: str, door: str
) -> None:
    # proposal 1 exists: 1.5 and 1.0 and "1" would land on it if they were read as 1
    assert proposal.pk == Proposal.objects.order_by("pk").first().pk  # type: ignore[union-attr]
    body = _comment_body(proposal) if door == "comments" else _review_body(proposal)
    text = _with(body, "proposal", ID_NOT_INTEGERS[name].replace("1", str(proposal.pk), 1))
    response = _post_raw(api_as(reviewer), f"/api/v1/{door}/", text)
    assert response.status_code == 400, (door, name, response.content[:300])
    assert "proposal" in json.dumps(response.json())  # as a key, or in the parser's words
    assert Comment.objects.count() == 0 and Review.objects.count() == 0


@pytest.mark.parametrize("name", sorted(ID_NOT_INTEGERS))
def test_recipe_id_of_a_proposal_must_be_an_integer(
    api_as: Any, contributor: Any, recipe: Recipe, name: str
) -> None:
    raw = ID_NOT_INTEGERS[name].replace("1", str(recipe.pk), 1)
    text = _with(_proposal_body(recipe), "recipe", raw)
    response = _post_raw(api_as(contributor), "/api/v1/proposals/", text)
    assert response.status_code == 400, (name, response.content[:300])
    assert "recipe" in json.dumps(response.json())
    assert Proposal.objects.count() == 0


def test_an_integer_id_is_still_taken(api_as: Any, reviewer: Any, proposal: Proposal) -> None:
    response = api_as(reviewer).post("/api/v1/comments/", _comment_body(proposal), format="json")
    assert response.status_code == 201, response.content


# ------------------------------------------------------------------- text and numbers


@pytest.mark.parametrize("field", ["title", "summary", "hypothesis", "success_metric"])
@pytest.mark.parametrize("raw", ["1e400", "12", "true", "[]"])
def test_text_fields_take_only_text(
    api_as: Any, contributor: Any, recipe: Recipe, field: str, raw: str
) -> None:
    text = _with(_proposal_body(recipe), field, raw)
    response = _post_raw(api_as(contributor), "/api/v1/proposals/", text)
    assert response.status_code == 400, (field, raw, response.content[:300])
    assert field in response.json()
    assert Proposal.objects.count() == 0


@pytest.mark.parametrize("field", ["success_threshold", "budget_accelerator_hours"])
@pytest.mark.parametrize("raw", ["true", "false", '"0.5"'])
def test_numbers_are_not_booleans_or_text(
    api_as: Any, contributor: Any, recipe: Recipe, field: str, raw: str
) -> None:
    text = _with(_proposal_body(recipe), field, raw)
    response = _post_raw(api_as(contributor), "/api/v1/proposals/", text)
    assert response.status_code == 400, (field, raw, response.content[:300])
    assert field in response.json()
    assert Proposal.objects.count() == 0


INVISIBLE_TITLES = {
    "control characters": "\x01\x02\x1f",
    "zero-width spaces": "\u200b\u200b",
    "zero-width joiner and BOM": "\u200d\ufeff",
    "ideographic space": "\u3000",
    "line separator": "\u2028",
    "bidi marks": "\u202e\u200f",
}


@pytest.mark.parametrize("name", sorted(INVISIBLE_TITLES))
def test_a_title_needs_a_visible_character_at_every_door(
    api_as: Any, contributor: Any, recipe: Recipe, name: str
) -> None:
    body = {**_proposal_body(recipe), "title": INVISIBLE_TITLES[name]}
    response = api_as(contributor).post("/api/v1/proposals/", body, format="json")
    assert response.status_code == 400, (name, response.content[:300])
    assert "title" in response.json()

    form = _form_proposal(recipe, title=INVISIBLE_TITLES[name])
    page = _signed_in(contributor).post("/proposals/new/", form)
    assert page.status_code == 400, (name, page.status_code)
    words = page.content.decode()
    assert "visible" in words or "required" in words  # spaces alone are trimmed to nothing
    assert Proposal.objects.count() == 0


def _form_proposal(recipe: Recipe, **overrides: Any) -> dict[str, Any]:
    body = _proposal_body(recipe)
    data = {k: v for k, v in body.items() if k not in {"baseline", "ablation_spec"}}
    data.update(baseline="learning_rate: 0.002", ablation_spec=body["ablation_spec"], action="save")
    return {**data, **overrides}


def test_a_visible_title_with_a_zero_width_space_is_kept(
    api_as: Any, contributor: Any, recipe: Recipe
) -> None:
    body = {**_proposal_body(recipe), "title": "  MoE\u200b router  "}
    response = api_as(contributor).post("/api/v1/proposals/", body, format="json")
    assert response.status_code == 201, response.content
    assert Proposal.objects.get().title == "MoE\u200b router"


# ------------------------------------------------------------------- web form encoding


@pytest.mark.parametrize(
    "raw",
    [b"title=caf%E9", b"title=%ED%A0%80", b"title=%FF%FE", b"ti%FFtle=x", b"title=ok&summary=%C3"],
    ids=["latin-1", "encoded surrogate", "bom bytes", "bad name", "truncated"],
)
def test_a_web_form_not_in_utf8_is_refused_in_words(
    contributor: Any, recipe: Recipe, raw: bytes
) -> None:
    response = _signed_in(contributor).post(
        "/proposals/new/", raw, content_type="application/x-www-form-urlencoded"
    )
    assert response.status_code == 400
    assert "UTF-8" in response.content.decode()
    assert Proposal.objects.count() == 0


def test_a_multipart_form_not_in_utf8_is_refused(contributor: Any, proposal: Proposal) -> None:
    boundary = "XyZ"
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="body"\r\n\r\n'.encode()
        + b"caf\xe9\r\n"
        + f"--{boundary}--\r\n".encode()
    )
    response = _signed_in(contributor).post(
        f"/proposals/{proposal.pk}/comment/",
        body,
        content_type=f"multipart/form-data; boundary={boundary}",
    )
    assert response.status_code == 400
    assert "UTF-8" in response.content.decode()
    assert Comment.objects.count() == 0


# ------------------------------------------------------------------- permission first


def test_a_plain_users_outcome_is_refused_as_forbidden_not_as_incomplete(
    api_as: Any, proposal: Proposal
) -> None:
    outsider = UserFactory.create(username="olga")
    response = api_as(outsider).post(f"/api/v1/proposals/{proposal.pk}/outcome/", {}, format="json")
    assert response.status_code == 403, response.content
    assert "confidence" not in json.dumps(response.json())

    page = _signed_in(outsider).post(f"/proposals/{proposal.pk}/outcome/", {})
    assert page.status_code == 403
    assert "confidence" not in page.content.decode().lower()


@pytest.mark.parametrize("action", ["approve", "reject", "hold", "request-changes"])
def test_a_plain_users_transition_with_a_bad_body_is_forbidden_first(
    api_as: Any, proposal: Proposal, action: str
) -> None:
    outsider = UserFactory.create(username="olga")
    text = json.dumps({"reason": ["not", "text"]})
    response = _post_raw(api_as(outsider), f"/api/v1/proposals/{proposal.pk}/{action}/", text)
    assert response.status_code == 403, (action, response.content)


@pytest.mark.parametrize("name", ['{"a": "\\ud800"}', "a/b", "\u200b", "x" * 300])
def test_recipe_edit_with_a_name_that_cannot_be_a_url_is_refused_not_a_500(
    maintainer: Any, recipe: Recipe, name: str
) -> None:
    response = _signed_in(maintainer).post(
        f"/recipes/{recipe.name}/v{recipe.version}/edit/", _recipe_form(name=name)
    )
    assert response.status_code == 400
    assert Recipe.objects.get(pk=recipe.pk).name == recipe.name


@pytest.mark.parametrize("field", JSON_FIELDS)
def test_an_empty_json_text_area_is_not_a_null_in_the_database(
    maintainer: Any, recipe: Recipe, field: str
) -> None:
    response = _signed_in(maintainer).post(
        f"/recipes/{recipe.name}/v{recipe.version}/edit/", _recipe_form(**{field: ""})
    )
    assert response.status_code in {302, 400}, (field, response.status_code)


@pytest.mark.parametrize(("field", "value"), [("note", "a\x00b"), ("days", "a\x00b")])
def test_a_pool_token_refused_answers_400_and_makes_no_token(
    maintainer: Any, field: str, value: str
) -> None:
    from runs.pools.models import Pool, RegistrationToken

    pool = Pool.objects.create(name="gpu", owner=maintainer, labels=["gpu:a5000"])
    response = _signed_in(maintainer).post(f"/pools/{pool.name}/tokens/", {field: value})
    assert response.status_code == 400
    assert not RegistrationToken.objects.exists()
