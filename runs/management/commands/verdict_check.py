"""Recompute a verdict from figures: ``manage.py verdict_check FILE`` (``-`` reads standard
input) prints the result as JSON; ``--explain`` adds the rule, parameters and arithmetic.
A refused input exits non-zero, naming the field and the rule (``runs.verdicts``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from marin_site.untrusted import untrusted_problem
from runs.verdicts.base import Refusal
from runs.verdicts.rules import verdict_compute

MAX_BYTES = 1024 * 1024


class Command(BaseCommand):
    help = "Recompute a verdict from a JSON file of figures (or - for standard input)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="a JSON file, or - for standard input")
        parser.add_argument(
            "--explain", action="store_true", help="add the rule, its parameters and arithmetic"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["file"]
        try:
            if name == "-":
                raw = sys.stdin.buffer.read(MAX_BYTES + 1)
            else:
                with Path(name).open("rb") as handle:
                    raw = handle.read(MAX_BYTES + 1)
        except OSError as exc:
            raise CommandError(f"{name}: cannot be read ({exc.strerror})") from exc
        if len(raw) > MAX_BYTES:
            raise CommandError(f"{name}: larger than {MAX_BYTES} bytes")
        try:
            payload = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CommandError(f"{name}: not JSON ({exc})") from exc
        problem = untrusted_problem(payload)
        if problem:
            raise CommandError(problem)
        try:
            verdict = verdict_compute(payload)
        except Refusal as refusal:
            raise CommandError(str(refusal)) from refusal
        body = dict(verdict.result)
        if options["explain"]:
            body["verdict"] = verdict.as_dict()
        self.stdout.write(json.dumps(body, indent=2, ensure_ascii=False))
