"""``manage.py import_history KIND SOURCE [--dry-run] [-o NAME=VALUE]``: bring a piece of
the project's past in through the registered importer of KIND (``marin_site.importing``),
printing its report place by place and a summary. SOURCE is a path, ``-`` (standard input)
or a URL. The exit status is 1 when anything was refused (the rest is still imported, each
item whole), so a script sees a partial import; 0 when every place matched or was skipped.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from marin_site import importing


class Command(BaseCommand):
    help = "Import the project's past (speedrun results, tracker or W&B histories, ...)."

    def add_arguments(self, parser: CommandParser) -> None:
        kinds = ", ".join(i.kind for i in importing.importers())
        parser.add_argument("kind", help=f"what the source holds: {kinds}")
        parser.add_argument("source", help="a path, - for standard input, or a URL")
        parser.add_argument("--dry-run", action="store_true", help="check it, store nothing")
        parser.add_argument(
            "-o",
            "--option",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="an option of the importer (e.g. run=12)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        values: dict[str, str] = {}
        for item in options["option"]:
            name, sep, value = item.partition("=")
            if not sep or not name.strip():
                raise CommandError(f"An option is NAME=VALUE, not {item!r}.")
            values[name.strip()] = value
        try:
            report = importing.import_run(
                kind=options["kind"],
                source=options["source"],
                dry_run=options["dry_run"],
                options=values,
            )
        except importing.ImportRefused as exc:
            raise CommandError(exc.message) from exc
        for line in report.text_lines():
            self.stdout.write(line)
        if report.refused_count:
            raise CommandError(f"{report.refused_count} refused; see the lines above.")
