"""Run tokens: what a job shows to report on its run, derived from (run, attempt), so that
only their SHA-256 is stored; and the refusals a token meets once its run or attempt is over.
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from marin_site.errors import DomainError
from runs.models import TERMINAL_RUN_STATES, Run


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
