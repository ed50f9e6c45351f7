"""Checking a batch key by key (``runs.metrics.parse``): what is refused, how it is named."""

from __future__ import annotations

import json
from unittest.mock import patch

import pytest
from django.core.exceptions import ValidationError
from hypothesis import given, settings
from hypothesis import strategies as st

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


_KEYS = st.sampled_from(["train/loss", "eval/loss", "a", "a b", "", 5, None])
_STEPS = st.one_of(st.integers(-2, 40), st.sampled_from([1.0, True, 2**62, "3"]))
_VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**64), 2**64),
    st.sampled_from([True, "1", None]),
)
_TIMES = st.one_of(st.none(), st.sampled_from([1.8e9, 1_800_000_000, 5, 5e9, True, "now"]))
_POINT = st.one_of(
    st.fixed_dictionaries({"key": _KEYS, "step": _STEPS, "value": _VALUES}),
    st.fixed_dictionaries({"key": _KEYS, "step": _STEPS, "value": _VALUES, "time": _TIMES}),
    st.fixed_dictionaries({"key": _KEYS, "value": _VALUES}),
    st.sampled_from([5, "point", [1]]),
)
_CLEAN = st.fixed_dictionaries(
    {
        "key": st.sampled_from(["train/loss", "eval/loss", "throughput/mfu"]),
        "step": st.integers(0, 30),
        "value": st.floats(-1e9, 1e9),
    },
    optional={"time": st.sampled_from([1.8e9, 1_800_000_000])},
)


def _as_compared(checked: parse.CheckedBatch) -> tuple[object, ...]:
    batch = checked.batch
    return (
        batch.keys,
        batch.steps,
        [repr(v) for v in batch.values],
        batch.times,
        [r.as_dict() for r in checked.refused],
    )


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.lists(_POINT, max_size=12), st.lists(_CLEAN, max_size=40)))
def test_the_column_check_takes_a_batch_as_the_point_by_point_loop_does(
    points: list[object],
) -> None:
    """A clean batch is checked column by column (``_columns_if_clean``), anything else
    point by point: both forms keep and refuse the same points, in the same order."""
    data = {"points": points}
    fast = parse.points_check(data=data)
    with patch.object(parse, "_columns_if_clean", lambda points: None):
        loop = parse.points_check(data=data)
    assert _as_compared(fast) == _as_compared(loop)
