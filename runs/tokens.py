"""Run tokens: what a job shows to report on its run, derived from (run, attempt), so that
only their SHA-256 is stored; and the refusals a token meets once its run or attempt is over.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone

from marin_site.errors import DomainError
from runs import selectors
from runs.models import TERMINAL_RUN_STATES, Run, RunState


def run_token(*, run: Run) -> str:
    """The run's token for its current attempt.

    Derived from SECRET_KEY, so a dispatch repeated after a crash hands the job the same
    token; only its SHA-256 is stored on the run.
    """
    key = settings.SECRET_KEY.encode()
    digest = hmac.new(key, f"run-token:{run.pk}:{run.attempt}".encode(), hashlib.sha256)
    return f"r{run.pk}.{digest.hexdigest()}"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class RunEnded(DomainError):
    """A write with the token of a run that has ended: nothing it sends is taken (409)."""

    status_code = 409


class RunTokenExpired(DomainError):
    """A run token past its run's time limit and grace (401)."""

    status_code = 401


def run_token_refusal(*, run: Run, write: bool) -> DomainError | None:
    """Why a token that matches ``run`` may not be used now, or None.

    Once the run is terminal its token writes nothing more (a late job cannot replace a
    finished run's numbers), and whatever the state it ends with the run's time limit plus
    ``RUNS_TOKEN_GRACE_SECONDS`` after the run started: a leaked token does not live on."""
    if write and run.state in TERMINAL_RUN_STATES:
        return RunEnded(f"Run {run.pk} has ended ({run.state}); its token writes nothing more.")
    if run.started_at is not None:
        lifetime = timedelta(seconds=run.time_limit_seconds + settings.RUNS_TOKEN_GRACE_SECONDS)
        if timezone.now() > run.started_at + lifetime:
            return RunTokenExpired(
                f"The token of run {run.pk} expired: its time limit and "
                f"{settings.RUNS_TOKEN_GRACE_SECONDS} s of grace have passed since it started."
            )
    return None


def run_token_matches(*, run: Run, token: str) -> bool:
    return bool(run.token_hash) and hmac.compare_digest(token_hash(token), run.token_hash)


class TokenSuperseded(DomainError):
    """A token of an attempt that is over (its lease was lost, its run requeued): 409."""

    status_code = 409


def run_token_superseded(*, run: Run, token: str) -> int:
    """The earlier attempt of ``run`` whose token this is (its lease or job is over), or 0.

    Tokens derive from (run, attempt), so an earlier attempt's token is recognised without
    storing it: a late report from a lost lease is told 409, not mistaken for a stranger."""
    for attempt in range(run.attempt - 1, 0, -1):
        key = settings.SECRET_KEY.encode()
        digest = hmac.new(key, f"run-token:{run.pk}:{attempt}".encode(), hashlib.sha256)
        if hmac.compare_digest(token, f"r{run.pk}.{digest.hexdigest()}"):
            return attempt
    return 0


# --- admissions: the metrics door's token check kept by the process ------------------------


@dataclass(frozen=True, slots=True)
class Admission:
    """A running run whose token a full check (its row read) let write, as it then was.
    The metrics door takes its next batches on it without reading the row again, and the
    statement that stores them writes only while the row still says all of it
    (``runs.metrics.ingest``: ``admitted``): a run that ended, a new attempt (a new token),
    a restart or a new time limit, in any process, stores nothing, and the door checks the
    row again and answers as the full check does."""

    run_id: int
    token_hash: str
    attempt: int
    started_at: datetime | None
    time_limit_seconds: int
    heartbeat_at: datetime | None

    def run(self) -> Run:
        """The run as the full check loads it (``runs.selectors.runner_run``)."""
        return selectors.runner_run_of(
            {
                "id": self.run_id,
                "state": RunState.RUNNING,
                "token_hash": self.token_hash,
                "attempt": self.attempt,
                "started_at": self.started_at,
                "time_limit_seconds": self.time_limit_seconds,
                "heartbeat_at": self.heartbeat_at,
            }
        )


_ADMISSIONS_KEPT = 10_000
_admissions: dict[int, Admission] = {}


def admission_keep(*, run: Run) -> None:
    """Keep the admission of a running run whose token passed the full check for a write."""
    if run.state != RunState.RUNNING or not run.token_hash or connection.vendor != "postgresql":
        return  # only PostgreSQL's ingest statement checks an admission
    if len(_admissions) >= _ADMISSIONS_KEPT:
        _admissions.clear()
    _admissions[run.pk] = Admission(
        run_id=run.pk,
        token_hash=run.token_hash,
        attempt=run.attempt,
        started_at=run.started_at,
        time_limit_seconds=run.time_limit_seconds,
        heartbeat_at=run.heartbeat_at,
    )


def admission_for(*, run_id: int, token: str) -> Admission | None:
    """The kept admission of ``run_id`` if ``token`` is the one it was kept for and the
    token has not expired since (the refusals that need no row: ``run_token_refusal``)."""
    admission = _admissions.get(run_id)
    if admission is None or not hmac.compare_digest(token_hash(token), admission.token_hash):
        return None
    if run_token_refusal(run=admission.run(), write=True) is not None:
        return None
    return admission


def admission_forget(*, run_id: int) -> None:
    _admissions.pop(run_id, None)


def admission_heard(*, admission: Admission, at: datetime) -> None:
    """The run's sign of life written (or found fresh) at ``at``: kept with its admission,
    as the row would say, so the next batches skip it for ``SIGN_OF_LIFE_EVERY``."""
    if _admissions.get(admission.run_id) is admission:
        _admissions[admission.run_id] = replace(admission, heartbeat_at=at)
