"""``manage.py import_tracker_metrics FILE --run N [--strict]``: import a Levanter
``tracker_metrics.jsonl`` on this machine into a run, whole, streamed, with its progress."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from marin_site.errors import DomainError
from runs.trackers import jsonl as tracker_import
from runs.trackers import uploads as tracker_uploads


class Command(BaseCommand):
    help = "Import a tracker_metrics.jsonl (every step, the config, the summary) into a run."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path)
        parser.add_argument("--run", type=int, required=True, help="the run's id")
        parser.add_argument(
            "--strict",
            action="store_true",
            help="refuse the whole file (nothing stored) if any line is wrong",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        path: Path = options["file"]
        if not path.is_file():
            raise CommandError(f"{path} is not a file.")
        size = max(path.stat().st_size, 1)
        started = time.monotonic()
        last = [0.0]

        def progress(report: tracker_import.ImportReport) -> None:
            now = time.monotonic()
            if now - last[0] < 1.0 and report.bytes < size:
                return
            last[0] = now
            self.stdout.write(
                f"{100 * report.bytes / size:5.1f}%  {report.bytes / 1e6:,.1f} of "
                f"{size / 1e6:,.1f} MB, line {report.lines:,}, {report.points:,} points "
                f"({now - started:,.0f} s)"
            )

        try:
            upload = tracker_uploads.tracker_import_file(
                run_id=options["run"], path=path, strict=options["strict"], progress=progress
            )
        except ValidationError as exc:
            raise CommandError("Refused, nothing stored: " + "; ".join(exc.messages)) from exc
        except DomainError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"Run {options['run']}: {upload.message}")
        for problem in upload.errors[:20]:
            self.stderr.write(f"line {problem['line']}: {problem['problem']}")
        if upload.error_count > 20:
            self.stderr.write(f"... and {upload.error_count - 20} more lines with problems")
