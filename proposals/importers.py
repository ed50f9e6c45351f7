"""The importers of proposals/, registered into ``marin_site.importing`` from
``ProposalsConfig.ready()``: ``outcome-digest``, Marin's editorial outcome digest
(``docs/reports/data/agent-moe-experiments.jsonl`` in Marin's repository) onto the imported
proposals of its issues.

The digest is JSON lines: a ``metadata`` record (snapshot date, parent issue, headline),
then one ``experiment`` record per issue with ``issue``, ``title``, ``category``,
``section``, ``outcome``, ``summary``, ``state``, ``source_updated_at``,
``wall_clock_speedup`` and ``model_flops_speedup``. Each experiment line sets its issue's
outcome (Marin's words mapped to the site's), the conclusion (its summary) and the key
figures (the two speedups, its category and section); a line that matches no imported
proposal, names an outcome outside the taxonomy or is not JSON is refused with its line
number. Importing the same digest again changes nothing.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable
from typing import Any

from django.core.exceptions import ValidationError

from marin_site import importing
from marin_site.doors import Door
from marin_site.errors import DomainError
from proposals import services
from proposals.models import Outcome, Proposal, State

KIND = "outcome-digest"
LINE_MAX = 64 * 1024
# Marin's outcome words (the digest and its report) -> the site's outcomes.
DIGEST_OUTCOMES = {
    "worked": Outcome.WORKED,
    "promising": Outcome.PROMISING,
    "mixed": Outcome.MIXED,
    "did not work": Outcome.DID_NOT_WORK,
    "didn't work": Outcome.DID_NOT_WORK,
    "failed": Outcome.DID_NOT_WORK,
    "inconclusive": Outcome.INCONCLUSIVE,
    "not evaluated": Outcome.NOT_EVALUATED,
    "not yet evaluated": Outcome.NOT_EVALUATED,
}
NO_FIGURE = {"", "—", "-", "n/a"}


def key_figures(record: dict[str, Any]) -> str:
    """The digest's figures of one experiment as the proposal's key figures (Markdown)."""
    rows = [
        ("Wall-clock speedup", record.get("wall_clock_speedup")),
        ("Model-FLOPs speedup", record.get("model_flops_speedup")),
        ("Category", record.get("category")),
        ("Section", record.get("section")),
    ]
    kept = [(k, str(v).strip()[:200]) for k, v in rows if str(v or "").strip() not in NO_FIGURE]
    return "\n".join(f"- {k}: {v}" for k, v in kept)


def digest_line_apply(
    report: importing.ImportReport, place: str, raw: bytes | str, *, by: Any, dry_run: bool
) -> None:
    """One line of the digest: matched, skipped or refused, with its reason."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    if not text.strip():
        return
    if len(text) > LINE_MAX:
        report.refused(place, f"{len(text)} characters, over the cap of {LINE_MAX}")
        return
    try:
        record = json.loads(text)
    except ValueError:
        report.refused(place, "not JSON")
        return
    if not isinstance(record, dict):
        report.refused(place, "not a JSON object")
        return
    kind = record.get("record_type", "experiment")
    if kind != "experiment":
        report.skipped(place, f"a {str(kind)[:40]} record, nothing to import")
        return
    number = record.get("issue")
    if not isinstance(number, int) or isinstance(number, bool) or number <= 0:
        report.refused(place, "issue: not an issue number")
        return
    word = str(record.get("outcome") or "").strip()
    outcome = DIGEST_OUTCOMES.get(word.lower())
    if outcome is None:
        known = ", ".join(sorted({w.capitalize() for w in DIGEST_OUTCOMES}))
        report.refused(place, f"outcome: '{word[:60]}' is not one of {known}")
        return
    proposal = Proposal.objects.filter(github_issue_number=number).first()
    if proposal is None:
        report.refused(place, f"issue #{number} matches no imported proposal")
        return
    if proposal.state != State.IMPORTED:
        report.skipped(place, f"issue #{number} is proposal {proposal.pk}, followed on the site")
        return
    summary = str(record.get("summary") or "").strip()
    try:
        with importing.item_transaction(dry_run=dry_run):
            changed = services.proposal_outcome_found(
                proposal_id=proposal.pk,
                actor=by,
                actor_label="" if getattr(by, "is_authenticated", False) else "outcome digest",
                outcome=outcome,
                conclusion=summary,
                results=key_figures(record),
                door=Door.WEB if getattr(by, "is_authenticated", False) else Door.SYSTEM,
            )
    except (DomainError, ValidationError) as exc:
        report.refused(
            place, exc.message if isinstance(exc, DomainError) else "; ".join(exc.messages)
        )
        return
    if changed:
        report.matched(place, f"issue #{number}: {outcome.label}")
    else:
        report.skipped(place, f"issue #{number}: already {outcome.label}")


def digest_lines_apply(
    lines: Iterable[bytes | str], *, by: Any = None, dry_run: bool = False, source: str = ""
) -> importing.ImportReport:
    """Every line of a digest, numbered from 1, into one report."""
    report = importing.ImportReport(kind=KIND, source=source, dry_run=dry_run)
    for number, raw in enumerate(lines, start=1):
        digest_line_apply(report, f"line {number}", raw, by=by, dry_run=dry_run)
    return report


def outcome_digest_import(source: Any, *, by: Any, dry_run: bool) -> importing.ImportReport:
    report = importing.report_start(source, KIND)
    report.dry_run = dry_run
    lines = io.BufferedReader(source) if isinstance(source, io.RawIOBase) else source
    for number, raw in enumerate(lines, start=1):
        digest_line_apply(report, f"line {number}", raw, by=by, dry_run=dry_run)
    return report


def register() -> None:
    importing.register_importer(
        KIND,
        "Marin's outcome digest (agent-moe-experiments.jsonl), onto imported issues",
        outcome_digest_import,
        description=(
            "Each experiment line sets the outcome, conclusion and key figures of the "
            "imported proposal of its issue (import the issues first: manage.py "
            "github_backfill)."
        ),
        accepts_url=True,
    )
