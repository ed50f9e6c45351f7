"""``manage.py github_backfill OWNER/REPO``: old experiment issues in as imported proposals.

See proposals/github/backfill.py and docs/history.md. Reads GitHub only (GITHUB_API_URL,
GITHUB_TOKEN); writes nothing there.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from tqdm import tqdm

from proposals.github.backfill import DEFAULT_LABELS, Backfill, Progress
from proposals.github.body import EXPERIMENT_LABELS
from proposals.github.rest import RestReader

REPOSITORY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}$")


def _since(value: str) -> datetime:
    moment = parse_datetime(value)
    if moment is None:
        day = parse_date(value)
        if day is None:
            raise CommandError(f"--since: '{value[:40]}' is not a date (YYYY-MM-DD) or a time.")
        moment = datetime(day.year, day.month, day.day)
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment, timezone.get_fixed_timezone(0))
    return moment


class TqdmProgress(Progress):
    """A bar per phase on stderr: counts, rate and, once GitHub says how many pages, ETA."""

    def __init__(self, enabled: bool, stream: Any = None) -> None:
        self.enabled = enabled
        self.stream = stream
        self.bar: Any = None
        super().__init__(start=self._start, advance=self._advance, total=self._total)

    def _start(self, phase: str, total: int | None) -> None:
        self.close()
        self.bar = tqdm(
            desc=phase, total=total, unit="item", disable=not self.enabled, file=self.stream
        )

    def _advance(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def _total(self, total: int) -> None:
        if self.bar is not None and self.bar.total != total:
            self.bar.total = total
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class Command(BaseCommand):
    help = (
        "Import every issue of OWNER/REPO carrying an experiment label, open or closed, with "
        "its comments, as imported proposals. Resumable; a second run changes only what "
        "changed on GitHub. Writes nothing to GitHub."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("repository", help="OWNER/REPO")
        parser.add_argument(
            "--label",
            action="append",
            dest="labels",
            help=f"an experiment label to import (repeatable; default: {', '.join(DEFAULT_LABELS)})",
        )
        parser.add_argument("--since", help="only issues and comments updated since this date")
        parser.add_argument(
            "--dry-run", action="store_true", help="read GitHub, report, store nothing"
        )
        parser.add_argument(
            "--limit", type=int, help="stop after this many issues (the next run continues)"
        )
        parser.add_argument("--no-progress", action="store_true", help="no progress bar")

    def handle(self, *args: Any, **options: Any) -> None:
        repository = str(options["repository"])
        if not REPOSITORY.match(repository):
            raise CommandError(f"repository: '{repository[:100]}' is not OWNER/REPO.")
        labels: list[str] = []
        for label in options["labels"] or DEFAULT_LABELS:
            if label.lower() not in EXPERIMENT_LABELS:
                self.stderr.write(
                    f"--label {label[:60]}: not an experiment label "
                    f"({', '.join(sorted(EXPERIMENT_LABELS))}); skipped"
                )
                continue
            labels.append(label.lower())
        if not labels:
            raise CommandError("--label: no experiment label left to import.")
        limit = options["limit"]
        if limit is not None and limit < 1:
            raise CommandError("--limit: must be at least 1.")
        progress = TqdmProgress(
            enabled=not options["no_progress"], stream=getattr(self.stderr, "_out", None)
        )
        reader = RestReader(base_url=settings.GITHUB_API_URL, token=settings.GITHUB_TOKEN)
        backfill = Backfill(
            reader=reader,
            repository=repository,
            labels=labels,
            since=_since(options["since"]) if options["since"] else None,
            dry_run=options["dry_run"],
            limit=limit,
            progress=progress,
        )
        try:
            report = backfill.run()
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc
        finally:
            progress.close()
        for problem in report.problems:
            self.stderr.write(problem)
        if report.counts["problems"] > len(report.problems):
            self.stderr.write(f"... and {report.counts['problems'] - len(report.problems)} more")
        prefix = "dry run, nothing stored: " if options["dry_run"] else ""
        self.stdout.write(prefix + report.summary())
