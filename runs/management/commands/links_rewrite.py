"""``manage.py links_rewrite --from HOST --to HOST [--dry-run]``: move every stored http(s)
address on an old host to a new one (W&B, GitHub, the data browser moved), in the bodies and
links each app registered (``marin_site.links.rewritable_register``), printing the rows and
addresses moved per field. Links kept as canonical ids need no rewrite: they follow the
settings (``WANDB_BASE_URL``, ``GITHUB_BASE_URL``, ``DATA_BROWSER_URL``)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from marin_site import links


class Command(BaseCommand):
    help = "Rewrite an old host to a new one in every stored body and link."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--from", dest="old", required=True, help="the old host, e.g. a.org")
        parser.add_argument("--to", dest="new", required=True, help="the new host")
        parser.add_argument("--dry-run", action="store_true", help="count, change nothing")

    def handle(self, *args: Any, **options: Any) -> None:
        old, new = options["old"].strip(), options["new"].strip()
        if old.lower() == new.lower():
            raise CommandError("--from and --to are the same host.")
        try:
            counts = links.links_rewrite(old_host=old, new_host=new, dry_run=options["dry_run"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        rows = addresses = 0
        for field, (changed, moved) in counts.items():
            if changed:
                self.stdout.write(f"{field}: {changed} rows, {moved} addresses")
            rows += changed
            addresses += moved
        verb = "would move" if options["dry_run"] else "moved"
        self.stdout.write(
            f"{verb} {addresses} addresses in {rows} fields of rows from {old} to {new}."
        )
