"""A Levanter ``tracker_metrics.jsonl`` onto a run (kind ``tracker_metrics``), from an
upload, a path or any URL the importers read (``file://``, ``gs://`` with the ``gcs``
extra): streamed through the same path as an upload on the run's page
(``runs.trackers.uploads.tracker_import_stream`` -> ``runs.trackers.jsonl``), never held
whole, and recorded as one of the run's tracker imports.

The report counts the lines that held a tracker record as matched and the lines with
nothing to import (blank, events of other kinds) as skipped, without listing them; every
line that is wrong (not JSON, a truncated last line, a value the run's declarations refuse)
is listed as refused with its number and reason. Points are upserted by (run, key, step),
so importing a file again, or after an interruption, completes it and doubles nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.core.exceptions import ValidationError

from marin_site import importing
from marin_site.doors import Door
from marin_site.errors import DomainError
from runs.models import Run
from runs.trackers import jsonl, uploads

KIND = "tracker_metrics"


def run_option(report: importing.ImportReport, value: str) -> Run | None:
    """The run an option names, or None with the refusal in the report."""
    if not value.isdigit():
        report.refused("option run", f"'{value[:40]}' is not a run's number")
        return None
    run = Run.objects.filter(pk=int(value)).first()
    if run is None:
        report.refused("option run", f"there is no run {value}")
    return run


def _report_lines(report: importing.ImportReport, found: jsonl.ImportReport) -> None:
    for number, problem in found.errors:
        report.refused(f"line {number}", problem)
    report.tally(importing.Outcome.REFUSED, found.error_count - len(found.errors))
    report.tally(importing.Outcome.MATCHED, found.records)
    report.tally(importing.Outcome.SKIPPED, found.lines - found.records - found.error_count)


def tracker_metrics_import(
    source: Any, *, by: Any, dry_run: bool, run: str = ""
) -> importing.ImportReport:
    report = importing.report_start(source, KIND)
    target = run_option(report, run)
    if target is None:
        return report

    def blocks() -> Iterator[bytes]:
        yield from iter(lambda: source.read(jsonl.READ_BYTES), b"")

    seen: list[jsonl.ImportReport] = []
    try:
        if dry_run:
            found = jsonl.tracker_jsonl_check(blocks=blocks())
            _report_lines(report, found)
            report.note(f"would import about {found.points} values into run {target.pk}")
            return report
        done = uploads.tracker_import_stream(
            run_id=target.pk,
            blocks=blocks,
            filename=report.source.rsplit("/", 1)[-1],
            door=Door.WEB if getattr(by, "is_authenticated", False) else Door.SYSTEM,
            actor=by if getattr(by, "is_authenticated", False) else None,
            actor_label="" if by else "manage.py import_history",
            progress=seen.append,
        )
    except importing.SourceRefused:
        raise
    except jsonl.TrackerFileRefused as exc:
        report.refused("file", exc.message)
        return report
    except (DomainError, ValidationError) as exc:
        message = exc.message if isinstance(exc, DomainError) else "; ".join(exc.messages)
        report.refused("file", message)
        return report
    _report_lines(report, seen[-1])  # the last progress is the whole file's report
    report.note(f"Run {target.pk}: {done.message}")
    return report


def register() -> None:
    importing.register_importer(
        KIND,
        "Levanter tracker_metrics.jsonl, onto a run",
        tracker_metrics_import,
        description=(
            "Every logged step of every key, the config and the summary, streamed onto the "
            "run given (as an upload on the run's page is)."
        ),
        options=(importing.ImportOption("run", "Run", required=True, help="the run's number"),),
        accepts_url=True,
    )
