"""A W&B run's history from W&B's own export onto a run (kind ``wandb_history``).

The source is the run's ``history`` Parquet artifact (W&B's ``run-<id>-history`` files), or
a Parquet or CSV written from ``run.history()``: one row per logged step, the columns
``_step`` (required), ``_runtime``, ``_timestamp`` and one per metric with ``/`` in its name
(``train/loss``, ``eval/paloma/c4_en/bpb``), empty (NaN) where that step did not log it.
Every finite number becomes a point (run, key, step) through the one ingest path, in
batches, the file read a row group at a time (Parquet) or a line at a time (CSV), never held
whole. A column that is not numbers (media, histograms, text) is skipped, named once.

Options: ``run`` (the run's number; may be left out when ``wandb_run`` names a run already
imported, such as a speedrun's), ``wandb_run`` (``entity/project/run_id`` or its W&B address:
kept on the run as ``wandb:entity/project/run_id``), ``config`` and ``summary`` (a path or
URL of the run's ``config`` and ``summary`` JSON files: W&B's ``{"key": {"value": ...}}``
config form is read too). Points are upserted, so importing again doubles nothing.
"""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
import tempfile
from collections.abc import Iterator
from typing import IO, Any

from django.core.exceptions import ValidationError

from marin_site import importing, links
from marin_site.doors import Door
from marin_site.errors import DomainError
from marin_site.events import Verb
from runs.imports.tracker import run_option
from runs.metrics.parse import EARLIEST, LATEST, METRIC_KEY
from runs.models import Run, RunEvent, RunOrigin
from runs.trackers import jsonl
from runs.trackers import reports as tracker_reports

KIND = "wandb_history"
PARQUET_MAGIC = b"PAR1"
ROWS_PER_BATCH = 2000
META_COLUMNS = frozenset({"_step", "_runtime", "_timestamp"})
CSV_FIELD_MAX = 1024 * 1024
JSON_MAX_BYTES = 16 * 1024 * 1024


class HistoryRefused(DomainError):
    """The history file as a whole cannot be read (no ``_step``, not Parquet nor CSV)."""


def _float(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        if not value.strip():
            return None
        try:
            number = float(value)
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None


def _parquet_rows(source: Any, name: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Parquet is read from its footer: a stream that cannot seek is spooled to disk first
    (still under the cap, which the source's reader enforces)."""
    if getattr(source, "seekable", lambda: False)():
        yield from _parquet_file_rows(source, name)
        return
    with tempfile.TemporaryFile() as spool:
        shutil.copyfileobj(source, spool, length=256 * 1024)
        spool.seek(0)
        yield from _parquet_file_rows(spool, name)


def _parquet_file_rows(handle: IO[bytes], name: str) -> Iterator[tuple[str, dict[str, Any]]]:
    import pyarrow.parquet as pq  # a dependency, imported when a Parquet file comes

    try:
        parquet = pq.ParquetFile(handle)
    except Exception as exc:  # pyarrow raises its own errors for a damaged file
        raise HistoryRefused(f"{name} is not a readable Parquet file: {str(exc)[:200]}") from exc
    columns = parquet.schema_arrow.names
    if "_step" not in columns:
        raise HistoryRefused(
            f"{name} has no '_step' column (its columns: {', '.join(columns[:20])})"
        )
    row = 0
    for batch in parquet.iter_batches(batch_size=ROWS_PER_BATCH):
        data = batch.to_pydict()
        for index in range(batch.num_rows):
            row += 1
            yield f"row {row}", {key: values[index] for key, values in data.items()}


def _csv_rows(source: Any, name: str) -> Iterator[tuple[str, dict[str, Any]]]:
    csv.field_size_limit(CSV_FIELD_MAX)
    text = io.TextIOWrapper(source, encoding="utf-8", errors="strict", newline="")
    reader = csv.DictReader(text)
    try:
        columns = reader.fieldnames or []
    except (UnicodeDecodeError, csv.Error) as exc:
        raise HistoryRefused(f"{name} is neither Parquet nor CSV: {str(exc)[:200]}") from exc
    if "_step" not in columns:
        shown = ", ".join(str(c) for c in columns[:20]) or "none"
        raise HistoryRefused(f"{name} has no '_step' column (its columns: {shown})")
    row = 0
    try:
        for values in reader:
            row += 1
            yield f"row {row}", values
    except (UnicodeDecodeError, csv.Error) as exc:
        raise HistoryRefused(f"{name}: row {row + 1} cannot be read: {str(exc)[:200]}") from exc


def history_rows(source: Any, name: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(place, row) of a W&B history export, Parquet or CSV (told by Parquet's magic)."""
    if getattr(source, "seekable", lambda: False)():
        head = source.read(4)
        source.seek(0)
        if head == PARQUET_MAGIC:
            return _parquet_rows(source, name)
    buffered = io.BufferedReader(source)
    if buffered.peek(4)[:4] == PARQUET_MAGIC:
        return _parquet_rows(buffered, name)
    return _csv_rows(buffered, name)


def _json_option(report: importing.ImportReport, option: str, value: str) -> dict[str, Any] | None:
    if not value:
        return None
    try:
        with importing.source_open(value, cap=JSON_MAX_BYTES) as handle:
            data = json.load(handle)
    except importing.SourceRefused as exc:
        report.refused(f"option {option}", exc.message)
        return None
    except (ValueError, UnicodeDecodeError) as exc:
        report.refused(f"option {option}", f"{value} is not JSON: {str(exc)[:200]}")
        return None
    if not isinstance(data, dict):
        report.refused(f"option {option}", f"{value} is not a JSON object")
        return None
    return data


def _config(data: dict[str, Any]) -> dict[str, Any]:
    """W&B's files write the config as ``{"key": {"desc": ..., "value": ...}}``; the API's
    ``run.config`` as plain values. Both come in plain; W&B's own ``_wandb`` is left out."""
    plain: dict[str, Any] = {}
    for key, value in data.items():
        if key == "_wandb":
            continue
        wrapped = isinstance(value, dict) and "value" in value and set(value) <= {"value", "desc"}
        plain[key] = value["value"] if wrapped else value
    return plain


def _summary(data: dict[str, Any]) -> dict[str, float]:
    flat: dict[str, Any] = {}
    jsonl.flatten_metrics({k: v for k, v in data.items() if not k.startswith("_")}, "", flat)
    return {
        k: float(v)
        for k, v in flat.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


def _target(report: importing.ImportReport, run: str, wandb_id: str | None) -> Run | None:
    if run:
        return run_option(report, run)
    if wandb_id:
        found = Run.objects.filter(origin=RunOrigin.IMPORTED, imported_from=wandb_id).first()
        if found is None:
            report.refused("option run", f"no run was imported from {wandb_id}: give the run")
        return found
    report.refused("option run", "give the run, or the W&B run of a run already imported")
    return None


def wandb_history_import(
    source: Any,
    *,
    by: Any,
    dry_run: bool,
    run: str = "",
    wandb_run: str = "",
    config: str = "",
    summary: str = "",
) -> importing.ImportReport:
    report = importing.report_start(source, KIND)
    wandb_id = None
    if wandb_run:
        text = wandb_run.strip()
        wandb_id = links.link_canonical(text if "://" in text else f"wandb:{text}")
        if wandb_id is None or not wandb_id.startswith("wandb:"):
            report.refused("option wandb_run", f"'{text[:80]}' is not entity/project/run_id")
            return report
    target = _target(report, run, wandb_id)
    config_data = _json_option(report, "config", config)
    summary_data = _json_option(report, "summary", summary)
    if target is None or report.refused_count:
        return report
    try:
        rows, points = _import_rows(report, source, target, dry_run=dry_run)
    except HistoryRefused as exc:
        report.refused("file", exc.message)
        return report
    except ValidationError as exc:
        report.refused("file", "; ".join(exc.messages)[:400])
        return report
    verb = "would import" if dry_run else "imported"
    report.note(f"Run {target.pk}: {verb} {points} points from {rows} rows.")
    if not dry_run:
        _apply_config_and_summary(report, target, config_data, summary_data, wandb_id)
        message = f"imported W&B history: {points} points from {rows} rows of {report.source}"
        RunEvent.build(
            run_id=target.pk,
            verb=Verb.TRACKER_IMPORT,
            door=Door.WEB if getattr(by, "is_authenticated", False) else Door.SYSTEM,
            actor=by,
            actor_label="" if by else "manage.py import_history",
            message=message + (f" ({wandb_id})" if wandb_id else ""),
        ).save()
    return report


def _row_metrics(
    report: importing.ImportReport, row: dict[str, Any], skipped_columns: set[str]
) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for key, value in row.items():
        if key in META_COLUMNS or key in skipped_columns:
            continue
        number = _float(value)
        if number is None:
            if value is not None and not _blank(value):
                skipped_columns.add(key)
                report.skipped(f"column {key}", "not numbers (media, text or a table)")
            continue
        if not METRIC_KEY.match(key):
            skipped_columns.add(key)
            report.skipped(f"column {key}", "not a metric name the site keeps")
            continue
        metrics[key] = number
    return metrics


def _import_rows(
    report: importing.ImportReport, source: Any, target: Run, *, dry_run: bool
) -> tuple[int, int]:
    """Every row's points, through the ingest in batches (none on a dry run): the rows read
    and the points written (or that would be)."""
    batcher = None if dry_run else jsonl.PointBatcher(target)
    found = jsonl.ImportReport()
    skipped_columns: set[str] = set()
    rows = points = 0
    for place, row in history_rows(source, report.source):
        rows += 1
        step = _float(row.get("_step"))
        if step is None or step < 0 or not step.is_integer():
            report.refused(place, f"'_step' is not a step ({str(row.get('_step'))[:40]})")
            continue
        metrics = _row_metrics(report, row, skipped_columns)
        if not metrics:
            report.tally(importing.Outcome.SKIPPED, 1)
            continue
        at = _float(row.get("_timestamp"))
        record = jsonl.TrackerRecord(
            step=int(step),
            metrics=metrics,
            time=at if at is not None and EARLIEST <= at <= LATEST else None,
        )
        kept = jsonl.record_points(target.pk, rows, record, found)
        points += len(kept)
        if batcher is not None:
            for key, point_step, value, when in kept:
                batcher.add(key, point_step, value, when)
            if len(batcher.points) >= jsonl.POINTS_PER_INGEST:
                batcher.flush()
        report.tally(importing.Outcome.MATCHED, 1)
    if batcher is not None:
        batcher.flush()
    for number, problem in found.errors:
        report.refused(f"row {number}", problem)
    return rows, points


def _apply_config_and_summary(
    report: importing.ImportReport,
    target: Run,
    config_data: dict[str, Any] | None,
    summary_data: dict[str, Any] | None,
    wandb_id: str | None,
) -> None:
    try:
        with importing.item_transaction(dry_run=False):
            _, problems = tracker_reports.run_tracker_report(
                run_id=target.pk,
                config=_config(config_data) if config_data is not None else None,
                replace_config=True,
                # merged: the figures a run already has (a speedrun's) stay
                summary=_summary(summary_data) if summary_data is not None else None,
                replace_summary=False,
                artifacts=[],
            )
            if wandb_id:
                _keep_wandb_run(Run.objects.get(pk=target.pk), wandb_id)
    except ValidationError as exc:
        report.refused("option config", "; ".join(exc.messages)[:400])
        return
    for problem in problems:
        report.refused("option summary", problem)


def _blank(value: Any) -> bool:
    return (isinstance(value, float) and math.isnan(value)) or (
        isinstance(value, str) and value.strip().lower() in {"", "nan"}
    )


def _keep_wandb_run(run: Run, wandb_id: str) -> None:
    fields = ["tracker_tags", "updated_at"]
    run.tracker_tags = {**(run.tracker_tags or {}), "wandb.run": wandb_id.removeprefix("wandb:")}
    if not run.wandb_url:
        run.wandb_url = links.link_url(wandb_id) or ""
        fields.append("wandb_url")
    if run.origin == RunOrigin.IMPORTED and not run.imported_from:
        run.imported_from = wandb_id
        fields.append("imported_from")
    run.save(update_fields=fields)


def register() -> None:
    importing.register_importer(
        KIND,
        "W&B run history (the history Parquet, or run.history() as Parquet or CSV), onto a run",
        wandb_history_import,
        description=(
            "Every logged step of every metric column (full curves), with the run's config "
            "and summary JSON files; the W&B run is kept as wandb:entity/project/run_id."
        ),
        options=(
            importing.ImportOption("run", "Run", help="the run's number"),
            importing.ImportOption(
                "wandb_run", "W&B run", help="entity/project/run_id, or its W&B address"
            ),
            importing.ImportOption(
                "config", "Config JSON", help="a URL of the run's config JSON", source=True
            ),
            importing.ImportOption(
                "summary", "Summary JSON", help="a URL of the run's summary JSON", source=True
            ),
        ),
        accepts_url=True,
    )
