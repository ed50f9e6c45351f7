"""What no part of the site can store or use, found in a structured value from outside.

JSON bodies and YAML specs arrive as nested dicts, lists and scalars. PostgreSQL refuses a
NUL character and an unpaired surrogate in text and jsonb, Python's stack ends somewhere
below a few thousand levels, and a bigint column ends at 2**63: a value with any of these
must be refused at the door with a 400 naming where it is, not fail later as a 500.
"""

from __future__ import annotations

from typing import Any

MAX_DEPTH = 32
INT_LIMIT = 2**63  # PostgreSQL's bigint and jsonb-friendly integers stay inside this


def text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "contains a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains an unpaired surrogate (not valid Unicode)"
    return None


def untrusted_problem(value: Any, *, where: str = "") -> str | None:
    """``"path: what is wrong"`` for the first bad part of ``value``; None when all is well.

    Walks without recursion, so a deeply nested document cannot exhaust the stack here.
    """
    stack: list[tuple[Any, str, int]] = [(value, where, 0)]
    while stack:
        item, path, depth = stack.pop()
        label = path or "the document"
        if depth > MAX_DEPTH:
            return f"{label}: nested deeper than {MAX_DEPTH} levels"
        if isinstance(item, str):
            problem = text_problem(item)
            if problem:
                return f"{label}: {problem}"
        elif isinstance(item, bool) or item is None or isinstance(item, float):
            continue
        elif isinstance(item, int):
            if not -INT_LIMIT <= item < INT_LIMIT:
                return f"{label}: the integer is beyond the 64-bit range"
        elif isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    return f"{label}: the key {key!r} is not a string"
                problem = text_problem(key)
                if problem:
                    return f"{label}: a key {problem}"
                stack.append((child, f"{path}.{key}" if path else key, depth + 1))
        elif isinstance(item, list):
            for index, child in enumerate(item):
                stack.append((child, f"{path}[{index}]", depth + 1))
        else:
            return f"{label}: a value of type {type(item).__name__} is not allowed"
    return None
