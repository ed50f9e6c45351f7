"""Checking a batch of points as a runner sends it, key by key.

The write path is built for speed (bench/ingest.py): the body is parsed with orjson and
checked in one loop into four columns, with no object per point. Each (key, step) appears
once in a checked batch: the last of repeats wins.

A point that cannot be stored (a key that is not a metric key, a value that is not a finite
number, a negative step, a time outside 2000-2100) is left out alone and reported by key, with
its reason and first step (``KeyRefusal``); every other point of the batch is kept. A step
lower than one already stored is stored (a run resumed from a checkpoint logs its steps
again: points are upserted by key and step). NaN and infinities are not JSON, but Python's
``json.dumps`` writes them: a body orjson refuses is read again by the standard library, so
such a value is refused by key rather than the whole batch.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import orjson
from django.conf import settings
from django.core.exceptions import ValidationError

from marin_site.errors import DomainError

METRIC_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./@:+-]{0,199}\Z")  # \Z: no trailing newline
MAX_STEP = 2**62
EARLIEST, LATEST = 946_684_800.0, 4_102_444_800.0  # 2000-01-01 .. 2100-01-01, unix seconds
MAX_ERRORS = 20
MAX_REFUSALS_LISTED = 100  # an answer lists this many refused keys, and counts the rest


class BatchTooLarge(DomainError):
    status_code = 413


@dataclass(frozen=True, slots=True)
class PointBatch:
    """A checked batch, column by column. ``times`` are unix seconds, or None for "when it
    arrives". Each (key, step) appears once: the last of repeats wins."""

    keys: list[str]
    steps: list[int]
    values: list[float]
    times: list[float | None]

    def __len__(self) -> int:
        return len(self.keys)


@dataclass(slots=True)
class KeyRefusal:
    """A key whose points of a batch were not stored (or flagged: stored, and marked), the
    reason of its first refused point, the lowest such step and how many points. ``key`` is
    None for a point whose key is not a string (``reason`` names the point)."""

    key: str | None
    reason: str
    step: int | None
    points: int = 1

    def as_dict(self) -> dict[str, Any]:
        key = self.key
        if key is not None:  # cut, and a lone surrogate written as its escape
            key = key[:200].encode("utf-8", "backslashreplace").decode() + (
                "…" if len(key) > 200 else ""
            )
        return {"key": key, "reason": self.reason, "step": self.step, "points": self.points}


@dataclass(slots=True)
class CheckedBatch:
    """What a batch's check keeps (``batch``) and what it refuses, by key."""

    batch: PointBatch
    refused: list[KeyRefusal] = field(default_factory=list)

    def not_finite(self) -> dict[str, int]:
        """The first step of each key refused for a NaN or an infinity."""
        return {
            r.key: r.step
            for r in self.refused
            if r.key is not None and r.step is not None and r.reason.startswith(NOT_FINITE)
        }


NOT_FINITE = "value is not finite"


def refusals_listed(refusals: list[KeyRefusal]) -> list[dict[str, Any]]:
    return [r.as_dict() for r in refusals[:MAX_REFUSALS_LISTED]]


def body_load(body: bytes) -> Any:
    """A metrics body as data. orjson refuses NaN and Infinity (not JSON, but what Python's
    ``json.dumps`` writes), and integers beyond 64 bits: such a body is read again by the
    standard library, so those values are refused by key. Anything else that is not JSON is
    refused whole, naming the problem."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        try:
            return json.loads(body)
        except (ValueError, RecursionError):
            raise ValidationError({"points": [f"send a JSON body: {exc}"]}) from None


def points_parse_body(*, body: bytes) -> PointBatch:
    """Parse and check a raw request body, all or nothing (see ``points_parse``)."""
    return points_parse(data=body_load(body))


def points_check_body(*, body: bytes) -> CheckedBatch:
    """Parse and check a raw request body, key by key (see ``points_check``)."""
    return points_check(data=body_load(body))


def points_parse(*, data: Any) -> PointBatch:
    """Check a batch body, all or nothing: any point that cannot be stored refuses it,
    naming up to MAX_ERRORS of them (``points_check`` keeps the rest)."""
    checked = points_check(data=data)
    if checked.refused:
        raise ValidationError(
            {"points": [f"{r.key}: {r.reason}" for r in checked.refused[:MAX_ERRORS]]}
        )
    return checked.batch


def points_check(*, data: Any) -> CheckedBatch:
    """Check a batch body ``{"points": [{key, step, value, time?}, ...]}``: the points that
    can be stored, and the refused ones by key (``KeyRefusal``). Only a body that is not such
    a batch, or holds more than RUNS_METRICS_MAX_POINTS points, is refused whole.

    One loop, exact type checks (a JSON document has no subclasses; ``True`` is no number),
    and the key pattern checked once per distinct key."""
    points = data.get("points") if isinstance(data, dict) else None
    if not isinstance(points, list):
        raise ValidationError({"points": ["send a JSON object with a 'points' list"]})
    cap = settings.RUNS_METRICS_MAX_POINTS
    if len(points) > cap:
        raise BatchTooLarge(f"A batch holds at most {cap} points; this one has {len(points)}.")
    columns = _columns_if_clean(points)
    if columns is not None:
        keys, steps, values, times = columns
        if len(set(zip(keys, steps, strict=True))) != len(keys):
            return CheckedBatch(_last_of_repeats(keys, steps, values, times))
        return CheckedBatch(PointBatch(keys, steps, values, times))
    keys = []
    steps = []
    values = []
    times = []
    good_keys: set[str] = set()
    refused: dict[Any, KeyRefusal] = {}
    isfinite = math.isfinite
    for index, point in enumerate(points):
        if type(point) is dict:
            key = point.get("key")
            step = point.get("step")
            value = point.get("value")
            at = point.get("time")
            if (
                type(key) is str
                and (key in good_keys or _good_key(key, good_keys))
                and type(step) is int
                and 0 <= step < MAX_STEP
                and (
                    (type(value) is float and isfinite(value))
                    or (type(value) is int and -(2**63) <= value < 2**63)
                )
                and (at is None or (type(at) in (int, float) and EARLIEST <= at <= LATEST))
            ):
                keys.append(key)
                steps.append(step)
                values.append(value if type(value) is float else float(value))
                times.append(at)
                continue
        _refuse(refused, index, point)
    batch = PointBatch(keys, steps, values, times)
    if len(set(zip(keys, steps, strict=True))) != len(keys):
        batch = _last_of_repeats(keys, steps, values, times)
    return CheckedBatch(batch, list(refused.values()))


def _columns_if_clean(
    points: list[Any],
) -> tuple[list[str], list[int], list[float], list[float | None]] | None:
    """The batch's four columns when every point passes the check, else None (the point by
    point loop then sorts the good from the refused). Column by column, in C where it can
    be: the usual batch (float values, times or none) is checked in about half the loop's
    time.
    Only what the loop takes exactly is taken: any other form goes to the loop."""
    try:
        keys = [point["key"] for point in points]
        steps = [point["step"] for point in points]
        values = [point["value"] for point in points]
        times = [point.get("time") for point in points]
        distinct_keys = set(keys)
    except (TypeError, KeyError, AttributeError):  # not an object, a field missing, a list key
        return None
    if not points or not all(
        type(key) is str and (key in _GOOD_KEYS or _good_key(key, _GOOD_KEYS))
        for key in distinct_keys
    ):
        return None
    if (
        set(map(type, steps)) != {int}
        or min(steps) < 0
        or max(steps) >= MAX_STEP
        or set(map(type, values)) != {float}
        or not all(map(math.isfinite, values))
    ):
        return None
    if times.count(None) != len(times) and (
        not set(map(type, times)) <= {float, int} or min(times) < EARLIEST or max(times) > LATEST
    ):
        return None
    return keys, steps, values, times


# Keys that matched METRIC_KEY, kept by the process (a run logs the same few keys for ever);
# bounded, so a stream of new names cannot grow it without end.
_GOOD_KEYS: set[str] = set()
_GOOD_KEYS_KEPT = 10_000


def _refuse(refused: dict[Any, KeyRefusal], index: int, point: Any) -> None:
    """Count a point the fast check refused under its key (or its place, when it has no
    key that is a string)."""
    reason = _point_problem(point)
    key = point.get("key") if isinstance(point, dict) else None
    if type(key) is not str:
        refused[("at", index)] = KeyRefusal(None, f"points[{index}]: {reason}", None)
        return
    step = point.get("step")
    step = step if type(step) is int and 0 <= step < MAX_STEP else None
    seen = refused.get(key)
    if seen is None:
        refused[key] = KeyRefusal(key, reason, step)
        return
    seen.points += 1
    if step is not None and (seen.step is None or step < seen.step):
        seen.step, seen.reason = step, reason


def _good_key(key: Any, good_keys: set[str]) -> bool:
    if type(key) is str and METRIC_KEY.match(key):
        if good_keys is not _GOOD_KEYS or len(good_keys) < _GOOD_KEYS_KEPT:
            good_keys.add(key)
        return True
    return False


def _point_problem(point: Any) -> str:
    """What is wrong with a point the fast check refused, said for a person."""
    if not isinstance(point, dict):
        return "must be an object with key, step, value"
    key, step, value = point.get("key"), point.get("step"), point.get("value")
    if not isinstance(key, str) or not METRIC_KEY.match(key):
        return "key must be 1-200 characters of letters, digits and _./@:+- (no spaces)"
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < MAX_STEP:
        return "step must be a non-negative integer"
    finite_float = isinstance(value, float) and math.isfinite(value)
    int64 = isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63
    if not (finite_float or int64):
        if isinstance(value, float):
            return f"{NOT_FINITE} ({value!r}): NaN and infinities are not stored"
        if isinstance(value, int) and not isinstance(value, bool):
            return "value is an integer beyond 64 bits"
        return "value must be a number (not a string, a boolean or null)"
    return "time must be unix seconds between 2000 and 2100"


def _last_of_repeats(
    keys: list[str], steps: list[int], values: list[float], times: list[float | None]
) -> PointBatch:
    latest: dict[tuple[str, int], int] = {}
    for index, pair in enumerate(zip(keys, steps, strict=True)):
        latest[pair] = index
    kept = sorted(latest.values())
    return PointBatch(
        [keys[i] for i in kept],
        [steps[i] for i in kept],
        [values[i] for i in kept],
        [times[i] for i in kept],
    )
