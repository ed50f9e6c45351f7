"""Uploads of a ``tracker_metrics.jsonl``: checked as they arrive, kept in the database in
chunks (``TrackerImportChunk``, so a worker on any machine reads them), imported by the
``runs.trackers.jsonl`` task, which reports its progress on the ``TrackerImport`` row the
run page shows; and the import of a file on this machine (``manage.py
import_tracker_metrics``). The reading and the import itself are ``runs.trackers.jsonl``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from marin_site.doors import Door
from marin_site.errors import DomainError
from marin_site.events import Verb
from marin_site.nudges import task_send
from runs.models import Run, RunEvent, TrackerImport, TrackerImportChunk, TrackerImportState
from runs.trackers.jsonl import (
    READ_BYTES,
    ImportReport,
    TrackerFileRefused,
    iter_lines,
    record_parse,
    tracker_jsonl_import,
)

CHUNK_BYTES = 1024 * 1024
STALE_IMPORT = timedelta(minutes=5)  # a running import this quiet lost its worker


def _read_blocks(stream: IO[bytes] | Iterable[bytes], cap: int) -> Iterator[bytes]:
    total = 0
    if hasattr(stream, "read"):
        reader: Iterable[bytes] = iter(lambda: stream.read(READ_BYTES), b"")
    else:
        reader = stream
    for block in reader:
        total += len(block)
        if total > cap:
            raise TrackerFileRefused(
                f"The file is larger than the limit of {cap} bytes "
                "(RUNS_TRACKER_IMPORT_MAX_BYTES).",
                413,
            )
        yield block


def tracker_import_receive(
    *,
    run_id: int,
    stream: IO[bytes] | Iterable[bytes],
    door: str,
    actor: User | AnonymousUser | None = None,
    actor_label: str = "",
    filename: str = "",
    strict: bool = False,
) -> TrackerImport:
    """Check an uploaded file as it arrives and keep it for the import task; refuses a
    file that is too large, has a line over 1 MB, is not JSON lines, or (``strict``) has
    any wrong line. Nothing is kept from a refused file."""
    cap = int(settings.RUNS_TRACKER_IMPORT_MAX_BYTES)
    digest = hashlib.sha256()
    with transaction.atomic():
        # No lock on the run: a long upload must not hold up its heartbeats and points.
        run = Run.objects.filter(pk=run_id).only("pk").first()
        if run is None:
            raise DomainError(f"No run {run_id}.")
        upload = TrackerImport.objects.create(
            run=run,
            actor=actor if isinstance(actor, User) else None,
            actor_label=actor_label[:100],
            door=door,
            filename=filename[:255],
        )
        pending = bytearray()
        chunks = 0

        def stored_blocks() -> Iterator[bytes]:
            nonlocal chunks
            for block in _read_blocks(stream, cap):
                digest.update(block)
                pending.extend(block)
                while len(pending) >= CHUNK_BYTES:
                    TrackerImportChunk.objects.create(
                        tracker_import=upload, index=chunks, data=bytes(pending[:CHUNK_BYTES])
                    )
                    del pending[:CHUNK_BYTES]
                    chunks += 1
                yield block

        report = _receive_check(stored_blocks())
        if pending:
            TrackerImportChunk.objects.create(
                tracker_import=upload, index=chunks, data=bytes(pending)
            )
        if strict and report.error_count:
            raise ValidationError({"file": [f"line {n}: {p}" for n, p in report.errors[:20]]})
        upload.size_bytes = report.bytes
        upload.line_count = report.lines
        upload.sha256 = digest.hexdigest()
        upload.error_count = report.error_count
        upload.errors = [{"line": n, "problem": p} for n, p in report.errors]
        upload.save(update_fields=["size_bytes", "line_count", "sha256", "error_count", "errors"])
        upload_id = upload.pk
        transaction.on_commit(lambda: _enqueue(upload_id), robust=True)
    return upload


def _receive_check(blocks: Iterable[bytes]) -> ImportReport:
    """The check of an upload: the first line with content must be a tracker record (else
    the file is not JSON lines), and some line must be one."""
    report = ImportReport()
    first_checked = False
    for number, line, consumed in iter_lines(blocks):
        report.lines, report.bytes = number, consumed
        parsed = record_parse(line)
        if parsed is None:
            continue
        if isinstance(parsed, str):
            if not first_checked:
                raise TrackerFileRefused(f"This is not a JSON lines file: line {number}: {parsed}.")
            report.error(number, parsed)
            continue
        first_checked = True
        report.records += 1
    if not report.records:
        raise TrackerFileRefused("The file holds no tracker record.")
    return report


def _enqueue(import_id: int) -> None:
    task_send("runs.tracker_import", import_id=import_id)  # lost: the resume pass does it


def tracker_import_run(
    *, import_id: int, progress: Callable[[ImportReport], None] | None = None
) -> str:
    """Import a stored upload (the task). Safe to run twice: a finished import is left
    alone, a running one too unless it has been silent for STALE_IMPORT (its worker died),
    and points are upserted, so a second pass over the same lines changes nothing."""
    now = timezone.now()
    claimed = (
        TrackerImport.objects.filter(pk=import_id)
        .filter(_claimable(now))
        .update(state=TrackerImportState.RUNNING, started_at=now, updated_at=now)
    )
    upload = TrackerImport.objects.filter(pk=import_id).first()
    if upload is None:
        return ""
    if not claimed:
        return str(upload.state)

    def chunks() -> Iterator[bytes]:
        index = 0
        while True:
            data = (
                TrackerImportChunk.objects.filter(tracker_import_id=import_id, index=index)
                .values_list("data", flat=True)
                .first()
            )
            if data is None:
                return
            yield bytes(data)
            index += 1

    def report_progress(report: ImportReport) -> None:
        TrackerImport.objects.filter(pk=import_id).update(
            bytes_done=report.bytes,
            lines_done=report.lines,
            points_written=report.points,
            updated_at=timezone.now(),
        )
        if progress is not None:
            progress(report)

    try:
        report = tracker_jsonl_import(
            run_id=upload.run_id, blocks=chunks(), progress=report_progress
        )
    except (DomainError, ValidationError) as exc:
        message = exc.message if isinstance(exc, DomainError) else "; ".join(exc.messages)
        TrackerImport.objects.filter(pk=import_id).update(
            state=TrackerImportState.FAILED, message=message[:2000], finished_at=timezone.now()
        )
        return TrackerImportState.FAILED
    tracker_import_finish(import_id=import_id, report=report)
    return TrackerImportState.DONE


def _claimable(now: Any) -> Q:
    return Q(state=TrackerImportState.PENDING) | Q(
        state=TrackerImportState.RUNNING, updated_at__lt=now - STALE_IMPORT
    )


@transaction.atomic
def tracker_import_finish(*, import_id: int, report: ImportReport) -> TrackerImport:
    upload = TrackerImport.objects.select_for_update().get(pk=import_id)
    upload.state = TrackerImportState.DONE
    upload.bytes_done = report.bytes
    upload.size_bytes = max(upload.size_bytes, report.bytes)
    upload.lines_done = report.lines
    upload.line_count = max(upload.line_count, report.lines)
    upload.points_written = report.points
    upload.points_skipped = report.skipped
    upload.error_count = report.error_count
    upload.errors = [{"line": n, "problem": p} for n, p in report.errors]
    upload.finished_at = timezone.now()
    upload.message = tracker_import_summary(report)
    upload.save()
    TrackerImportChunk.objects.filter(tracker_import_id=import_id).delete()
    RunEvent.objects.create(
        run_id=upload.run_id,
        actor_id=upload.actor_id,
        actor_label=upload.actor_label,
        verb=Verb.TRACKER_IMPORT,
        door=upload.door,
        message=upload.message,
    )
    return upload


def tracker_import_summary(report: ImportReport) -> str:
    parts = [f"imported {report.points} points from {report.lines} lines"]
    if report.config is not None:
        parts.append("the config")
    if report.summary:
        parts.append(f"a summary of {len(report.summary)} values")
    text = ", ".join(parts)
    if report.skipped:
        text += f"; {report.skipped} values skipped (not finite numbers, no step, or refused)"
    if report.error_count:
        text += f"; {report.error_count} lines with problems: {report.problem_text()}"
    return text


def tracker_imports_resume() -> int:
    """The beat's pass: imports whose nudge was lost, or whose worker died."""
    now = timezone.now()
    started = 0
    for import_id in TrackerImport.objects.filter(_claimable(now)).values_list("pk", flat=True):
        if tracker_import_run(import_id=import_id) == TrackerImportState.DONE:
            started += 1
    return started


def tracker_import_file(
    *,
    run_id: int,
    path: Path,
    strict: bool = False,
    door: str = Door.SYSTEM,
    actor_label: str = "manage.py",
    progress: Callable[[ImportReport], None] | None = None,
) -> TrackerImport:
    """Import a file on this machine in this process (``manage.py import_tracker_metrics``),
    recorded as an import of the run like an upload."""
    size = path.stat().st_size
    if size > int(settings.RUNS_TRACKER_IMPORT_MAX_BYTES):
        raise TrackerFileRefused(
            f"{path} is {size} bytes; the limit is {settings.RUNS_TRACKER_IMPORT_MAX_BYTES} "
            "(RUNS_TRACKER_IMPORT_MAX_BYTES).",
            413,
        )

    def blocks() -> Iterator[bytes]:
        with path.open("rb") as handle:
            yield from iter(lambda: handle.read(READ_BYTES), b"")

    return tracker_import_stream(
        run_id=run_id,
        blocks=blocks,
        filename=path.name,
        size=size,
        strict=strict,
        door=door,
        actor_label=actor_label,
        progress=progress,
    )


def tracker_import_stream(
    *,
    run_id: int,
    blocks: Callable[[], Iterable[bytes]],
    filename: str,
    size: int = 0,
    strict: bool = False,
    door: str = Door.SYSTEM,
    actor: User | None = None,
    actor_label: str = "",
    progress: Callable[[ImportReport], None] | None = None,
) -> TrackerImport:
    """Import a stream of blocks (a file here, or a URL read through the importers of
    ``marin_site.importing``) in this process, recorded as an import of the run like an
    upload. ``blocks`` gives a fresh stream each call (``strict`` reads it twice)."""
    if not Run.objects.filter(pk=run_id).exists():
        raise DomainError(f"No run {run_id}.")
    upload = TrackerImport.objects.create(
        run_id=run_id,
        door=door,
        actor=actor if isinstance(actor, User) else None,
        actor_label=actor_label[:100],
        filename=filename[:255],
        size_bytes=size,
        state=TrackerImportState.RUNNING,
        started_at=timezone.now(),
    )
    try:
        report = tracker_jsonl_import(
            run_id=run_id, blocks=blocks, strict=strict, progress=progress
        )
    except (DomainError, ValidationError) as exc:
        message = exc.message if isinstance(exc, DomainError) else "; ".join(exc.messages)
        TrackerImport.objects.filter(pk=upload.pk).update(
            state=TrackerImportState.FAILED, message=message[:2000], finished_at=timezone.now()
        )
        raise
    return tracker_import_finish(import_id=upload.pk, report=report)
