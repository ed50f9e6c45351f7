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

Uploads, the task and the command's file import are ``runs.trackers.uploads``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from django.core.exceptions import ValidationError

from marin_site.errors import DomainError
from runs.metrics import declarations as metric_declarations
from runs.metrics.ingest import metrics_ingest
from runs.metrics.parse import EARLIEST, LATEST, MAX_STEP, METRIC_KEY, PointBatch
from runs.models import Run
from runs.trackers import reports as tracker_reports

logger = logging.getLogger(__name__)

LINE_MAX_BYTES = 1024 * 1024
READ_BYTES = 256 * 1024
POINTS_PER_INGEST = 5000
MAX_REPORTED_ERRORS = 100
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


def flatten_metrics(values: dict[str, Any], prefix: str, out: dict[str, Any]) -> None:
    for key, value in values.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, dict):
            if "bucket_limits" in value and "bucket_counts" in value:  # a histogram
                out[name] = value
            else:
                flatten_metrics(value, name, out)
        else:
            out[name] = value


def _step(value: Any) -> int | None:
    if type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is int and 0 <= value < MAX_STEP:
        return value
    return None


@dataclass
class TrackerRecord:
    step: int | None = None
    time: float | None = None
    metrics: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    summary: dict[str, Any] | None = None
    artifact: dict[str, Any] | None = None


def record_parse(line: bytes) -> TrackerRecord | str | None:
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
            return TrackerRecord(step=_step(data.get("step")), metrics=metrics, time=_time(data))
        if event == "hparams":
            hparams = data.get("hparams")
            if not isinstance(hparams, dict):
                return "an 'hparams' event needs an 'hparams' object"
            return TrackerRecord(config=hparams)
        if event in {"summary", "finish"}:
            summary = data.get("metrics" if event == "summary" else "summary")
            if not isinstance(summary, dict):
                return f"a '{event}' event needs its summary object"
            return TrackerRecord(summary=summary)
        if event == "artifact":
            path = data.get("path")
            if not isinstance(path, str) or not path:
                return "an 'artifact' event needs a 'path'"
            return TrackerRecord(
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
        return TrackerRecord(config=config, summary=summary)
    for name in ("step", "_step"):
        if name in data:
            step = _step(data[name])
            if step is None:
                return f"'{name}' must be a non-negative integer"
            metrics = data.get("metrics")
            if not isinstance(metrics, dict):
                metrics = {k: v for k, v in data.items() if k not in SKIPPED_META_KEYS}
            return TrackerRecord(step=step, metrics=metrics, time=_time(data))
    return "not a tracker record (no event, config, summary or step)"


def _time(data: dict[str, Any]) -> float | None:
    for name in ("time", "_timestamp", "timestamp"):
        value = data.get(name)
        if isinstance(value, int | float) and _number(value) and EARLIEST <= value <= LATEST:
            return float(value)
    return None


# --- importing -------------------------------------------------------------------------------


class PointBatcher:
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


def record_points(
    run_id: int, number: int, record: TrackerRecord, report: ImportReport
) -> list[tuple[str, int, float, float | None]]:
    assert record.metrics is not None
    if record.step is None:
        report.skipped += len(record.metrics)
        return []
    flat: dict[str, Any] = {}
    flatten_metrics(record.metrics, "", flat)
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
    batcher = PointBatcher(run) if run is not None else None
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
                for key, step, value, at in record_points(run.pk, number, parsed, report):  # type: ignore[union-attr]
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
            flatten_metrics(parsed.summary, "", summary)
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


def run_import_tracker_metrics(*, run_id: int, jsonl: str) -> Run:
    """Import a ``tracker_metrics.jsonl`` given whole (the JSON form of the API, at most
    1 MB): every step of every key, the config and the summary (``runs.trackers.jsonl``)."""
    report = tracker_jsonl_import(run_id=run_id, blocks=[jsonl.encode()], strict=False)
    if not report.records:
        raise ValidationError({"jsonl": [report.problem_text() or "holds no tracker record"]})
    return Run.objects.get(pk=run_id)
