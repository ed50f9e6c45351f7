"""The detectors' fast forms say exactly what the plain ones say: the sustained drop and
rise detector's windowed form (numpy medians, for batches of SHIFT_VECTOR_FROM points or
more) what the rule point by point says, for any split of a stream into batches, any sizes
and warm-up, falling or rising; the spike detector's row medians what ``np.median`` says."""

from __future__ import annotations

import copy
import itertools
import math
import random
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runs.alerts import detectors


def stream(seed: int, length: int) -> list[float]:
    """A throughput-like series with plateaus, drops, recoveries, repeats and ties."""
    rng = random.Random(seed)  # noqa: S311  (test data, not secrets)
    level, out = 100.0, []
    for _ in range(length):
        if rng.random() < 0.03:
            level *= rng.choice([0.5, 0.7, 1.0, 1.4, 2.0])
        value = level + rng.choice([0.0, 0.0, rng.gauss(0, level * 0.05)])
        out.append(round(value, rng.choice([0, 2, 6])))
    return out


def run_through(
    feed: Any, params: dict[str, Any], values: list[float], cuts: list[int], falling: bool
) -> tuple[list[detectors.Change], dict[str, Any]]:
    state: dict[str, Any] = {}
    changes: list[detectors.Change] = []
    bounds = [0, *sorted(set(cuts)), len(values)]
    for lo, hi in itertools.pairwise(bounds):
        steps = list(range(lo, hi))
        # each batch is resent with its predecessor's last point: that point is skipped
        if lo:
            steps, batch = [lo - 1, *steps], [values[lo - 1], *values[lo:hi]]
        else:
            batch = values[lo:hi]
        changes += feed(state, params, "throughput/mfu", steps, batch, falling=falling)
    return changes, state


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    length=st.integers(1, 700),
    cuts=st.lists(st.integers(1, 699), max_size=8),
    recent=st.integers(1, 40),
    baseline=st.integers(5, 120),
    warmup=st.sampled_from([0, 0, 30, 250]),
    calm=st.integers(1, 6),
    falling=st.booleans(),
)
def test_the_windowed_form_says_what_the_rule_says_point_by_point(
    seed: int,
    length: int,
    cuts: list[int],
    recent: int,
    baseline: int,
    warmup: int,
    calm: int,
    falling: bool,
) -> None:
    values = stream(seed, length)
    params = {
        "recent": recent,
        "baseline": baseline,
        "warmup_steps": warmup,
        "calm_points": calm,
        "fraction": 0.2,
        "amount": 10.0,
    }
    cuts = [c for c in cuts if c < length]

    def reference(state: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        skip = detectors._new_points(state, args[2], args[3])
        steps, batch = args[2][skip:], args[3][skip:]
        if not steps:
            return []
        return detectors._shift_feed_loop(state, args[0], args[1], steps, batch, **kwargs)

    expected = run_through(reference, params, values, cuts, falling)
    got = run_through(detectors.shift_feed, params, values, cuts, falling)
    assert got == expected


def test_a_long_batch_takes_the_windowed_form_and_opens_and_closes_a_drop() -> None:
    params = {"recent": 20, "baseline": 200, "calm_points": 3, "fraction": 0.2}
    values = [100.0] * 300 + [50.0] * 100 + [100.0] * 100
    state: dict[str, Any] = {}
    changes = detectors.shift_feed(
        state, params, "throughput/mfu", list(range(500)), values, falling=True
    )
    assert [(c.opened, c.step) for c in changes] == [(True, 309), (False, 412)]
    assert changes[0].message == (
        "throughput/mfu dropped to a median of 75 over its last 20 points (step 309), "
        "from 100 before"
    )
    assert len(state["recent"]) == 20 and len(state["base"]) == 200 and state["last"] == 499


@pytest.mark.parametrize("resized", [{"recent": 10}, {"baseline": 50}])
def test_a_state_left_by_other_sizes_goes_point_by_point(resized: dict[str, int]) -> None:
    """A rule edited to smaller windows: the stored windows shrink a point at a time, as the
    rule always did."""
    params = {"recent": 20, "baseline": 100, "calm_points": 3, "fraction": 0.2}
    values = stream(7, 400)
    state: dict[str, Any] = {}
    detectors.shift_feed(state, params, "k", list(range(200)), values[:200], falling=True)
    edited = {**params, **resized}
    loop_state = copy.deepcopy(state)
    got = detectors.shift_feed(
        state, edited, "k", list(range(200, 400)), values[200:], falling=True
    )
    expected = detectors._shift_feed_loop(
        loop_state, edited, "k", list(range(200, 400)), values[200:], falling=True
    )
    assert (got, state) == (expected, loop_state)
    assert not math.isnan(state["ref"])


@settings(max_examples=100, deadline=None)
@given(
    width=st.integers(1, 60),
    rows=st.integers(1, 30),
    seed=st.integers(0, 10_000),
    ties=st.booleans(),
)
def test_row_medians_are_numpys_medians_to_the_bit(
    width: int, rows: int, seed: int, ties: bool
) -> None:
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 4, (rows, width)) * 0.1 if ties else rng.normal(3, 1e-3, (rows, width))
    assert np.array_equal(detectors.row_medians(values), np.median(values, axis=1))
    deviations = np.abs(values - detectors.row_medians(values)[:, None])
    assert np.array_equal(detectors.row_medians(deviations), np.median(deviations, axis=1))


def spike_point_by_point(
    state: dict[str, Any], params: dict[str, Any], steps: list[int], values: list[float]
) -> list[tuple[bool, int, str]]:
    """The spike rule as written, one point at a time: each new point's window (the
    ``window`` values before it, once ``min_points`` are known), its median and robust
    deviation from ``np.median``, and the hysteresis."""
    window: list[float] = state.setdefault("window", [])
    changes = []
    for step, value in zip(steps, values, strict=True):
        if state.get("last") is not None and step <= state["last"]:
            continue
        if len(window) >= params["min_points"]:
            before = np.asarray(window[-params["window"] :])
            median = float(np.median(before))
            mad = float(np.median(np.abs(before - median)))
            scale = max(detectors.MAD_TO_SIGMA * mad, detectors.RELATIVE_FLOOR * abs(median))
            score = (value - median) / (scale or 1e-12)
            if not state.get("open") and score > params["k"]:
                state["open"], state["calm"] = True, 0
                changes.append((True, step, f"{score:.1f} {median:.6g}"))
            elif state.get("open"):
                state["calm"] = state["calm"] + 1 if score < params["k_close"] else 0
                if state["calm"] >= params["calm_points"]:
                    state["open"], state["calm"] = False, 0
                    changes.append((False, step, ""))
        window.append(value)
        del window[: -params["window"]]
        state["last"] = step
    return changes


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    length=st.integers(1, 600),
    cuts=st.lists(st.integers(1, 599), max_size=30),
    width=st.integers(10, 60),
    k=st.sampled_from([1.0, 2.5, 6.0]),
    calm=st.integers(1, 6),
    spikes=st.sampled_from([0, 1, 12]),
)
def test_the_spike_rule_in_numpy_says_what_it_says_point_by_point(
    seed: int, length: int, cuts: list[int], width: int, k: float, calm: int, spikes: int
) -> None:
    """The batch form (row medians, robust deviations taken first for the values above
    their median only, and for every row when an alert may open) against the rule point by
    point, for any split of a stream with spikes, ties and plateaus into batches."""
    rng = random.Random(seed)  # noqa: S311  (test data, not secrets)
    # spikes on top of the plateaus: none, or about one point in 100 or in 13
    values = [v * rng.choice([1.0] * 12 + [1.01, 1.5, 3.0][:spikes]) for v in stream(seed, length)]
    if spikes == 1:
        values = [v * 1.5 if rng.random() < 0.01 else v for v in values]
    params = {"window": width, "k": k, "k_close": k / 2, "calm_points": calm, "min_points": 10}
    bounds = [0, *sorted({c for c in cuts if c < length}), length]
    got_state: dict[str, Any] = {}
    want_state: dict[str, Any] = {}
    got, want = [], []
    for lo, hi in itertools.pairwise(bounds):
        steps = list(range(max(0, lo - 1), hi))  # each batch resends its predecessor's last
        batch = values[max(0, lo - 1) : hi]
        for change in detectors.spike_feed(got_state, params, "train/loss", steps, batch):
            words = change.message.split("spiked to ")[-1]
            detail = ""
            if change.opened:
                score = words.split(": ")[1].split(" robust")[0]
                median = words.split("rolling median ")[1].split(" (opens")[0]
                detail = f"{score} {median}"
            got.append((change.opened, change.step, detail))
        want += spike_point_by_point(want_state, params, steps, batch)
    assert got == want
    assert got_state["window"] == want_state["window"]
    assert (got_state["last"], bool(got_state["open"]), got_state["calm"]) == (
        want_state["last"],
        bool(want_state.get("open")),
        want_state.get("calm", 0),
    )


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    length=st.integers(16, 700),
    cuts=st.lists(st.integers(1, 699), max_size=6),
    recent=st.integers(1, 30),
    baseline=st.integers(5, 120),
    threshold=st.sampled_from([0.002, 0.01, 0.2]),
    falling=st.booleans(),
)
def test_a_closed_watch_compared_at_once_keeps_the_baseline_the_walk_keeps(
    seed: int,
    length: int,
    cuts: list[int],
    recent: int,
    baseline: int,
    threshold: float,
    falling: bool,
) -> None:
    """Noise on every point, so each baseline's median differs from the next one's: a batch
    that stays closed or stays open (compared at once) ends with the baseline and calm
    points the walk would end with, and alerts open and close where the walk says."""
    rng = random.Random(seed)  # noqa: S311  (test data, not secrets)
    # A level that moves past the opening threshold and then hovers at the closing one (half
    # of it), in noise of a few tenths of the threshold: both comparisons are close calls.
    sign = -1 if falling else 1
    levels = [0.0, 2.0, 0.5, 0.0, 0.5, 2.0]
    values = [
        100.0 * (1 + sign * threshold * levels[i * len(levels) // length])
        + rng.gauss(0, 100.0 * threshold * rng.choice([0.1, 0.4]))
        for i in range(length)
    ]
    params = {
        "recent": recent,
        "baseline": baseline,
        "calm_points": 3,
        "fraction": threshold,
        "amount": threshold * 100,
    }

    def reference(state: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        skip = detectors._new_points(state, args[2], args[3])
        steps, batch = args[2][skip:], args[3][skip:]
        if not steps:
            return []
        return detectors._shift_feed_loop(state, args[0], args[1], steps, batch, **kwargs)

    cuts = [c for c in cuts if c < length]
    expected = run_through(reference, params, values, cuts, falling)
    assert run_through(detectors.shift_feed, params, values, cuts, falling) == expected


@settings(max_examples=300, deadline=None)
@given(
    good=st.lists(st.booleans(), min_size=1, max_size=40),
    calm=st.integers(0, 6),
    needed=st.integers(1, 6),
)
def test_calm_points_counted_at_once_are_the_walks(
    good: list[bool], calm: int, needed: int
) -> None:
    """An open alert's calm points after a batch, counted at once, are what a walk counts;
    None exactly when the walk reaches ``needed`` (the alert closes in the batch)."""
    count, closes = calm, False
    for is_good in good:
        count = count + 1 if is_good else 0
        closes = closes or count >= needed
    expected = None if closes else count
    assert detectors.calm_after(np.asarray(good), calm, needed) == expected
