"""Checking a batch of points as a runner sends it.

The write path is built for speed (bench/ingest.py): the body is parsed with orjson and
checked in one loop into four columns, with no object per point. Each (key, step) appears
once in a checked batch: the last of repeats wins.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import orjson
from django.conf import settings
from django.core.exceptions import ValidationError

from marin_site.errors import DomainError

METRIC_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./@:+-]{0,199}\Z")  # \Z: no trailing newline
MAX_STEP = 2**62
EARLIEST, LATEST = 946_684_800.0, 4_102_444_800.0  # 2000-01-01 .. 2100-01-01, unix seconds
MAX_ERRORS = 20


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


def points_parse_body(*, body: bytes) -> PointBatch:
    """Parse and check a raw request body (see ``points_parse``)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        # orjson refuses NaN and Infinity, which are not JSON.
        raise ValidationError({"points": [f"send a JSON body: {exc}"]}) from None
    return points_parse(data=data)


def points_parse(*, data: Any) -> PointBatch:
    """Check a batch body ``{"points": [{key, step, value, time?}, ...]}``.

    One loop, exact type checks (a JSON document has no subclasses; ``True`` is no number),
    and the key pattern checked once per distinct key."""
    points = data.get("points") if isinstance(data, dict) else None
    if not isinstance(points, list):
        raise ValidationError({"points": ["send a JSON object with a 'points' list"]})
    cap = settings.RUNS_METRICS_MAX_POINTS
    if len(points) > cap:
        raise BatchTooLarge(f"A batch holds at most {cap} points; this one has {len(points)}.")
    keys: list[str] = []
    steps: list[int] = []
    values: list[float] = []
    times: list[float | None] = []
    good_keys: set[str] = set()
    errors: list[str] = []
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
        errors.append(f"points[{index}]: {_point_problem(point)}")
        if len(errors) >= MAX_ERRORS:
            break
    if errors:
        raise ValidationError({"points": errors})
    if len(set(zip(keys, steps, strict=True))) != len(keys):
        return _last_of_repeats(keys, steps, values, times)
    return PointBatch(keys, steps, values, times)


def _good_key(key: Any, good_keys: set[str]) -> bool:
    if type(key) is str and METRIC_KEY.match(key):
        good_keys.add(key)
        return True
    return False


def _point_problem(point: Any) -> str:
    """What is wrong with a point the fast check refused, said for a person."""
    if not isinstance(point, dict):
        return "must be an object with key, step, value"
    key, step, value = point.get("key"), point.get("step"), point.get("value")
    if not isinstance(key, str) or not METRIC_KEY.match(key):
        return "key must be 1-200 characters of letters, digits and _./@:+-"
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < MAX_STEP:
        return "step must be a non-negative integer"
    finite_float = isinstance(value, float) and math.isfinite(value)
    int64 = isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63
    if not (finite_float or int64):
        return "value must be a finite number (NaN and infinities are refused)"
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
