"""Checking a batch key by key (``runs.metrics.parse``): what is refused, how it is named."""

from __future__ import annotations

import json

import pytest
from django.core.exceptions import ValidationError

from runs.metrics import parse


def test_nan_written_by_pythons_json_is_refused_by_key_not_the_batch() -> None:
    body = json.dumps(
        {
            "points": [
                {"key": "loss", "step": 1, "value": float("nan")},
                {"key": "loss", "step": 2, "value": 1.5},
                {"key": "norm", "step": 1, "value": float("-inf")},
            ]
        }
    ).encode()
    checked = parse.points_check_body(body=body)
    assert list(zip(checked.batch.keys, checked.batch.steps, strict=True)) == [("loss", 2)]
    assert checked.not_finite() == {"loss": 1, "norm": 1}


def test_refusals_are_counted_by_key_with_the_lowest_step_and_capped_in_the_answer() -> None:
    points = [{"key": f"bad key {i}", "step": 5, "value": 1.0} for i in range(150)]
    points += [{"key": "x y", "step": s, "value": 1.0} for s in (9, 3, 7)]
    checked = parse.points_check(data={"points": points})
    assert len(checked.refused) == 151 and not len(checked.batch)
    spaced = next(r for r in checked.refused if r.key == "x y")
    assert (spaced.step, spaced.points) == (3, 3)
    assert len(parse.refusals_listed(checked.refused)) == parse.MAX_REFUSALS_LISTED


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b'{"points": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        b'{"points": 1' + b"0" * 5000 + b"}",
    ],
)
def test_a_body_that_no_parser_reads_is_refused_whole_in_words(body: bytes) -> None:
    with pytest.raises(ValidationError) as refused:
        parse.points_check_body(body=body)
    assert "points" in refused.value.message_dict


def test_the_all_or_nothing_form_names_each_refused_key() -> None:
    with pytest.raises(ValidationError) as refused:
        parse.points_parse(data={"points": [{"key": "a", "step": 1, "value": "1"}]})
    assert "a: value must be a number" in refused.value.message_dict["points"][0]
