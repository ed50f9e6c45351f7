"""What the OpenAPI schema says of every operation beyond its serializers: the refusals it
may answer with, and that reads need no account.

drf-spectacular describes the success answers from the serializers; the refusals come from
the shared plumbing (the body cap, the exception handler, token authentication, the named
permissions, the throttles), so they are added here, once, by a postprocessing hook, with
the shapes ``marin_site.api.exception_handler`` really answers.
"""

from __future__ import annotations

from typing import Any

WRITE_METHODS = {"post", "put", "patch", "delete"}

ERROR_SCHEMAS: dict[str, dict[str, Any]] = {
    "Refusal": {
        "type": "object",
        "description": "Why the request was refused, in words.",
        "properties": {"detail": {"type": "string"}},
        "required": ["detail"],
    },
    "FieldErrors": {
        "type": "object",
        "description": "Each refused field (or `non_field_errors`, or `detail`) with why.",
        "additionalProperties": {
            "oneOf": [
                {"type": "string"},
                {"type": "array", "items": {}},
                {"type": "object"},
            ]
        },
    },
    "TransitionRefusal": {
        "type": "object",
        "description": "The action may not start from the current state.",
        "properties": {
            "detail": {"type": "string"},
            "current_state": {"type": "string"},
            "allowed_states": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["detail"],
    },
}

REFUSALS: dict[str, tuple[str, str]] = {
    "400": ("FieldErrors", "Bad input: each refused field with the rule it broke."),
    "401": ("Refusal", "No valid credentials (a token that is unknown, revoked or expired)."),
    "403": ("Refusal", "Signed in, but without the permission this needs."),
    "404": ("Refusal", "No such object (or page, or `format`)."),
    "406": ("Refusal", "None of the media types in `Accept` can be written here."),
    "409": ("TransitionRefusal", "Not in a state this action may start from."),
    "413": ("Refusal", "The request body is over the size limit."),
    "415": ("Refusal", "The body's `Content-Type` is not one this accepts (JSON, a form)."),
    "429": ("Refusal", "Too many requests; `Retry-After` says when to come back."),
}


def _refusals_for(path: str, method: str, operation: dict[str, Any]) -> list[str]:
    codes = ["401", "406"]  # a token that is not valid; an Accept header nothing matches
    has_query = any(p.get("in") == "query" for p in operation.get("parameters", []))
    if method in WRITE_METHODS:
        codes += ["400", "403", "413", "415", "429"]
    elif has_query:
        codes.append("400")
    names = {p.get("name") for p in operation.get("parameters", [])}
    # an object that does not exist, a page past the last, a format the view cannot write
    if "{" in path or "page" in names or "format" in names:
        codes.append("404")
        if method in WRITE_METHODS and "{" in path:
            codes.append("409")
    return codes


def document_refusals(result: dict[str, Any], **_: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook (SPECTACULAR_SETTINGS)."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in ERROR_SCHEMAS.items():
        schemas.setdefault(name, schema)
    for path, item in result.get("paths", {}).items():
        for method, operation in item.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            responses = operation["responses"]
            for code in _refusals_for(path, method, operation):
                if code in responses:
                    continue
                component, description = REFUSALS[code]
                responses[code] = {
                    "description": description,
                    "content": {
                        "application/json": {
                            "schema": {"$ref": f"#/components/schemas/{component}"}
                        }
                    },
                }
            if method in {"get", "head"}:
                # Reads are public: anonymous is one of the accepted ways in.
                security = operation.setdefault("security", [])
                if {} not in security:
                    security.append({})
    return result
