"""Request parsers for the API (kept apart from marin_site.api: DRF imports them early)."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from marin_site.untrusted import untrusted_problem


class SafeJSONParser(JSONParser):
    """DRF's JSON parser, refusing with a 400 what the database or the site cannot hold:
    absurd nesting, NUL characters, unpaired surrogates, integers past 64 bits."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError as exc:
            raise ParseError("JSON parse error - the document is nested too deeply.") from exc
        problem = untrusted_problem(data)
        if problem:
            raise ParseError(f"JSON parse error - {problem}.")
        return data
