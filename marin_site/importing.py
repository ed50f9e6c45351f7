"""The one way the project's past comes in: a registry of importers, the report each
returns, the sources they read, and the service every door calls (``import_run``).

An importer is a function ``func(source, *, by, dry_run, **options) -> ImportReport``:
``source`` is a binary file-like object (``name`` holds where it came from; reads past the
size cap raise ``SourceTooLarge``), ``by`` the user who asked (or None from the command
line), ``dry_run`` whether to store nothing, and ``options`` the values of the options it
declared (a run's id, ...). The apps register theirs from their ``ready()``; this module
imports no app. The doors are ``manage.py import_history KIND SOURCE [--dry-run]`` and
the maintainers' page ``/imports/`` (``marin_site.import_views``): both call
``import_run``, so they behave the same.

A report says, for every place of the source (a line, a row, an issue, the file itself),
whether it was matched (imported), skipped (nothing to do, or a part not stored), or
refused (wrong, said in words), and counts them. Nothing is half imported: an importer
writes each item in its own transaction (``item_transaction``), which a dry run rolls back.
A bad source (an unknown URL scheme, a file over the cap, a file that cannot be read) is a
refusal in the report, never an exception out of ``import_run``.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import IO, Any, Protocol
from urllib.parse import urlsplit

import rules
from django.conf import settings
from django.db import transaction

from marin_site.errors import DomainError
from marin_site.roles import is_maintainer

IMPORT_PERMISSION = "marin_site.import_history"
rules.add_perm(IMPORT_PERMISSION, is_maintainer)

MAX_REPORTED_PLACES = 1000  # places kept in a report's lines; the counts go on
REASON_MAX = 500
READ_BYTES = 256 * 1024


class Outcome(StrEnum):
    MATCHED = "matched"
    SKIPPED = "skipped"
    REFUSED = "refused"


@dataclass(frozen=True)
class ReportLine:
    place: str  # "line 12", "row 3", "issue #1234", "file history.parquet"
    outcome: Outcome
    reason: str = ""

    def text(self) -> str:
        return f"{self.place}: {self.outcome}" + (f": {self.reason}" if self.reason else "")


@dataclass
class ImportReport:
    """What one import found and did, place by place, with the counts of each outcome."""

    kind: str = ""
    source: str = ""
    dry_run: bool = False
    lines: list[ReportLine] = field(default_factory=list)
    counts: dict[Outcome, int] = field(default_factory=lambda: dict.fromkeys(Outcome, 0))
    notes: list[str] = field(default_factory=list)  # what the importer says of the whole

    def add(self, place: str, outcome: Outcome, reason: str = "") -> ReportLine:
        line = ReportLine(str(place)[:200], Outcome(outcome), str(reason)[:REASON_MAX])
        self.counts[line.outcome] += 1
        if len(self.lines) < MAX_REPORTED_PLACES:
            self.lines.append(line)
        return line

    def matched(self, place: str, reason: str = "") -> ReportLine:
        return self.add(place, Outcome.MATCHED, reason)

    def skipped(self, place: str, reason: str) -> ReportLine:
        return self.add(place, Outcome.SKIPPED, reason)

    def refused(self, place: str, reason: str) -> ReportLine:
        return self.add(place, Outcome.REFUSED, reason)

    def tally(self, outcome: Outcome, count: int) -> None:
        """Count ``count`` places without listing them (the lines of a large file that
        imported as they should: listing each would bury the ones that did not)."""
        self.counts[Outcome(outcome)] += max(count, 0)

    def note(self, text: str) -> None:
        self.notes.append(str(text)[:REASON_MAX])

    @property
    def matched_count(self) -> int:
        return self.counts[Outcome.MATCHED]

    @property
    def skipped_count(self) -> int:
        return self.counts[Outcome.SKIPPED]

    @property
    def refused_count(self) -> int:
        return self.counts[Outcome.REFUSED]

    @property
    def places_left_out(self) -> int:
        return sum(self.counts.values()) - len(self.lines)

    def summary(self) -> str:
        verb = "would import" if self.dry_run else "imported"
        text = (
            f"{self.kind or 'import'} from {self.source or 'the source'}: {verb} "
            f"{self.matched_count}, skipped {self.skipped_count}, refused {self.refused_count}"
        )
        if self.dry_run:
            text += " (dry run: nothing stored)"
        return text + "."

    def text_lines(self) -> Iterator[str]:
        """The report as a person reads it: each place, then the notes and the summary."""
        for line in self.lines:
            yield line.text()
        if self.places_left_out:
            yield f"... and {self.places_left_out} more places not listed"
        yield from self.notes
        yield self.summary()

    def as_text(self) -> str:
        return "\n".join(self.text_lines())

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "source": self.source,
            "dry_run": self.dry_run,
            "counts": {str(k): v for k, v in self.counts.items()},
            "lines": [
                {"place": line.place, "outcome": str(line.outcome), "reason": line.reason}
                for line in self.lines
            ],
            "notes": list(self.notes),
        }


class ImportRefused(DomainError):
    """The import as a whole cannot start (an unknown kind, a missing option)."""


class SourceRefused(DomainError):
    """The source cannot be read: an unknown URL scheme, a missing file, over the cap."""


class SourceTooLarge(SourceRefused):
    status_code = 413


@contextmanager
def item_transaction(*, dry_run: bool) -> Iterator[None]:
    """One imported item, all or nothing; a dry run rolls it back after it has been
    checked by the database as for real (constraints included)."""
    with transaction.atomic():
        yield
        if dry_run:
            transaction.set_rollback(True)


# --- sources ---------------------------------------------------------------------------------


def max_bytes() -> int:
    return int(settings.IMPORTS_MAX_BYTES)


def url_schemes() -> frozenset[str]:
    return frozenset(s.strip().lower() for s in settings.IMPORTS_URL_SCHEMES if s.strip())


class CappedReader(io.RawIOBase):
    """A binary stream that refuses to read past ``cap`` bytes (``SourceTooLarge``), so an
    importer that streams never holds more than it reads, whatever the source claims."""

    def __init__(self, raw: IO[bytes] | io.IOBase, *, name: str, cap: int) -> None:
        super().__init__()
        self.raw = raw
        self.name = name
        self.cap = cap
        self.position = 0
        self.report: ImportReport | None = None  # set by report_start: kept if reading fails

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return bool(getattr(self.raw, "seekable", lambda: False)())

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.position = self.raw.seek(offset, whence)
        return self.position

    def tell(self) -> int:
        return self.position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.raw.read(len(view))
        if not data:
            return 0
        if self.position + len(data) > self.cap:
            raise SourceTooLarge(f"{self.name} is larger than the limit of {self.cap} bytes.")
        view[: len(data)] = data
        self.position += len(data)
        return len(data)

    def close(self) -> None:
        try:
            self.raw.close()
        finally:
            super().close()


def report_start(source: Any, kind: str = "") -> ImportReport:
    """The report an importer fills for ``source``; if the source turns out to be over the
    cap halfway, ``import_run`` returns this report (what was imported before included)
    with the refusal added."""
    report = ImportReport(kind=kind, source=str(getattr(source, "name", "") or ""))
    if isinstance(source, CappedReader):
        source.report = report
    return report


def source_is_local(source: str) -> bool:
    """A path or ``file://`` URL on this machine (or standard input): the command line may
    read one, the web page may not (a maintainer uploads the file instead)."""
    scheme = urlsplit(source).scheme.lower()
    return source == "-" or len(scheme) <= 1 or scheme == "file"


def source_check(source: str) -> str | None:
    """Why ``source`` (a path, ``-`` or a URL) cannot be read, or None."""
    if source == "-":
        return None
    scheme = urlsplit(source).scheme.lower()
    if len(scheme) > 1 and scheme not in url_schemes():  # one letter: a Windows drive
        allowed = ", ".join(sorted(url_schemes())) or "none"
        return f"the URL scheme '{scheme}:' is not one this site reads (allowed: {allowed})"
    return None


def _size_of(source: str, scheme: str) -> int | None:
    if scheme in {"", "file"}:
        path = source[len("file://") :] if scheme == "file" else source
        try:
            return os.stat(path).st_size
        except OSError as exc:
            raise SourceRefused(f"{source} cannot be read: {exc.strerror or exc}") from exc
    return None


@contextmanager
def source_open(source: str, *, cap: int | None = None) -> Iterator[CappedReader]:
    """Open a path, ``-`` (standard input) or a URL (through fsspec: ``file://``, and
    ``gs://`` with the ``gcs`` extra) as a capped binary stream. Refuses an unknown scheme
    and a file whose size is known to be over the cap before reading a byte."""
    limit = max_bytes() if cap is None else cap
    problem = source_check(source)
    if problem:
        raise SourceRefused(f"{source}: {problem}.")
    if source == "-":
        yield CappedReader(sys.stdin.buffer, name="standard input", cap=limit)
        return
    scheme = urlsplit(source).scheme.lower()
    scheme = "" if len(scheme) <= 1 else scheme
    size = _size_of(source, scheme)
    if size is not None and size > limit:
        raise SourceTooLarge(f"{source} is {size} bytes; the limit is {limit} bytes.")
    try:
        if scheme:
            import fsspec  # a dependency; its remote file systems are extras (gcsfs)

            opened = fsspec.open(source, "rb").open()
        else:
            opened = Path(source).open("rb")  # noqa: SIM115 (the reader below closes it)
    except ImportError as exc:
        raise SourceRefused(
            f"{source}: reading '{scheme}:' URLs needs a package this site lacks ({exc.name})."
        ) from exc
    except (OSError, ValueError) as exc:
        raise SourceRefused(f"{source} cannot be read: {exc}") from exc
    reader = CappedReader(opened, name=source, cap=limit)
    try:
        yield reader
    finally:
        reader.close()


# --- the registry ----------------------------------------------------------------------------


class ImporterFunc(Protocol):
    def __call__(self, source: Any, *, by: Any, dry_run: bool, **options: str) -> ImportReport: ...


@dataclass(frozen=True)
class ImportOption:
    name: str
    label: str
    required: bool = False
    help: str = ""
    source: bool = False  # the value is a path or URL the importer opens (source_open)


@dataclass(frozen=True)
class Importer:
    kind: str
    label: str
    func: Callable[..., ImportReport]
    description: str = ""
    options: tuple[ImportOption, ...] = ()
    accepts_url: bool = False  # the page offers a URL field besides the file
    max_bytes: int | None = None  # None: IMPORTS_MAX_BYTES


_REGISTRY: dict[str, Importer] = {}


def register_importer(
    kind: str,
    label: str,
    func: Callable[..., ImportReport],
    *,
    description: str = "",
    options: tuple[ImportOption, ...] = (),
    accepts_url: bool = False,
    max_bytes: int | None = None,
) -> Importer:
    """Register (or replace: ``ready()`` may run twice in tests) the importer of ``kind``."""
    if not kind or not kind.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"An importer's kind is a short word, not {kind!r}.")
    importer = Importer(kind, label, func, description, tuple(options), accepts_url, max_bytes)
    _REGISTRY[kind] = importer
    return importer


def importers() -> list[Importer]:
    return sorted(_REGISTRY.values(), key=lambda i: i.kind)


def importer_get(kind: str) -> Importer:
    importer = _REGISTRY.get(kind)
    if importer is None:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise ImportRefused(f"There is no importer of kind '{kind[:50]}' (known: {known}).")
    return importer


def options_check(importer: Importer, options: Mapping[str, str]) -> dict[str, str]:
    declared = {o.name: o for o in importer.options}
    unknown = sorted(set(options) - set(declared))
    if unknown:
        raise ImportRefused(
            f"The importer '{importer.kind}' takes no option {', '.join(unknown)}"
            + (f" (it takes: {', '.join(declared)})." if declared else ".")
        )
    values = {k: str(v).strip()[:500] for k, v in options.items() if str(v).strip()}
    missing = [o.name for o in importer.options if o.required and o.name not in values]
    if missing:
        raise ImportRefused(
            f"The importer '{importer.kind}' needs the option {', '.join(missing)}: "
            + "; ".join(declared[m].help or declared[m].label for m in missing)
        )
    return values


def import_run(
    *,
    kind: str,
    source: str | IO[bytes] | io.IOBase,
    by: Any = None,
    dry_run: bool = False,
    options: Mapping[str, str] | None = None,
    source_name: str = "",
) -> ImportReport:
    """Run the importer of ``kind`` on ``source`` (a path, ``-``, a URL, or an open binary
    file such as an upload). Never raises for a bad source: it is refused in the report.
    Raises ``ImportRefused`` for an unknown kind or a missing option (nothing was read)."""
    importer = importer_get(kind)
    values = options_check(importer, options or {})
    cap = importer.max_bytes or max_bytes()
    name = source_name or (source if isinstance(source, str) else getattr(source, "name", ""))
    name = str(name or "the upload")[:300]

    def refused(reason: str) -> ImportReport:
        report = ImportReport(kind=kind, source=name, dry_run=dry_run)
        report.refused(f"source {name}", reason)
        return report

    opened: list[CappedReader] = []
    try:
        if isinstance(source, str):
            with source_open(source, cap=cap) as stream:
                opened.append(stream)
                report = importer.func(stream, by=by, dry_run=dry_run, **values)
        else:
            size = getattr(source, "size", None)
            if isinstance(size, int) and size > cap:
                raise SourceTooLarge(f"{name} is {size} bytes; the limit is {cap} bytes.")
            stream = CappedReader(source, name=name, cap=cap)
            opened.append(stream)
            report = importer.func(stream, by=by, dry_run=dry_run, **values)
    except SourceRefused as exc:
        started = opened[0].report if opened else None
        if started is None:
            return refused(exc.message)
        started.refused(f"source {name}", exc.message + " The items above it were kept.")
        report = started
    report.kind = report.kind or kind
    report.source = report.source or name
    report.dry_run = dry_run
    return report
