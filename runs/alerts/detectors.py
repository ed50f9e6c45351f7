"""The detectors: pure functions that fold a key's new points into a rule's rolling state
and say when an alert opens or closes. No database here.

A state is a small JSON object (kept in ``AlertWatch.state``): the last step folded, a window
of recent values, whether an alert is open and how many calm points followed it. Points at or
below the last folded step are ignored, so a resent or overlapping batch changes nothing and
a new batch costs the same whatever the length of the run's history.

Hysteresis: an alert opens when a point crosses the opening threshold and closes only after
``calm_points`` points in a row are on the safe side of a second, stricter threshold, so
values hovering at the opening threshold open it once and never flap.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

MAD_TO_SIGMA = 1.4826  # a normal distribution's standard deviation per median absolute deviation
RELATIVE_FLOOR = 1e-3  # the robust deviation is at least this share of the median


@dataclass(frozen=True, slots=True)
class Change:
    """An alert opening (``opened``) or closing, at a step, with the words for people."""

    opened: bool
    step: int
    value: float | None
    message: str


Formatter = Callable[[float | None], str]


def plain(value: float | None) -> str:
    """A value as it was logged, for a key whose unit nobody declared."""
    return "-" if value is None else f"{value:.6g}"


def _new_points(state: dict[str, Any], steps: list[int], values: list[float]) -> int:
    """How many leading points to skip: those at or below the last step folded."""
    last = state.get("last")
    if last is None:
        return 0
    skip = 0
    for step in steps:
        if step > last:
            break
        skip += 1
    return skip


def spike_feed(
    state: dict[str, Any],
    params: dict[str, Any],
    key: str,
    steps: list[int],
    values: list[float],
    *,
    fmt: Formatter = plain,
) -> list[Change]:
    """A value more than ``k`` robust deviations above the median of the ``window`` values
    before it. ``steps`` ascend. Vectorised: one median per point, computed in numpy.
    ``fmt`` writes a stored value in the key's declared unit for the messages."""
    skip = _new_points(state, steps, values)
    steps, values = steps[skip:], values[skip:]
    if not steps:
        return []
    width = params["window"]
    history: list[float] = state.get("window", [])
    known = len(history)
    series = np.asarray(history + values, dtype=float)
    count = len(values)
    scores = np.full(count, np.nan)
    medians = np.full(count, np.nan)
    first_full = max(0, width - known)  # the first new point with a whole window before it
    for i in range(min(first_full, count)):  # the run's first points only
        if known + i >= params["min_points"]:
            before = series[: known + i]
            medians[i], scores[i] = _score(before, series[known + i])
    if first_full < count:
        windows = sliding_window_view(series, width)[
            known + first_full - width : known + count - width
        ]
        median = np.median(windows, axis=1)
        mad = np.median(np.abs(windows - median[:, None]), axis=1)
        scale = np.maximum(MAD_TO_SIGMA * mad, RELATIVE_FLOOR * np.abs(median))
        scale = np.where(scale > 0, scale, 1e-12)
        medians[first_full:] = median
        scores[first_full:] = (series[known + first_full :] - median) / scale
    changes: list[Change] = []
    is_open = bool(state.get("open"))
    calm = int(state.get("calm", 0))
    for i in range(count):
        score = scores[i]
        if math.isnan(score):
            continue
        if not is_open:
            if score > params["k"]:
                is_open, calm = True, 0
                changes.append(
                    Change(
                        True,
                        steps[i],
                        values[i],
                        f"{key} spiked to {fmt(values[i])} at step {steps[i]}: "
                        f"{score:.1f} robust deviations above its rolling median "
                        f"{fmt(medians[i])} (opens above {params['k']:g})",
                    )
                )
        elif score < params["k_close"]:
            calm += 1
            if calm >= params["calm_points"]:
                is_open, calm = False, 0
                changes.append(
                    Change(
                        False,
                        steps[i],
                        values[i],
                        f"{key} back within {params['k_close']:g} robust deviations of its "
                        f"rolling median for {params['calm_points']} points (step {steps[i]})",
                    )
                )
        else:
            calm = 0
    state["window"] = series[-width:].tolist()
    state["last"] = steps[-1]
    state["open"] = is_open
    state["calm"] = calm
    return changes


def _score(before: np.ndarray, value: float) -> tuple[float, float]:
    median = float(np.median(before))
    mad = float(np.median(np.abs(before - median)))
    scale = max(MAD_TO_SIGMA * mad, RELATIVE_FLOOR * abs(median)) or 1e-12
    return median, (value - median) / scale


def shift_feed(
    state: dict[str, Any],
    params: dict[str, Any],
    key: str,
    steps: list[int],
    values: list[float],
    *,
    falling: bool,
    fmt: Formatter = plain,
) -> list[Change]:
    """A sustained drop (``falling``: the median of the last ``recent`` points below
    ``(1 - fraction)`` x the baseline) or rise (above the baseline + ``amount``). The
    baseline is the median of the ``baseline`` points before the recent ones, refreshed every
    ``recent`` points, and frozen while an alert is open, so a drop that lasts stays open."""
    skip = _new_points(state, steps, values)
    steps, values = steps[skip:], values[skip:]
    if not steps:
        return []
    warmup = params.get("warmup_steps") or 0
    recent_size, base_size = params["recent"], params["baseline"]
    recent: list[float] = state.get("recent", [])
    base: list[float] = state.get("base", [])
    is_open = bool(state.get("open"))
    calm = int(state.get("calm", 0))
    reference = state.get("ref")
    fresh = 0  # points since the baseline's median was last taken
    changes: list[Change] = []
    for step, value in zip(steps, values, strict=True):
        if step < warmup:
            continue
        recent.append(value)
        if len(recent) > recent_size:
            base.append(recent.pop(0))
            if len(base) > base_size:
                del base[0]
        if len(recent) < recent_size or len(base) < min(base_size, max(5, base_size // 2)):
            continue
        if not is_open and (reference is None or fresh >= recent_size):
            reference, fresh = statistics.median(base), 0
        fresh += 1
        level = statistics.median(recent)
        if falling:
            bad = level < reference * (1 - params["fraction"])
            good = level >= reference * (1 - params["fraction"] / 2)
        else:
            bad = level > reference + params["amount"]
            good = level <= reference + params["amount"] / 2
        if not is_open:
            if bad:
                is_open, calm = True, 0
                how = "dropped" if falling else "rose"
                changes.append(
                    Change(
                        True,
                        step,
                        value,
                        f"{key} {how} to a median of {fmt(level)} over its last {recent_size} "
                        f"points (step {step}), from {fmt(reference)} before",
                    )
                )
        elif good:
            calm += 1
            if calm >= params["calm_points"]:
                is_open, calm = False, 0
                changes.append(
                    Change(
                        False,
                        step,
                        value,
                        f"{key} back to a median of {fmt(level)} (step {step}), near its "
                        f"baseline {fmt(reference)}",
                    )
                )
                reference, fresh = statistics.median(base), 0
        else:
            calm = 0
    state.update(recent=recent, base=base, open=is_open, calm=calm, ref=reference, last=steps[-1])
    return changes


def nan_feed(state: dict[str, Any], key: str, steps: list[int]) -> list[Change]:
    """Finite values of a key whose NaN alert is open close it once they come from a later
    step than the value that was not finite (the run went on, e.g. from a checkpoint)."""
    at = state.get("open_step")
    if at is None or not steps or steps[-1] <= at:
        return []
    step = next(s for s in steps if s > at)
    del state["open_step"]
    return [Change(False, step, None, f"{key} is finite again from step {step}")]
