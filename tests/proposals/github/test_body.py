"""The experiment issue form (.github/ISSUE_TEMPLATE/experiment.yml) and the parser agree.

Bodies are rendered from the form file itself the way GitHub renders a submitted issue
form: ``### <label>``, a blank line, the answer, a blank line; ``_No response_`` for an
optional field left empty; an answer of a ``render:`` field inside a fence of that language.
Also here: summary and description kept apart, template prompts never stored, and every
field read from an issue shown by the API.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from django.conf import settings
from rest_framework.test import APIClient

from proposals.github.body import SECTION_FIELDS, heading_name, issue_fields
from proposals.models import Proposal, State
from tests.proposals.github_support import (
    fake_github,
    github_on,
    issue_payload,
    issues_delivery,
    post_delivery,
    process_deliveries,
)

__all__ = ["fake_github", "github_on"]

FORM = Path(settings.BASE_DIR) / ".github" / "ISSUE_TEMPLATE" / "experiment.yml"
SPEC = "axes:\n  capacity_factor: [1.0, 1.25]\nscales: [small]\nseeds: [0]"
ANSWERS = {
    "summary": "Does a higher capacity factor lower the drop fraction?",
    "hypothesis": "A capacity factor of 1.25 lowers the drop fraction.\n\nEval loss does not rise.",
    "success-criteria": "eval/loss lower by 0.01",
    "recipe": "",  # filled with the test recipe's name
    "baseline": "weight_decay: 0.1",
    "ablation-spec": SPEC,
    "description": "We vary the **capacity factor** of the router.\n\n- one\n- two",
    "links": (
        "- WandB report: https://wandb.ai/marin-community/marin/reports/Cap--X\n"
        "- Data browser: https://marin.community/data-browser/experiment/?path=cap\n"
        "- Experiment JSON: https://example.org/cap.json"
    ),
}


def form() -> dict[str, Any]:
    return yaml.safe_load(FORM.read_text())


def fields_of_form() -> list[dict[str, Any]]:
    return [element for element in form()["body"] if element["type"] != "markdown"]


def render_issue_form(answers: dict[str, str]) -> str:
    """An issue body as GitHub renders the submitted form."""
    body = ""
    for element in fields_of_form():
        attributes = element["attributes"]
        value = answers.get(element["id"], "").strip()
        if not value:
            value = "_No response_"
        elif attributes.get("render"):
            value = f"```{attributes['render']}\n{value}\n```"
        body += f"### {attributes['label']}\n\n{value}\n\n"
    return body


def test_the_form_is_an_issue_form_the_parser_reads_whole() -> None:
    data = form()
    assert data["name"] and data["description"]
    assert data["labels"] == ["experiment"]
    ids = [element["id"] for element in fields_of_form()]
    assert len(ids) == len(set(ids))
    assert {"summary", "hypothesis", "success-criteria", "baseline", "recipe"} <= set(ids)
    assert {"ablation-spec", "description", "links"} <= set(ids)
    by_id = {element["id"]: element for element in fields_of_form()}
    assert by_id["ablation-spec"]["type"] == "textarea"
    assert by_id["ablation-spec"]["attributes"]["render"] == "yaml"
    for element in fields_of_form():
        assert element["type"] in {"input", "textarea", "dropdown"}
        assert heading_name(element["attributes"]["label"]) in SECTION_FIELDS, element["id"]


def test_every_answer_of_the_form_is_read_exactly() -> None:
    body = render_issue_form({**ANSWERS, "recipe": "tiny-moe@1"})
    assert "```yaml\n" + SPEC + "\n```" in body
    fields = issue_fields(title="Capacity factor", body=body)
    assert fields.missing == []
    assert fields.data == {
        "title": "Capacity factor",
        "summary": ANSWERS["summary"],
        "hypothesis": ANSWERS["hypothesis"],
        "success_metric": "eval/loss",
        "success_direction": "lower",
        "success_threshold": 0.01,
        "recipe": "tiny-moe@1",
        "baseline": "weight_decay: 0.1",
        "ablation_spec": SPEC,
        "description": ANSWERS["description"],
        "wandb_url": "https://wandb.ai/marin-community/marin/reports/Cap--X",
        "data_browser_url": "https://marin.community/data-browser/experiment/?path=cap",
        "experiment_json_url": "https://example.org/cap.json",
    }


def test_unanswered_optional_fields_store_nothing() -> None:
    required = {k: ANSWERS[k] for k in ("summary", "hypothesis", "success-criteria")}
    body = render_issue_form(required)
    assert body.count("_No response_") == 5
    data = issue_fields(title="T", body=body).data
    assert "_No response_" not in repr(data)
    for key in ("recipe", "baseline", "ablation_spec", "wandb_url"):
        assert key not in data
    assert data["summary"] == ANSWERS["summary"]


@pytest.mark.parametrize(
    ("criteria", "expected"),
    [
        ("`eval/paloma/macro_loss` lower by 0.02", ("eval/paloma/macro_loss", "lower", 0.02)),
        ("eval/acc: higher, by at least 1e-3", ("eval/acc", "higher", 0.001)),
        ("metric: eval/loss\ndirection: lower\nthreshold: 0.5", ("eval/loss", "lower", 0.5)),
    ],
)
def test_success_criteria_in_the_forms_people_write_them(
    criteria: str, expected: tuple[str, str, float]
) -> None:
    data = issue_fields(title="T", body=f"### Success criteria\n\n{criteria}\n").data
    assert (data["success_metric"], data["success_direction"], data["success_threshold"]) == (
        expected
    )


def test_summary_and_description_each_land_in_their_own_field() -> None:
    body = (
        "## Summary\n\nWe try a z-loss.\n\n## Description\n\nThe long story.\n\n## Hypothesis\nh\n"
    )
    data = issue_fields(title="T", body=body).data
    assert data["summary"] == "We try a z-loss."
    assert data["description"] == "The long story."


def test_unedited_template_prompts_are_never_content() -> None:
    body = (
        "## Summary\n\n(One sentence: what you try.)\n\n"
        "## Description\n\n*(Describe the experiment.)*\n\nReal text.\n\n"
        "## Hypothesis\n\n[Your hypothesis]\n\n"
        "## Results\n\n_No response_\n\n"
        "### Links\n\n- WandB report: [link]\n- Data browser: (link)\n"
    )
    fields = issue_fields(title="Title", body=body)
    assert fields.data["description"] == "Real text."
    assert "hypothesis" not in fields.data
    assert "results" not in fields.data
    assert fields.data["summary"] == "Real text."
    assert "wandb_url" not in fields.data and "data_browser_url" not in fields.data
    assert any("Hypothesis" in problem for problem in fields.missing)
    # A real link in brackets, and text around a parenthesis, stay.
    kept = issue_fields(
        title="T", body="## Description\n\n[the paper](https://example.org/p)\n(see above) yes\n"
    )
    assert kept.data["description"] == "[the paper](https://example.org/p)\n(see above) yes"


@pytest.mark.django_db
def test_an_issue_from_the_form_becomes_a_submitted_proposal_the_api_shows_whole(
    github_on: Any, client: Any, recipe: Any
) -> None:
    answers = {**ANSWERS, "recipe": recipe.name}
    body = render_issue_form(answers) + "### Results\n\nLoss fell by 0.02.\n"
    issue = issue_payload(number=41, title="Capacity factor", body=body)
    post_delivery(client, "issues", issues_delivery("opened", issue))
    assert process_deliveries() == ["applied"]
    proposal = Proposal.objects.get(github_issue_number=41)
    assert proposal.state == State.SUBMITTED
    assert proposal.recipe == recipe
    assert proposal.baseline == {"weight_decay": 0.1}
    assert proposal.ablation_spec == SPEC
    api = APIClient()
    shown = api.get(f"/api/v1/proposals/{proposal.pk}/").json()
    assert shown["summary"] == ANSWERS["summary"]
    assert shown["description"] == ANSWERS["description"]
    assert shown["hypothesis"] == ANSWERS["hypothesis"]
    assert (shown["success_metric"], shown["success_threshold"]) == ("eval/loss", 0.01)
    assert shown["baseline"] == {"weight_decay": 0.1}
    assert shown["ablation_spec"] == SPEC
    assert shown["recipe_name"] == recipe.name
    assert shown["wandb_url"] == "https://wandb.ai/marin-community/marin/reports/Cap--X"
    assert shown["experiment_json_url"] == "https://example.org/cap.json"
    assert shown["results"] == "Loss fell by 0.02."
    assert shown["github_issue_number"] == 41
    for name, value in proposal.github_sections.items():
        if name in shown and name != "recipe":
            assert shown[name] == value or name == "baseline", name
