"""The detectors: pure functions that fold a key's new points into a rule's rolling state
and say when an alert opens or closes. No database here.

A state is a small JSON object (kept in ``AlertWatch.state``, its windows packed there by
``runs.alerts.services.state_packed``): the last step folded, a window
of recent values, whether an alert is open and how many calm points followed it. Points at or
below the last folded step are ignored, so a resent or overlapping batch changes nothing and
a new batch costs the same whatever the length of the run's history.

Hysteresis: an alert opens when a point crosses the opening threshold and closes only after
``calm_points`` points in a row are on the safe side of a second, stricter threshold, so
values hovering at the opening threshold open it once and never flap.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

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
    is_open = bool(state.get("open"))
    calm = int(state.get("calm", 0))
    k = params["k"]
    # Closed, an alert only opens above k: a batch with no such score changes nothing here,
    # and only a value above its window's median can score above k (k >= 1), so the robust
    # deviations are taken for those rows first, and for every row only when one opens.
    walk = is_open or bool((scores > k).any())
    if first_full < count:
        windows = windows_of(series, width)[known + first_full - width : known + count - width]
        median = row_medians(windows)
        medians[first_full:] = median
        tail = series[known + first_full :]
        if not walk:
            above = np.flatnonzero(tail > median)
            walk = bool(above.size) and bool(
                (_robust_scores(windows[above], median[above], tail[above]) > k).any()
            )
        if walk:
            scores[first_full:] = _robust_scores(windows, median, tail)
    changes: list[Change] = []
    if walk:
        changes, is_open, calm = _spike_walk(
            key=key,
            params=params,
            steps=steps,
            values=values,
            scores=scores.tolist(),
            medians=medians.tolist(),
            is_open=is_open,
            calm=calm,
            fmt=fmt,
        )
    state["window"] = series[-width:].tolist()
    state["last"] = steps[-1]
    state["open"] = is_open
    state["calm"] = calm
    return changes


def _robust_scores(windows: np.ndarray, median: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Each value's distance above its window's median, in robust deviations (1.4826 x the
    median absolute deviation, at least RELATIVE_FLOOR of the median)."""
    mad = row_medians(np.abs(windows - median[:, None]))
    scale = np.maximum(MAD_TO_SIGMA * mad, RELATIVE_FLOOR * np.abs(median))
    scale = np.where(scale > 0, scale, 1e-12)
    return (values - median) / scale


def _spike_walk(
    *,
    key: str,
    params: dict[str, Any],
    steps: list[int],
    values: list[float],
    scores: list[float],
    medians: list[float],
    is_open: bool,
    calm: int,
    fmt: Formatter,
) -> tuple[list[Change], bool, int]:
    """The spike rule's hysteresis over a batch's scores (NaN: no whole window yet)."""
    changes: list[Change] = []
    for i, score in enumerate(scores):
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
    return changes, is_open, calm


def row_medians(rows: np.ndarray) -> np.ndarray:
    """Each row's median, exactly as ``np.median(rows, axis=1)`` takes it (the middle value,
    or half the sum of the two middle values), without its copies and checks: the middle
    values come from one sort of the rows or, for rows of PARTITION_FROM values or more, one
    partition around the middle (each in the place a sort would put it), which is cheaper
    there (a spike batch's 200 windows of 50: 38 µs against 54; narrower rows sort faster)."""
    width = rows.shape[1]
    half = width // 2
    middle = (half,) if width % 2 else (half - 1, half)
    if width >= PARTITION_FROM:
        ordered = np.partition(rows, middle, axis=1)
    else:
        ordered = np.sort(rows, axis=1)
    if width % 2:
        return ordered[:, half]
    return (ordered[:, half - 1] + ordered[:, half]) / 2


PARTITION_FROM = 32


def windows_of(series: np.ndarray, width: int) -> np.ndarray:
    """Every run of ``width`` consecutive values of a 1-d float array, as rows of a read-only
    view (``sliding_window_view`` without its argument checks, which cost more than the view)."""
    (stride,) = series.strides
    return as_strided(series, (len(series) - width + 1, width), (stride, stride), writeable=False)


def _score(before: np.ndarray, value: float) -> tuple[float, float]:
    median = float(np.median(before))
    mad = float(np.median(np.abs(before - median)))
    scale = max(MAD_TO_SIGMA * mad, RELATIVE_FLOOR * abs(median)) or 1e-12
    return median, (value - median) / scale


SHIFT_VECTOR_FROM = 16  # new points from which the windows' medians are taken in numpy


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
    ``recent`` points, and frozen while an alert is open, so a drop that lasts stays open.

    A batch of SHIFT_VECTOR_FROM points or more takes every recent window's median in one
    numpy call (``_shift_feed_windows``); a short batch, or a state whose windows do not
    have the rule's sizes, goes point by point (``_shift_feed_loop``). Both say the same."""
    skip = _new_points(state, steps, values)
    steps, values = steps[skip:], values[skip:]
    if not steps:
        return []
    recent: list[float] = state.get("recent", [])
    base: list[float] = state.get("base", [])
    recent_size, base_size = params["recent"], params["baseline"]
    in_shape = len(recent) <= recent_size and len(base) <= base_size
    if len(steps) < SHIFT_VECTOR_FROM or not in_shape or (base and len(recent) < recent_size):
        return _shift_feed_loop(state, params, key, steps, values, falling=falling, fmt=fmt)
    return _shift_feed_windows(state, params, key, steps, values, falling=falling, fmt=fmt)


def _shift_feed_windows(
    state: dict[str, Any],
    params: dict[str, Any],
    key: str,
    steps: list[int],
    values: list[float],
    *,
    falling: bool,
    fmt: Formatter,
) -> list[Change]:
    """``shift_feed`` over one stream: the stored baseline and recent windows, then the new
    points (those past the warm-up). Point ``j`` ends the stream at ``end``: its recent window
    is the ``recent`` values before ``end``, its baseline the ``baseline`` values before those.
    The recent windows' medians come from numpy (``row_medians``), for the comparisons; the
    baseline's median (taken every ``recent`` points) and the levels a message quotes from
    ``statistics``, as the point-by-point rule takes them."""
    warmup = params.get("warmup_steps") or 0
    recent_size, base_size = params["recent"], params["baseline"]
    # The steps of the points past the warm-up (steps ascend: the warm-up's points lead),
    # and their values at the end of the stream.
    kept = steps[bisect.bisect_left(steps, warmup) :]
    stream: list[float] = (
        state.get("base", []) + state.get("recent", []) + values[len(values) - len(kept) :]
    )
    known = len(stream) - len(kept)
    is_open = bool(state.get("open"))
    calm = int(state.get("calm", 0))
    reference = state.get("ref")
    fresh = 0  # points since the baseline's median was last taken
    changes: list[Change] = []
    # The first point with a whole recent window and enough baseline before it.
    first_end = recent_size + min(base_size, max(5, base_size // 2))
    first = max(0, first_end - known - 1)
    if first < len(kept):
        series = np.asarray(stream, dtype=float)
        level_rows = row_medians(windows_of(series, recent_size)[known + first + 1 - recent_size :])
        fraction, amount = params.get("fraction", 0.0), params.get("amount", 0.0)
        # A batch that neither opens nor closes an alert is compared at once; one that may,
        # goes point by point.
        quiet = _shift_quiet(
            series,
            known=known,
            points=range(first, len(kept)),
            levels=level_rows,
            watch=(is_open, calm, reference),
            params=params,
            falling=falling,
        )
        reference, calm = (reference, calm) if quiet is None else quiet
        for j in range(first, len(kept)) if quiet is None else ():
            end = known + j + 1
            step, value = kept[j], stream[known + j]
            if not is_open and (reference is None or fresh >= recent_size):
                reference = statistics.median(
                    stream[max(0, end - recent_size - base_size) : end - recent_size]
                )
                fresh = 0
            fresh += 1
            level = float(level_rows[j - first])
            if falling:
                bad = level < reference * (1 - fraction)
                good = level >= reference * (1 - fraction / 2)
            else:
                bad = level > reference + amount
                good = level <= reference + amount / 2
            if not is_open:
                if bad:
                    is_open, calm = True, 0
                    how = "dropped" if falling else "rose"
                    said = statistics.median(stream[end - recent_size : end])
                    changes.append(
                        Change(
                            True,
                            step,
                            value,
                            f"{key} {how} to a median of {fmt(said)} over its last {recent_size} "
                            f"points (step {step}), from {fmt(reference)} before",
                        )
                    )
            elif good:
                calm += 1
                if calm >= params["calm_points"]:
                    is_open, calm = False, 0
                    said = statistics.median(stream[end - recent_size : end])
                    changes.append(
                        Change(
                            False,
                            step,
                            value,
                            f"{key} back to a median of {fmt(said)} (step {step}), near its "
                            f"baseline {fmt(reference)}",
                        )
                    )
                    reference = statistics.median(
                        stream[max(0, end - recent_size - base_size) : end - recent_size]
                    )
                    fresh = 0
            else:
                calm = 0
    cut = max(0, len(stream) - recent_size)
    state.update(
        recent=stream[cut:],
        base=stream[max(0, cut - base_size) : cut],
        open=is_open,
        calm=calm,
        ref=reference,
        last=steps[-1],
    )
    return changes


def _shift_quiet(
    series: np.ndarray,
    *,
    known: int,
    points: range,
    levels: np.ndarray,
    watch: tuple[bool, int, float | None],
    params: dict[str, Any],
    falling: bool,
) -> tuple[float, int] | None:
    """The batch's points (``points``: their places among the kept new points, whose recent
    medians are ``levels``) compared at once, for a watch (open, calm points, reference) as
    ``_shift_feed_windows`` walks it: the reference it ends with and its calm points when no
    point opens or closes an alert, or None when one may (the walk then says which, and what
    follows). Closed, the baseline in force at each point is the one the walk would take
    (its median taken at the batch's first point when there is none yet, then every
    ``recent`` points); open, the baseline is frozen and the calm points are counted."""
    is_open, calm, reference = watch
    fraction, amount = params.get("fraction", 0.0), params.get("amount", 0.0)
    if is_open:
        if reference is None:
            return None
        good = (
            levels >= reference * (1 - fraction / 2)
            if falling
            else levels <= reference + amount / 2
        )
        after = calm_after(good, calm, params["calm_points"])
        return None if after is None else (reference, after)
    recent, base = params["recent"], params["baseline"]
    start = points.start if reference is None else points.start + recent
    refreshes = range(start, points.stop, recent)
    ends = [known + j + 1 - recent for j in refreshes]  # where each baseline ends
    if ends and ends[0] >= base:  # whole baselines: their medians from one sort
        taken = row_medians(windows_of(series, base)[[end - base for end in ends]]).tolist()
    else:
        taken = [statistics.median(series[max(0, end - base) : end].tolist()) for end in ends]
    in_force = [math.nan if reference is None else reference, *taken]
    bounds = [points.start, *refreshes, points.stop]
    baseline = np.repeat(np.asarray(in_force, dtype=float), np.diff(bounds))
    opens = levels < baseline * (1 - fraction) if falling else levels > baseline + amount
    if opens.any():
        return None
    return in_force[-1], calm


def calm_after(good: np.ndarray, calm: int, needed: int) -> int | None:
    """An open alert's count of calm points in a row after a batch whose points are calm
    where ``good`` says, from ``calm`` before it; None when the count reaches ``needed``
    somewhere in the batch (the alert closes there)."""
    broken = np.flatnonzero(~good)
    if not broken.size:
        after = calm + len(good)
        return None if after >= needed else after
    first = int(broken[0])  # calm points before the first point that is not
    longest = max(calm + first if first else 0, int(np.diff(broken).max(initial=1)) - 1)
    trailing = len(good) - 1 - int(broken[-1])
    return None if max(longest, trailing) >= needed else trailing


def _shift_feed_loop(
    state: dict[str, Any],
    params: dict[str, Any],
    key: str,
    steps: list[int],
    values: list[float],
    *,
    falling: bool,
    fmt: Formatter = plain,
) -> list[Change]:
    """``shift_feed`` point by point, the rule as written: each point's medians taken
    with ``statistics.median``. For any state (a rule whose sizes were edited leaves windows
    of the old sizes, which this shrinks a point at a time) and short batches."""
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
