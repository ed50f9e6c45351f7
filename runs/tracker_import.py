"""Import a Levanter ``tracker_metrics.jsonl`` whole: every logged step of every key, the
config and the summary, through the one ingest path (``metrics.metrics_ingest``).

The file is read as a stream of byte blocks and never held whole: lines are cut out of the
blocks one at a time (a line over 1 MB refuses the file), and points go to the ingest in
batches of ``POINTS_PER_INGEST``. Three shapes of line are understood:

- Levanter's ``json_logger`` events: ``{"event": "log", "step": 10, "metrics": {...}}``,
  ``"hparams"`` (the config), ``"summary"`` and ``"finish"`` (the summary), ``"artifact"``
  (kept as a link); other events are passed over;
- the one-line record W&B's tracker replicates: ``{"config": {...}, "summary": {...}}``;
- a flat step record: ``{"step": 10, "train/loss": 2.3, ...}``.

Nested metrics are flattened with ``/`` as Levanter does. Values that are not finite numbers
(strings, histograms, NaN) are not stored and are counted as skipped. A line that is not one
of these shapes is reported with its line number and the rest still imports; with
``strict`` the whole file is refused and nothing is stored. Importing the same file twice
changes nothing: points are upserted by (run, key, step).

Uploads (the run page, the API) are checked as they arrive, kept in the database in chunks
(``TrackerImportChunk``) and imported by the ``runs.tracker_import`` task, which reports its
progress on the ``TrackerImport`` row the run page shows.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

import orjson
from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from marin_site.errors import DomainError
from runs import metric_declarations, tracker_reports
from runs.metrics import EARLIEST, LATEST, MAX_STEP, METRIC_KEY, PointBatch, metrics_ingest
from runs.models import Run, RunEvent, TrackerImport, TrackerImportChunk, TrackerImportState

logger = logging.getLogger(__name__)

LINE_MAX_BYTES = 1024 * 1024
READ_BYTES = 256 * 1024
CHUNK_BYTES = 1024 * 1024
POINTS_PER_INGEST = 5000
MAX_REPORTED_ERRORS = 100
STALE_IMPORT = timedelta(minutes=5)  # a running import this quiet lost its worker
SKIPPED_META_KEYS = frozenset({"step", "_step", "time", "_timestamp", "_runtime", "timestamp"})


class TrackerFileRefused(DomainError):
    """The file as a whole is refused (too large, a line over 1 MB, not JSON lines)."""

    def __init__(self, message: str, status_code: int = 400) -> None:
        super().__init__(message)
        self.status_code = status_code


@dataclass
class ImportReport:
    """What a pass over a file found and did."""

    bytes: int = 0
    lines: int = 0
    records: int = 0
    points: int = 0
    skipped: int = 0
    error_count: int = 0
    errors: list[tuple[int, str]] = field(default_factory=list)
    config: dict[str, Any] | None = None
    summary: dict[str, float] = field(default_factory=dict)
    summary_line: int = 0
    artifacts: list[dict[str, Any]] = field(default_factory=list)

    def error(self, line: int, problem: str) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_REPORTED_ERRORS:
            self.errors.append((line, problem[:300]))

    def problem_text(self) -> str:
        shown = "; ".join(f"line {n}: {p}" for n, p in self.errors[:5])
        more = self.error_count - min(5, len(self.errors))
        return shown + (f"; and {more} more" if more > 0 else "")

    def as_dict(self) -> dict[str, Any]:
        return {
            "bytes": self.bytes,
            "lines": self.lines,
            "records": self.records,
            "points": self.points,
            "skipped": self.skipped,
            "error_count": self.error_count,
            "errors": [{"line": n, "problem": p} for n, p in self.errors],
        }


# --- reading -------------------------------------------------------------------------------


def iter_lines(blocks: Iterable[bytes]) -> Iterator[tuple[int, bytes, int]]:
    """(line number, line without its newline, bytes read so far) from a stream of blocks.
    A line longer than LINE_MAX_BYTES refuses the file before it is held whole."""
    number = 0
    consumed = 0
    pending = bytearray()
    for block in blocks:
        consumed += len(block)
        start = 0
        while True:
            end = block.find(b"\n", start)
            if end < 0:
                pending += block[start:]
                if len(pending) > LINE_MAX_BYTES:
                    raise TrackerFileRefused(
                        f"line {number + 1} is longer than {LINE_MAX_BYTES} bytes", 413
                    )
                break
            number += 1
            if pending:
                pending += block[start:end]
                line = bytes(pending)
                pending.clear()
            else:
                line = bytes(block[start:end])
            if len(line) > LINE_MAX_BYTES:
                raise TrackerFileRefused(
                    f"line {number} is longer than {LINE_MAX_BYTES} bytes", 413
                )
            yield number, line, consumed - (len(block) - end - 1)
            start = end + 1
    if pending:
        number += 1
        yield number, bytes(pending), consumed


def _loads(line: bytes) -> Any:
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        # Python's json writes NaN and Infinity (Levanter's json_logger does); orjson refuses
        # them, the standard library reads them.
        if b"NaN" in line or b"Infinity" in line:
            return json.loads(line)
        raise


def _number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _flatten(values: dict[str, Any], prefix: str, out: dict[str, Any]) -> None:
    for key, value in values.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, dict):
            if "bucket_limits" in value and "bucket_counts" in value:  # a histogram
                out[name] = value
            else:
                _flatten(value, name, out)
        else:
            out[name] = value


def _step(value: Any) -> int | None:
    if type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is int and 0 <= value < MAX_STEP:
        return value
    return None


@dataclass
class _Record:
    step: int | None = None
    time: float | None = None
    metrics: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    summary: dict[str, Any] | None = None
    artifact: dict[str, Any] | None = None


def record_parse(line: bytes) -> _Record | str | None:
    """A line's record, a problem (str), or None for a line with nothing to import."""
    if not line.strip():
        return None
    try:
        data = _loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        return f"not JSON ({str(exc)[:120]})"
    if not isinstance(data, dict):
        return "not a JSON object"
    event = data.get("event")
    if isinstance(event, str):
        if event == "log":
            metrics = data.get("metrics")
            if not isinstance(metrics, dict):
                return "a 'log' event needs a 'metrics' object"
            return _Record(step=_step(data.get("step")), metrics=metrics, time=_time(data))
        if event == "hparams":
            hparams = data.get("hparams")
            if not isinstance(hparams, dict):
                return "an 'hparams' event needs an 'hparams' object"
            return _Record(config=hparams)
        if event in {"summary", "finish"}:
            summary = data.get("metrics" if event == "summary" else "summary")
            if not isinstance(summary, dict):
                return f"a '{event}' event needs its summary object"
            return _Record(summary=summary)
        if event == "artifact":
            path = data.get("path")
            if not isinstance(path, str) or not path:
                return "an 'artifact' event needs a 'path'"
            return _Record(
                artifact={
                    "uri": path[:2000],
                    "name": str(data.get("name") or "")[:200],
                    "type": str(data.get("artifact_type") or "")[:100],
                }
            )
        return None  # an event of a kind with nothing to import (html, ...)
    if "config" in data or "summary" in data:
        config, summary = data.get("config"), data.get("summary")
        if config is not None and not isinstance(config, dict):
            return "'config' must be an object"
        if summary is not None and not isinstance(summary, dict):
            return "'summary' must be an object"
        return _Record(config=config, summary=summary)
    for name in ("step", "_step"):
        if name in data:
            step = _step(data[name])
            if step is None:
                return f"'{name}' must be a non-negative integer"
            metrics = data.get("metrics")
            if not isinstance(metrics, dict):
                metrics = {k: v for k, v in data.items() if k not in SKIPPED_META_KEYS}
            return _Record(step=step, metrics=metrics, time=_time(data))
    return "not a tracker record (no event, config, summary or step)"


def _time(data: dict[str, Any]) -> float | None:
    for name in ("time", "_timestamp", "timestamp"):
        value = data.get(name)
        if isinstance(value, int | float) and _number(value) and EARLIEST <= value <= LATEST:
            return float(value)
    return None


# --- importing -------------------------------------------------------------------------------


class _Batcher:
    """Points of consecutive lines, sent to the ingest POINTS_PER_INGEST at a time."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.points: dict[tuple[str, int], tuple[float, float | None]] = {}
        self.written = 0

    def add(self, key: str, step: int, value: float, at: float | None) -> None:
        self.points[(key, step)] = (value, at)

    def flush(self) -> None:
        if not self.points:
            return
        items = list(self.points.items())
        self.points.clear()
        batch = PointBatch(
            [k for (k, _), _ in items],
            [s for (_, s), _ in items],
            [v for _, (v, _) in items],
            [t for _, (_, t) in items],
        )
        self.written += metrics_ingest(run=self.run, batch=batch, require_running=False)


def _line_points(
    run_id: int, number: int, record: _Record, report: ImportReport
) -> list[tuple[str, int, float, float | None]]:
    assert record.metrics is not None
    if record.step is None:
        report.skipped += len(record.metrics)
        return []
    flat: dict[str, Any] = {}
    _flatten(record.metrics, "", flat)
    keys: list[str] = []
    values: list[float] = []
    for key, value in flat.items():
        if _number(value) and METRIC_KEY.match(key):
            keys.append(key)
            values.append(float(value))
        else:
            report.skipped += 1
    if not keys:
        return []
    steps = [record.step] * len(keys)
    converted, problems = metric_declarations.declarations_check(
        run_id=run_id, keys=keys, steps=steps, values=values
    )
    if problems:
        for problem in problems:
            report.error(number, problem)
        refused = {p.split(" ", 1)[0] for p in problems}
        kept = [(k, v) for k, v in zip(keys, converted, strict=True) if k not in refused]
        report.skipped += len(keys) - len(kept)
    else:
        kept = list(zip(keys, converted, strict=True))
    return [(k, record.step, v, record.time) for k, v in kept]


def _scan(
    *,
    run: Run | None,
    blocks: Iterable[bytes],
    progress: Callable[[ImportReport], None] | None = None,
) -> ImportReport:
    """One pass over a file: check every line and, given a run, import it."""
    report = ImportReport()
    batcher = _Batcher(run) if run is not None else None
    config: dict[str, Any] = {}
    saw_config = False
    summary: dict[str, Any] = {}
    for number, line, consumed in iter_lines(blocks):
        report.lines = number
        report.bytes = consumed
        parsed = record_parse(line)
        if parsed is None:
            continue
        if isinstance(parsed, str):
            report.error(number, parsed)
            continue
        report.records += 1
        if parsed.metrics is not None:
            if batcher is None:
                report.points += len(parsed.metrics) if parsed.step is not None else 0
            else:
                for key, step, value, at in _line_points(run.pk, number, parsed, report):  # type: ignore[union-attr]
                    batcher.add(key, step, value, at)
                if len(batcher.points) >= POINTS_PER_INGEST:
                    batcher.flush()
                    report.points = batcher.written
                    if progress is not None:
                        progress(report)
        if parsed.config is not None:
            config.update(parsed.config)
            saw_config = True
        if parsed.summary is not None:
            _flatten(parsed.summary, "", summary)
            report.summary_line = number
        if parsed.artifact is not None and parsed.artifact not in report.artifacts:
            report.artifacts.append(parsed.artifact)
    if batcher is not None:
        batcher.flush()
        report.points = batcher.written
    report.config = config if saw_config else None
    report.summary = {k: float(v) for k, v in summary.items() if _number(v)}
    if progress is not None:
        progress(report)
    return report


def tracker_jsonl_check(*, blocks: Iterable[bytes]) -> ImportReport:
    """Read a file without storing anything: its lines, records and problems."""
    return _scan(run=None, blocks=blocks)


def tracker_jsonl_import(
    *,
    run_id: int,
    blocks: Iterable[bytes] | Callable[[], Iterable[bytes]],
    strict: bool = False,
    progress: Callable[[ImportReport], None] | None = None,
) -> ImportReport:
    """Import a file into a run: its points, then its config, summary and artifacts.

    ``blocks`` may be a callable giving a fresh stream: with ``strict`` the file is read
    twice, once to refuse it whole (nothing stored) if any line is wrong."""
    opener = blocks if callable(blocks) else (lambda: blocks)
    if strict:
        checked = tracker_jsonl_check(blocks=opener())
        if checked.error_count:
            raise ValidationError({"jsonl": [f"line {n}: {p}" for n, p in checked.errors[:20]]})
    run = Run.objects.only("pk", "state").get(pk=run_id)
    report = _scan(run=run, blocks=opener(), progress=progress)
    if strict and report.error_count:  # problems only an import finds (units)
        logger.warning("strict import of run %s found %s problems", run_id, report.error_count)
    _apply_config_and_summary(run_id=run_id, report=report)
    return report


def _apply_config_and_summary(*, run_id: int, report: ImportReport) -> None:
    if report.config is None and not report.summary and not report.artifacts:
        return
    _, problems = tracker_reports.run_tracker_report(
        run_id=run_id,
        config=report.config,
        replace_config=True,
        summary=report.summary or None,
        replace_summary=True,
        artifacts=report.artifacts,
    )
    for problem in problems:
        report.error(report.summary_line, f"summary: {problem}")


# --- uploads: checked as they arrive, stored in chunks, imported by a task ------------------


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
    from runs import tasks

    try:
        tasks.tracker_import_task.apply_async(kwargs={"import_id": import_id}, retry=False)
    except Exception:  # the broker is down: the beat's resume pass will do it
        logger.warning("could not enqueue tracker import %s; the resume pass will", import_id)


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
        verb="tracker_import",
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
    door: str = "cli",
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

    if not Run.objects.filter(pk=run_id).exists():
        raise DomainError(f"No run {run_id}.")
    upload = TrackerImport.objects.create(
        run_id=run_id,
        door=door,
        actor_label=actor_label,
        filename=path.name[:255],
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
