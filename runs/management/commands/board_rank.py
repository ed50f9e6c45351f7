"""``manage.py board_rank [--track SLUG]``: rank the board's active tracks again from the
runs (every track, or one), recording rank changes as a finished run does."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs.board.models import BoardTrack
from runs.board.rank import boards_rank_for, track_rank


class Command(BaseCommand):
    help = "Rank the board's tracks again from the finished runs."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--track", default="", help="one track's slug (default: every track)")

    def handle(self, *args: Any, **options: Any) -> None:
        slug = options["track"]
        if slug:
            track = BoardTrack.objects.filter(slug=slug).first()
            if track is None:
                raise CommandError(f"track: no track is named {slug[:63]!r}")
            try:
                reports = [track_rank(track)]
            except ValueError as problem:
                raise CommandError(f"track {slug}: {problem}") from problem
        else:
            reports = boards_rank_for(None)
        for report in reports:
            self.stdout.write(
                f"{report.track}: {report.entries} entries, {report.changes} rank changes"
            )
