"""Reading MLflow requests and writing MLflow entities, as MLflow's protobuf JSON does.

Field types follow ``mlflow/protos/service.proto``: int64 fields arrive as numbers or as
strings of digits, doubles as numbers or as "NaN", "Infinity", "-Infinity"; a value of
the wrong type is refused with INVALID_PARAMETER_VALUE naming the field, never coerced.
Limits are MLflow's (``mlflow/utils/validation.py``).
"""

from __future__ import annotations

import math
import posixpath
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from runs.mlflow.errors import MlflowError, invalid
from runs.models import Run, RunState

MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_ENTITIES_PER_BATCH = 1000
MAX_BATCH_LOG_REQUEST_SIZE = 1_000_000
MAX_PARAM_VAL_LENGTH = 6000
MAX_TAG_VAL_LENGTH = 8000
MAX_ENTITY_KEY_LENGTH = 250
MAX_RESULTS_SEARCH = 50_000
MAX_RESULTS_HISTORY = 25_000
NAME_PATTERN = re.compile(r"^[/\w.\- :]*$")
INT64 = re.compile(r"^-?\d{1,19}$")
SPECIAL_DOUBLES = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}

RUN_STATUS = {
    RunState.QUEUED: "SCHEDULED",
    RunState.PREEMPTED: "SCHEDULED",
    RunState.RUNNING: "RUNNING",
    RunState.FINISHED: "FINISHED",
    RunState.FAILED: "FAILED",
    RunState.CRASHED: "FAILED",
    RunState.KILLED: "KILLED",
}
STATUSES = ("RUNNING", "SCHEDULED", "FINISHED", "FAILED", "KILLED")


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def field_string(data: dict[str, Any], name: str, *, required: bool = False, limit: int = 0) -> str:
    value = data.get(name)
    if value is None or value == "":
        if required:
            raise invalid(f"Missing value for required parameter '{name}'.")
        return ""
    if not isinstance(value, str):
        raise invalid(
            f"Invalid value {_describe(value)} for parameter '{name}' supplied: "
            f"it must be a string, not {type(value).__name__}."
        )
    if "\x00" in value:
        raise invalid(f"'{name}' cannot contain NUL (0x00) characters.")
    if limit and len(value) > limit:
        raise invalid(f"'{name}' exceeds the maximum length of {limit} characters.")
    return value


def field_int64(
    data: dict[str, Any], name: str, *, required: bool = False, path: str = ""
) -> int | None:
    value = data.get(name)
    name = path or name
    if value is None:
        if required:
            raise invalid(f"Missing value for required parameter '{name}'.")
        return None
    if type(value) is int:
        number = value
    elif (type(value) is float and math.isfinite(value) and value.is_integer()) or (
        type(value) is str and INT64.match(value)
    ):
        number = int(value)
    else:
        raise invalid(
            f"Invalid value {_describe(value)} for parameter '{name}' supplied: "
            "it must be a 64-bit integer."
        )
    if not -(2**63) <= number < 2**63:
        raise invalid(f"Invalid value {number} for parameter '{name}': out of the int64 range.")
    return number


def field_double(data: dict[str, Any], name: str, *, path: str = "") -> float:
    value = data.get(name)
    name = path or name
    if value is None:
        raise invalid(f"Missing value for required parameter '{name}'.")
    if type(value) in (int, float):
        return float(value)
    if type(value) is str:
        if value in SPECIAL_DOUBLES:
            return SPECIAL_DOUBLES[value]
        try:
            return float(value)
        except ValueError:
            pass
    raise invalid(
        f"Invalid value {_describe(value)} for parameter '{name}' supplied: "
        "please specify value as a valid double (64-bit floating point)."
    )


def field_list(data: dict[str, Any], name: str) -> list[Any]:
    value = data.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid(f"Invalid value {_describe(value)} for parameter '{name}': must be a list.")
    return value


def entity_name(value: Any, path: str, kind: str) -> str:
    """A metric, param or tag key: MLflow's rule (letters, digits, _ - . space : /, no path
    tricks, at most 250 characters)."""
    if value is None or value == "":
        raise invalid(f"Missing value for required parameter '{path}'.")
    if not isinstance(value, str):
        raise invalid(f"Invalid value {_describe(value)} for parameter '{path}': must be a string.")
    if not NAME_PATTERN.match(value):
        raise invalid(
            f"Invalid value {_describe(value)} for parameter '{path}' supplied: {kind} names may "
            "only contain alphanumerics, underscores (_), dashes (-), periods (.), spaces ( ), "
            "colon(:) and slashes (/)."
        )
    normal = posixpath.normpath(value)
    if normal != value or normal == "." or normal.startswith(("..", "/")):
        raise invalid(
            f"Invalid value {_describe(value)} for parameter '{path}' supplied: names must not "
            f"resolve to other names when treated as paths (this one resolves to {normal!r})."
        )
    if len(value) > MAX_ENTITY_KEY_LENGTH:
        raise invalid(f"{kind} name exceeds the maximum length of {MAX_ENTITY_KEY_LENGTH}.")
    return value


@dataclass(frozen=True, slots=True)
class MetricIn:
    key: str
    value: float
    timestamp: int
    step: int


def _at(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def metric_parse(item: Any, path: str) -> MetricIn:
    """A metric of a batch (``path`` like ``metrics[3]``) or of log-metric (``path`` "")."""
    if not isinstance(item, dict):
        raise invalid(f"Invalid value {_describe(item)} for parameter '{path}': must be an object.")
    key = entity_name(item.get("key"), _at(path, "key"), "Metric")
    value = field_double(item, "value", path=_at(path, "value"))
    timestamp = field_int64(item, "timestamp", path=_at(path, "timestamp"))
    if timestamp is None:
        raise invalid(f"Missing value for required parameter '{_at(path, 'timestamp')}'.")
    if timestamp < 0:
        raise invalid(
            f"Invalid value {timestamp} for parameter '{_at(path, 'timestamp')}' supplied: "
            f"metric '{key}': timestamp must be a nonnegative long (64-bit integer)."
        )
    step = field_int64(item, "step", path=_at(path, "step")) or 0
    return MetricIn(key=key, value=value, timestamp=timestamp, step=step)


def param_parse(item: Any, path: str) -> tuple[str, str]:
    if not isinstance(item, dict):
        raise invalid(f"Invalid value {_describe(item)} for parameter '{path}': must be an object.")
    key = entity_name(item.get("key"), _at(path, "key"), "Param")
    value = item.get("value", "")
    if not isinstance(value, str):
        raise invalid(
            f"Invalid value {_describe(value)} for parameter '{_at(path, 'value')}': must be a "
            "string."
        )
    if len(value) > MAX_PARAM_VAL_LENGTH:
        raise invalid(
            f"Param value for '{key}' exceeds the maximum length of {MAX_PARAM_VAL_LENGTH}."
        )
    return key, value


def tag_parse(item: Any, path: str) -> tuple[str, str]:
    if not isinstance(item, dict):
        raise invalid(f"Invalid value {_describe(item)} for parameter '{path}': must be an object.")
    key = entity_name(item.get("key"), _at(path, "key"), "Tag")
    value = item.get("value", "")
    if not isinstance(value, str):
        raise invalid(
            f"Invalid value {_describe(value)} for parameter '{_at(path, 'value')}': must be a "
            "string."
        )
    if len(value) > MAX_TAG_VAL_LENGTH:
        raise invalid(f"Tag value for '{key}' exceeds the maximum length of {MAX_TAG_VAL_LENGTH}.")
    return key, value


def batch_limits(metrics: list[Any], params: list[Any], tags: list[Any]) -> None:
    for name, limit, items in (
        ("metrics", MAX_METRICS_PER_BATCH, metrics),
        ("params", MAX_PARAMS_TAGS_PER_BATCH, params),
        ("tags", MAX_PARAMS_TAGS_PER_BATCH, tags),
        ("metrics, params, and tags", MAX_ENTITIES_PER_BATCH, [*metrics, *params, *tags]),
    ):
        if len(items) > limit:
            raise invalid(
                f"A batch logging request can contain at most {limit} {name}. Got "
                f"{len(items)} {name}. Please split up {name} across multiple requests and try "
                "again."
            )


def run_id_parse(data: dict[str, Any]) -> int:
    """The run a request names (``run_id``, or the older ``run_uuid``), as our run's id."""
    text = field_string(data, "run_id") or field_string(data, "run_uuid")
    if not text:
        raise invalid("Missing value for required parameter 'run_id'.")
    if not (text.isascii() and text.isdecimal()) or len(text) > 19 or not 0 < int(text) < 2**63:
        raise MlflowError("RESOURCE_DOES_NOT_EXIST", f"Run with id={text[:80]!r} not found")
    return int(text)


def experiment_id_parse(value: Any, name: str = "experiment_id") -> int | None:
    """A plan id from an experiment id; None for one that cannot be a plan (e.g. "0")."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value:
        raise invalid(f"Missing value for required parameter '{name}'.")
    if not (value.isascii() and value.isdecimal()) or len(value) > 19:
        return None  # past Python's digit limit for int(), and any bigint
    if not 0 < int(value) < 2**63:
        return None
    return int(value)


# --- entities out ---------------------------------------------------------------------------


def millis(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp() * 1000)


def experiment_name(plan_id: int) -> str:
    return f"plan-{plan_id}"


def experiment_entity(plan: Any) -> dict[str, Any]:
    snapshot = plan.recipe_snapshot or {}
    created = millis(plan.frozen_at)
    return {
        "experiment_id": str(plan.pk),
        "name": experiment_name(plan.pk),
        "artifact_location": "",
        "lifecycle_stage": "active",
        "creation_time": created,
        "last_update_time": created,
        "tags": [
            {"key": "marin.recipe", "value": f"{snapshot.get('name')}@{snapshot.get('version')}"},
            {"key": "marin.runs", "value": str(plan.run_count)},
        ],
    }


def flat_params(config: Any, prefix: str = "") -> list[tuple[str, str]]:
    if not isinstance(config, dict):
        return []
    out: list[tuple[str, str]] = []
    for key, value in config.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out.extend(flat_params(value, name))
        else:
            out.append((name, value if isinstance(value, str) else _param_text(value)))
    return out


def _param_text(value: Any) -> str:
    import json

    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(value, sort_keys=True, default=str)


def run_info(run: Run) -> dict[str, Any]:
    tags = run.tracker_tags or {}
    info: dict[str, Any] = {
        "run_id": str(run.pk),
        "run_uuid": str(run.pk),
        "run_name": tags.get("mlflow.runName") or f"run-{run.pk}",
        "experiment_id": str(run.plan_id),
        "user_id": tags.get("mlflow.user", ""),
        "status": RUN_STATUS.get(RunState(run.state), "RUNNING"),
        "start_time": millis(run.started_at or run.queued_at),
        "artifact_uri": "",
        "lifecycle_stage": "deleted" if run.tracker_deleted_at else "active",
    }
    if run.finished_at is not None:
        info["end_time"] = millis(run.finished_at)
    return info


def run_entity(run: Run, summaries: list[Any]) -> dict[str, Any]:
    tags = dict(run.tracker_tags or {})
    tags.setdefault("mlflow.runName", f"run-{run.pk}")
    at = millis(run.heartbeat_at or run.updated_at) or 0
    return {
        "info": run_info(run),
        "data": {
            "metrics": [
                {"key": s.key, "value": s.last, "timestamp": at, "step": s.step} for s in summaries
            ],
            "params": [{"key": k, "value": v} for k, v in flat_params(run.tracker_config or {})],
            "tags": [{"key": k, "value": v} for k, v in sorted(tags.items())],
        },
        "inputs": {},
        "outputs": {},
    }
