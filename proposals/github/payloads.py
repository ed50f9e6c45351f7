"""The shape of the webhook payloads the sync reads, checked before anything is read.

A delivery is signed, so it comes from GitHub (or someone holding the secret), but the sync
still never trusts a shape: a field of the wrong type makes the delivery ``ignored`` with a
message naming the field, instead of an exception in the worker. Only what the sync reads
is described; GitHub's many other fields pass through unchecked.
"""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

_TEXT = {"type": ["string", "null"]}
_USER = {
    "type": ["object", "null"],
    "properties": {"login": {"type": "string", "maxLength": 100}, "id": {"type": "integer"}},
    "required": ["login"],
}
_ISSUE = {
    "type": "object",
    "properties": {
        "number": {"type": "integer", "minimum": 1},
        "title": _TEXT,
        "body": _TEXT,
        "node_id": _TEXT,
        "updated_at": _TEXT,
        "user": _USER,
        "labels": {
            "type": ["array", "null"],
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string"}},
                "required": ["name"],
            },
        },
        "pull_request": {"type": ["object", "null"]},
    },
    "required": ["number"],
}
_COMMENT = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "body": _TEXT,
        "updated_at": _TEXT,
        "user": _USER,
    },
    "required": ["id"],
}
_COMMON = {
    "repository": {"type": ["object", "null"], "properties": {"full_name": {"type": "string"}}},
    "sender": _USER,
    "action": {"type": "string"},
}
SCHEMAS = {
    "issues": {
        "type": "object",
        "properties": {**_COMMON, "issue": _ISSUE},
        "required": ["issue"],
    },
    "issue_comment": {
        "type": "object",
        "properties": {**_COMMON, "issue": _ISSUE, "comment": _COMMENT},
        "required": ["issue", "comment"],
    },
}
VALIDATORS = {event: Draft202012Validator(schema) for event, schema in SCHEMAS.items()}


def payload_problem(event: str, payload: Any) -> str:
    """What is wrong with the parts of ``payload`` the sync reads; empty when nothing is."""
    validator = VALIDATORS.get(event)
    if validator is None:
        return ""
    error = best_match(validator.iter_errors(payload))
    if error is None:
        return ""
    where = ".".join(str(part) for part in error.absolute_path) or "the payload"
    return f"{where}: {error.message[:200]}"
