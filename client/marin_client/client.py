"""The client a training job uses to report to marin-site: metrics, heartbeats, status.

Standard library only (Python 3.10 to 3.13), so any training environment can import it, and
built so that reporting never hurts training:

- ``log`` and ``log_many`` never block and never raise: they append to a bounded in-memory
  queue (a few hundred nanoseconds a point) and a background thread checks, batches (at most
  1000 points or 1 MB a request) and sends;
- a request that fails for a passing reason (the site away, 5xx, 429) is retried with backoff,
  honouring ``Retry-After``; while the site is away points wait in memory up to
  ``max_queued``, and past that the oldest go to the spill file;
- the site answers a batch with the keys it refused or flagged: each is logged once, and the
  points of a refused key go to the spill file with the site's reason. A refused key never
  holds back the others (a batch refused whole is split by key and sent again);
- ``close`` and ``finish`` never raise: what could not be delivered is written to a JSON-lines
  spill file (``unsent_metrics.jsonl``), one point a line with the reason it is there, and
  counted by reason in ``stats`` and the log. Nothing is dropped silently: a value that is not
  a finite number is spilled and counted too, never sent;
- the spill file is replayed on the next ``start`` of a client of the same run, after the site
  comes back within a session, or by ``marin-site-client replay FILE``. A file cut in the
  middle of a line is replayed up to the cut, and the cut is reported.

    client = RunClient.from_env()     # RUN_API_URL, RUN_ID, RUN_TOKEN; None when unset
    client.start()
    client.log("train/loss", step, loss)
    client.finish("finished")
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import logging
import math
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

logger = logging.getLogger("marin_client")

MAX_POINTS_PER_REQUEST = 1000
MAX_BYTES_PER_REQUEST = 1_000_000
MAX_QUEUED_POINTS = 500_000
RETRIABLE_STATUS = {408, 425, 429, 500, 502, 503, 504}
# The site refuses the run itself (token, run over, attempt superseded): nothing later can
# be taken either, so everything goes to the spill file from then on.
RUN_REFUSED_STATUS = {401, 403, 404, 409, 410}
BATCH_OVERHEAD = len('{"points": []}')
SPILL_HEADER = "marin-site-client spill"

# Why a point is in the spill file. The first two are passing: a client replays them as soon
# as the site answers again; the others wait for the next start or the replay command.
UNREACHABLE = "site unreachable"
QUEUE_FULL = "queue full"
CLOSED = "logged after close"
PASSING = (UNREACHABLE, QUEUE_FULL)


class RunClientError(Exception):
    """The server refused a request for a reason retrying will not fix."""


class Point(NamedTuple):
    key: str
    step: int
    value: float
    time: float

    def as_json(self) -> str:
        value = self.value
        text = repr(value) if math.isfinite(value) else _NOT_FINITE[str(value)]
        return (
            f'{{"key": {_key_json(self.key)}, "step": {self.step}, '
            f'"value": {text}, "time": {self.time!r}}}'
        )


# A non-finite value is sent as JavaScript's literal: the site opens its divergence alert on
# it, then refuses that key's points (they go to the spill file with the site's reason).
_NOT_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


_KEY_JSON: dict[str, str] = {}


def _key_json(key: str) -> str:
    """A key as JSON text, kept: a run logs the same few thousand keys every step."""
    text = _KEY_JSON.get(key)
    if text is None:
        text = json.dumps(key)
        if len(_KEY_JSON) < 100_000:
            _KEY_JSON[key] = text
    return text


@dataclass
class ReplayReport:
    """What a replay of a spill file did."""

    path: str
    sent: int = 0
    respilled: int = 0  # back in the spill file (refused, another run's, site away)
    waiting: int = 0  # not delivered yet: left to the sender thread
    reports: int = 0  # config, summary and artifact reports taken from the file
    unusable: collections.Counter[str] = field(default_factory=collections.Counter)
    cut: str = ""  # the last line when the file ends in the middle of one

    def describe(self) -> str:
        parts = [f"{self.path}: {self.sent} points sent"]
        if self.reports:
            parts.append(f"{self.reports} reports (config, summary, artifacts) sent again")
        if self.respilled:
            parts.append(f"{self.respilled} back in the spill file")
        if self.waiting:
            parts.append(f"{self.waiting} waiting for the site")
        for reason, count in sorted(self.unusable.items()):
            parts.append(f"{count} not sendable ({reason})")
        if self.cut:
            parts.append(f"the file is cut in the middle of its last line ({self.cut[:80]!r})")
        return "; ".join(parts)


def _number_text(value: Any) -> Any:
    """A value for the spill file: finite numbers as they are, the rest as text ("nan")."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return repr(value)[:100]


class RunClient:
    def __init__(
        self,
        *,
        api_url: str,
        run_id: int | str,
        token: str,
        max_points: int = MAX_POINTS_PER_REQUEST,
        max_bytes: int = MAX_BYTES_PER_REQUEST,
        max_queued: int = MAX_QUEUED_POINTS,
        flush_interval: float = 2.0,
        heartbeat_interval: float = 15.0,
        retry_for: float = 30.0,
        request_timeout: float = 10.0,
        spill_path: Path | str | None = None,
        replay_spill: bool = True,
    ) -> None:
        self.api_url = api_url.rstrip("/") + "/"
        self.run_id = str(run_id)
        self.base = f"{self.api_url}runs/{run_id}/"
        self.token = token
        self.max_points = max_points
        self.max_bytes = max_bytes
        self.max_queued = max_queued
        self.flush_interval = flush_interval
        self.heartbeat_interval = heartbeat_interval
        self.retry_for = retry_for  # how long close/finish keep trying before they spill
        self.request_timeout = request_timeout
        self.spill_path = Path(spill_path or "unsent_metrics.jsonl")
        self.replay_spill = replay_spill
        self.cancel_requested = False
        self.requests_sent = 0
        # sent, and every reason a point was spilled ("spilled: <reason>")
        self.stats: collections.Counter[str] = collections.Counter()
        self.refused_keys: dict[str, str] = {}
        self.flagged_keys: dict[str, str] = {}
        self.replays: list[ReplayReport] = []
        self.in_spill = 0  # points this client wrote to the spill file and did not take back
        # The training thread appends to the queue; only the sender takes from it. Items are
        # (key, step, value, time) or (metrics, step, time) from log_many.
        self._queue: collections.deque[tuple[Any, ...]] = collections.deque()
        self._queued = 0  # points put in (the training thread's count)
        self._taken = 0  # points taken out (the sender's count)
        self._buffer: list[Point] = []  # checked, waiting to be sent; the sender's own
        self._send_lock = threading.Lock()
        self._spill_lock = threading.Lock()
        self._spill_header_written = False
        self._spilled_passing = 0  # points spilled for a passing reason since the last replay
        self._run_refusal = ""  # set when the site refuses the run itself
        self._backoff = flush_interval
        self._report: dict[str, Any] = {}  # config, summary, artifacts not yet sent
        self._report_lock = threading.Lock()
        self._last_refused = ""
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    @classmethod
    def from_env(cls, **kwargs: Any) -> RunClient | None:
        url, run_id, token = (os.environ.get(n) for n in ("RUN_API_URL", "RUN_ID", "RUN_TOKEN"))
        if not (url and run_id and token):
            return None
        return cls(api_url=url, run_id=run_id, token=token, **kwargs)

    # --- logging: the training thread ------------------------------------------------------

    def log(self, key: str, step: int, value: float, at: float | None = None) -> None:
        """Queue one point. Never blocks, never raises: the sender thread checks it."""
        try:
            if self._closed or self._queued - self._taken >= self.max_queued:
                at = time.time() if at is None else at
                self._spill_items([(key, step, value, at)], CLOSED if self._closed else QUEUE_FULL)
                return
            self._queue.append((key, step, value, time.time() if at is None else at))
            self._queued += 1
            if self._queued - self._taken >= self.max_points and self._thread is not None:
                self._wake.set()
        except Exception:
            self.stats["lost: client error"] += 1
            logger.exception("marin-site client: could not queue %r", key)

    def log_many(self, metrics: Mapping[str, Any], step: int, at: float | None = None) -> None:
        """Queue one step's metrics (one queue item, whatever the number of keys)."""
        try:
            count = len(metrics)
            item = (dict(metrics), step, time.time() if at is None else at)
            if self._closed or self._queued - self._taken + count > self.max_queued:
                self._spill_items([item], CLOSED if self._closed else QUEUE_FULL)
                return
            self._queue.append(item)
            self._queued += count
            if self._queued - self._taken >= self.max_points and self._thread is not None:
                self._wake.set()
        except Exception:
            self.stats["lost: client error"] += 1
            logger.exception("marin-site client: could not queue step %r", step)

    @property
    def pending(self) -> int:
        """Points logged and not yet delivered or spilled."""
        return self._queued - self._taken + len(self._buffer)

    # --- checking and spilling: the sender -------------------------------------------------

    def _points(self, item: tuple[Any, ...]) -> Iterable[tuple[Any, Any, Any, Any]]:
        if len(item) == 3:
            metrics, step, at = item
            return ((key, step, value, at) for key, value in metrics.items())
        return (item,)

    def _check(self, key: Any, step: Any, value: Any, at: Any) -> Point | str:
        """A point, or the reason it cannot be sent."""
        if (
            type(key) is str
            and type(step) is int
            and type(value) is float
            and type(at) is float
            and key
        ):
            return Point(key, step, value, at)
        if not isinstance(key, str) or not key:
            return "key is not a non-empty string"
        if isinstance(step, bool) or isinstance(value, bool):
            return "a boolean, not a number"
        if isinstance(value, str | bytes):
            return "value is not a number"
        try:
            step = int(step)
        except (TypeError, ValueError, OverflowError):
            return "step is not an integer"
        try:
            value = float(value)
        except (TypeError, ValueError, OverflowError):
            return "value is not a number"
        try:
            at = float(at)
        except (TypeError, ValueError):
            at = time.time()
        return Point(key, step, value, at)

    def _drain(self) -> None:
        """Move what the training thread queued into the send buffer, checked."""
        bad: dict[str, list[tuple[Any, ...]]] = {}
        while True:
            try:
                item = self._queue.popleft()
            except IndexError:
                break
            if len(item) == 3 and type(item[1]) is int and type(item[2]) is float:
                # log_many's step: one check of step and time, then the fast path per key
                metrics, step, at = item
                append = self._buffer.append
                self._taken += len(metrics)
                for key, value in metrics.items():
                    if type(key) is str and type(value) is float and key:
                        append(Point(key, step, value, at))
                    else:
                        checked = self._check(key, step, value, at)
                        if isinstance(checked, Point):
                            append(checked)
                        else:
                            bad.setdefault(checked, []).append((key, step, value, at))
                continue
            for raw in self._points(item):
                self._taken += 1
                checked = self._check(*raw)
                if isinstance(checked, Point):
                    self._buffer.append(checked)
                else:
                    bad.setdefault(checked, []).append(raw)
        for reason, raws in bad.items():
            self._spill_items(raws, reason)
        if self._run_refusal and self._buffer:
            self._spill_points(self._buffer, self._run_refusal)
            self._buffer = []
        elif len(self._buffer) > self.max_queued:
            over = len(self._buffer) - self.max_queued
            self._spill_points(self._buffer[:over], UNREACHABLE)
            del self._buffer[:over]

    def _spill_items(self, items: list[tuple[Any, ...]], reason: str) -> None:
        """Raw queue items (possibly log_many's) to the spill file."""
        lines = []
        for item in items:
            for key, step, value, at in self._points(item):
                lines.append(
                    {
                        "key": str(key)[:300],
                        "step": _number_text(step),
                        "value": _number_text(value),
                        "time": _number_text(at),
                        "reason": reason,
                    }
                )
        self._spill_lines(lines, reason)

    def _spill_points(self, points: list[Point], reason: str) -> None:
        lines = [
            {
                "key": p.key,
                "step": p.step,
                "value": _number_text(p.value),
                "time": p.time,
                "reason": reason,
            }
            for p in points
        ]
        self._spill_lines(lines, reason)

    def _spill_lines(self, lines: list[dict[str, Any]], reason: str) -> None:
        if not lines:
            return
        try:
            with self._spill_lock:
                with self.spill_path.open("a", encoding="utf-8") as spill:
                    if not self._spill_header_written:
                        header = {
                            "spill": SPILL_HEADER,
                            "api_url": self.api_url,
                            "run_id": self.run_id,
                        }
                        spill.write(json.dumps(header) + "\n")
                        self._spill_header_written = True
                    spill.writelines(json.dumps(line, allow_nan=False) + "\n" for line in lines)
                if reason in PASSING:
                    self._spilled_passing += len(lines)
                self.in_spill += len(lines)
            self.stats[f"spilled: {reason}"] += len(lines)
        except (OSError, ValueError, TypeError):
            self.stats[f"lost: {reason} (spill file not writable)"] += len(lines)
            logger.exception(
                "marin-site client: could not write %d points to %s", len(lines), self.spill_path
            )

    # --- sending ---------------------------------------------------------------------------

    def _batch(self, points: list[Point]) -> list[str]:
        """The next request's points from the front of ``points``, as JSON texts (the
        sender's hot loop: a step's points share their step and time)."""
        texts: list[str] = []
        size = BATCH_OVERHEAD
        keys, isfinite = _KEY_JSON, math.isfinite
        last_at: float | None = None
        tail = ""
        for key, step, value, at in points[: self.max_points]:
            key_text = keys.get(key) or _key_json(key)
            value_text = repr(value) if isfinite(value) else _NOT_FINITE[str(value)]
            if at != last_at:
                last_at, tail = at, f', "time": {at!r}}}'
            text = f'{{"key": {key_text}, "step": {step}, "value": {value_text}{tail}'
            size += len(text) + 2
            if size > self.max_bytes and texts:
                break
            texts.append(text)
        return texts

    def _send_buffer(self, deadline: float | None) -> bool:
        """Send the buffer; True when empty. With a deadline, retry until it; without, stop at
        the first passing failure (the sender loop backs off and calls again)."""
        delay = 0.2
        while self._buffer:
            if self._run_refusal:
                self._spill_points(self._buffer, self._run_refusal)
                self._buffer = []
                return True
            texts = self._batch(self._buffer)
            count = len(texts)
            left, wait = self._send_batch(self._buffer[:count], texts)
            self._buffer[:count] = left
            if not left:
                delay = 0.2
                continue
            wait = max(wait, delay)
            if deadline is None or time.monotonic() + wait > deadline or self._stop_sending():
                self._backoff = wait
                return False
            time.sleep(wait)
            delay = min(delay * 2, 5.0)
        return True

    def _stop_sending(self) -> bool:
        return self._stop.is_set() and threading.current_thread() is self._thread

    def _send_batch(
        self, batch: list[Point], texts: list[str] | None = None
    ) -> tuple[list[Point], float]:
        """Send one batch: (what is left to send, how long to wait before trying again).
        Nothing is left when the site took the batch or refused it for good (its points
        spilled with the reason)."""
        if texts is None:
            texts = [p.as_json() for p in batch]
        body = ('{"points": [' + ", ".join(texts) + "]}").encode()
        try:
            answer = self._post("metrics/", body)
        except urllib.error.HTTPError as exc:
            detail = _detail(exc)
            if exc.code in RETRIABLE_STATUS:
                return batch, _retry_after(exc)
            if exc.code in RUN_REFUSED_STATUS:
                self._run_refusal = f"run refused by the site ({exc.code}): {detail}"
                logger.error(
                    "marin-site client: the site refuses run %s (%s: %s); points go to %s",
                    self.run_id,
                    exc.code,
                    detail,
                    self.spill_path,
                )
                self._spill_points(batch, self._run_refusal)
                return [], 0.0
            keys = list(dict.fromkeys(p.key for p in batch))
            if len(batch) > 1:
                # One bad key must not cost the others: send again key by key, then a key's
                # points in halves, down to the points the site refuses.
                if len(keys) > 1:
                    groups = [[p for p in batch if p.key == key] for key in keys]
                else:
                    groups = [batch[: len(batch) // 2], batch[len(batch) // 2 :]]
                for index, group in enumerate(groups):
                    left, wait = self._send_batch(group)
                    if left:
                        return left + [p for g in groups[index + 1 :] for p in g], wait
                return [], 0.0
            reason = f"refused by the site ({exc.code}): {_short(detail)}"
            self._note_key(self.refused_keys, keys[0], batch[0].step, reason, "refused")
            self._spill_points(batch, reason)
            return [], 0.0
        except (urllib.error.URLError, OSError, ValueError):
            return batch, 0.0
        self.stats["sent"] += len(batch)
        self._read_answer(answer, batch)
        return [], 0.0

    def _read_answer(self, answer: dict[str, Any], batch: list[Point]) -> None:
        """The per-key lists of a 2xx answer: refused keys' points are spilled, flagged keys
        logged (the site stored them), each key once."""
        for kind, seen in (("refused", self.refused_keys), ("flagged", self.flagged_keys)):
            for key, reason, first_step, count in _key_list(answer.get(kind)):
                self._note_key(seen, key, first_step, reason, kind)
                if kind == "refused":
                    points = _refused_points([p for p in batch if p.key == key], count)
                    self.stats["sent"] -= len(points)
                    self._spill_points(points, f"refused by the site: {reason}")

    def _note_key(
        self, seen: dict[str, str], key: str, first_step: Any, reason: str, kind: str
    ) -> None:
        if key in seen:
            return
        seen[key] = reason
        logger.warning(
            "marin-site %s %s from step %s: %s%s",
            kind,
            key,
            first_step,
            reason,
            f" (its points go to {self.spill_path})" if kind == "refused" else "",
        )

    def flush(self, *, retry_for: float | None = None) -> bool:
        """Send everything logged so far, retrying up to ``retry_for`` seconds (default
        ``self.retry_for``); True when nothing is left waiting. Never raises."""
        try:
            with self._send_lock:
                self._drain()
                budget = self.retry_for if retry_for is None else retry_for
                deadline = time.monotonic() + budget
                return self._send_buffer(deadline) and self._send_report(deadline)
        except Exception:
            logger.exception("marin-site client: flush failed")
            return False

    # --- the other doors -------------------------------------------------------------------

    def heartbeat(self) -> bool:
        answer = self._post("heartbeat/", b"{}")
        self.cancel_requested = bool(answer.get("cancel_requested"))
        return True

    def status(self, state: str, *, failure_kind: str = "", message: str = "") -> bool:
        body = json.dumps({"state": state, "failure_kind": failure_kind, "message": message[:2000]})
        return self._post_with_retry("status/", body.encode(), time.monotonic() + self.retry_for)

    def report(
        self,
        *,
        config: dict[str, Any] | None = None,
        summary: dict[str, float] | None = None,
        artifacts: list[dict[str, str]] | None = None,
    ) -> bool:
        """What a tracker reports besides points: the config it saw (merged into the run's
        reported config), a summary (finite numbers), artifacts as links ({uri, name, type}).
        Queued like points, never blocking: reports not yet sent merge into one (the site
        merges them the same way), which the sender thread delivers (``close`` at the
        latest, else it goes to the spill file). True when it is queued. Never raises."""
        try:
            if summary is not None:
                summary = {k: float(v) for k, v in summary.items() if _finite(v)}
            body = {"config": config, "summary": summary, "artifacts": artifacts}
            json.dumps(body, default=str, allow_nan=False)  # refused here, not in the thread
        except (TypeError, ValueError, OverflowError) as exc:
            logger.warning("marin-site client: report not sent, not JSON: %s", exc)
            return False
        with self._report_lock:
            _merge_report(self._report, body)
        if self._closed and not self._send_report(time.monotonic() + self.retry_for):
            with self._report_lock:
                pending, self._report = self._report, {}
            self._spill_report(pending, UNREACHABLE)
        return True

    def _send_report(self, deadline: float | None) -> bool:
        """Send the pending report; True when there is none left. On a passing failure it
        stays pending (merged with later ones)."""
        with self._report_lock:
            body, self._report = self._report, {}
        if not body:
            return True
        data = json.dumps(body, default=str, allow_nan=False).encode()
        if self._post_with_retry("report/", data, deadline, quiet=deadline is None):
            return True
        if self._last_refused:  # refused for good: kept in the spill file, not retried
            self._spill_report(body, self._last_refused)
            return True
        with self._report_lock:
            later, self._report = self._report, body
            _merge_report(self._report, later)
        return False

    def _spill_report(self, body: dict[str, Any], reason: str) -> None:
        line = {"report": json.loads(json.dumps(body, default=str)), "reason": reason}
        self._spill_lines([line], reason)

    def artifact(self, kind: str, uri: str, *, name: str = "", step: int | None = None) -> bool:
        """Report a link: ``wandb`` (the W&B run), ``checkpoint`` (e.g. gs://...), ``link``."""
        body = json.dumps({"kind": kind, "uri": uri, "name": name, "step": step}).encode()
        return self._post_with_retry("artifacts/", body, time.monotonic() + self.retry_for)

    def report_config(self, config: dict[str, Any]) -> bool:
        """Say which config the job really used; False when it is not the plan's (the site
        keeps its hash and flags the run)."""
        body = json.dumps({"config": config}).encode()
        answer = self._post("config/", body)
        return bool(answer.get("matches_plan"))

    def import_tracker_metrics(self, jsonl: str) -> bool:
        """Send a ``tracker_metrics.jsonl`` (config and summary) as the run's final summary."""
        body = json.dumps({"jsonl": jsonl}).encode()
        return self._post_with_retry("tracker-metrics/", body, time.monotonic() + self.retry_for)

    def _post(self, path: str, body: bytes) -> dict[str, Any]:
        request = urllib.request.Request(  # noqa: S310  (the URL is the site's own API)
            self.base + path,
            data=body,
            method="POST",
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        self.requests_sent += 1
        with urllib.request.urlopen(request, timeout=self.request_timeout) as response:  # noqa: S310
            text = response.read().decode() or "{}"
        answer = json.loads(text)
        return answer if isinstance(answer, dict) else {}

    def _post_with_retry(
        self, path: str, body: bytes, deadline: float | None, *, quiet: bool = False
    ) -> bool:
        """POST until the site takes it or the deadline passes (None: once); a refusal is
        logged, not raised (reporting must never stop training), and kept in
        ``_last_refused``."""
        delay = 0.2
        self._last_refused = ""
        while True:
            try:
                self._post(path, body)
                return True
            except urllib.error.HTTPError as exc:
                if exc.code not in RETRIABLE_STATUS:
                    detail = _short(_detail(exc))
                    self._last_refused = f"refused by the site ({exc.code}): {detail}"
                    logger.warning(
                        "marin-site client: %s refused with %s: %s", path, exc.code, detail
                    )
                    return False
                wait = max(_retry_after(exc), delay)
            except (urllib.error.URLError, OSError, ValueError):
                wait = delay
            if deadline is None or time.monotonic() + wait > deadline:
                if not quiet:
                    logger.warning("marin-site client: %s not delivered, the site is away", path)
                return False
            time.sleep(wait)
            delay = min(delay * 2, 5.0)

    # --- the background thread and the end -------------------------------------------------

    def start(self) -> None:
        """Start the sender thread; it first replays this run's spill file, if any."""
        if self._thread is not None or self._closed:
            return
        self._thread = threading.Thread(target=self._loop, name="marin-site-client", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        if self.replay_spill:
            self._replay_own(passing_only=False)
        last_heartbeat = 0.0
        wait = self.flush_interval
        while not self._stop.is_set():
            self._wake.wait(wait)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                if time.monotonic() - last_heartbeat >= self.heartbeat_interval:
                    with contextlib.suppress(urllib.error.URLError, OSError, ValueError):
                        self.heartbeat()
                    last_heartbeat = time.monotonic()
                with self._send_lock:
                    self._drain()
                    self._backoff = self.flush_interval
                    sent = self._send_buffer(None) and self._send_report(None)
                wait = self.flush_interval if sent else min(self._backoff, self.flush_interval * 5)
                if sent and self._spilled_passing and self.replay_spill:
                    self._replay_own(passing_only=True)
            except Exception:
                logger.exception("marin-site client: the sender thread hit an error")
                wait = self.flush_interval

    def _replay_own(self, *, passing_only: bool) -> None:
        """Send this run's points from the spill file: at start all of them (the site may
        take now what it refused before), after the site came back the ones spilled while
        it was away."""
        if not self.spill_path.exists():
            return
        try:
            with self._send_lock:
                report = replay_file(self, self.spill_path, passing_only=passing_only)
        except Exception:
            logger.exception("marin-site client: replaying %s failed", self.spill_path)
            return
        self.replays.append(report)
        if report.sent or report.respilled or report.unusable or report.cut:
            logger.warning("marin-site client: replayed %s", report.describe())

    def close(self) -> bool:
        """Stop the thread and deliver what is left, trying for ``retry_for`` seconds, then
        spill the rest. No status is reported, so the executor's view of how the job ended
        decides. True when everything arrived. Never raises; a second call does nothing."""
        if self._closed:
            return not self.pending
        self._closed = True
        try:
            self._stop.set()
            self._wake.set()
            if self._thread is not None:
                self._thread.join(timeout=self.request_timeout + 5)
            with self._send_lock:
                self._drain()
                deadline = time.monotonic() + self.retry_for
                delivered = self._send_buffer(deadline)
                if not delivered:
                    self._spill_points(self._buffer, UNREACHABLE)
                    self._buffer = []
                if not self._send_report(deadline if delivered else None):
                    with self._report_lock:
                        body, self._report = self._report, {}
                    self._spill_report(body, UNREACHABLE)
                    delivered = False
            self._log_outcome()
            lost = any(k.startswith("lost") for k in self.stats)
            return delivered and not lost and self.in_spill == 0
        except Exception:
            logger.exception("marin-site client: close failed")
            return False

    def _log_outcome(self) -> None:
        unsent = {k: v for k, v in self.stats.items() if k not in ("sent", "replayed") and v}
        if not unsent:
            logger.info(
                "marin-site client: %d points sent to run %s", self.stats["sent"], self.run_id
            )
            return
        logger.warning(
            "marin-site client: %d points sent to run %s; %d in %s (%s%s)",
            self.stats["sent"],
            self.run_id,
            self.in_spill,
            self.spill_path,
            ", ".join(f"{v} {k}" for k, v in sorted(unsent.items())),
            f"; {self.stats['replayed']} replayed from it" if self.stats["replayed"] else "",
        )

    def finish(self, state: str = "finished", *, failure_kind: str = "", message: str = "") -> bool:
        """Stop the thread, deliver what is left (or spill it), then report the final status.
        Never raises."""
        delivered = self.close()
        try:
            self.status(state, failure_kind=failure_kind, message=message)
        except Exception:
            logger.exception("marin-site client: the final status was not sent")
        return delivered


def _detail(exc: urllib.error.HTTPError) -> str:
    try:
        return exc.read().decode(errors="replace")[:500]
    except (OSError, ValueError):
        return ""


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(value)
    except TypeError:
        return False


def _merge_report(into: dict[str, Any], body: dict[str, Any]) -> None:
    """Fold a report into a pending one as the site folds them into the run: config and
    summary keys updated, artifacts added."""
    for part in ("config", "summary"):
        if body.get(part) is not None:
            into.setdefault(part, {}).update(body[part])
    if body.get("artifacts"):
        into.setdefault("artifacts", []).extend(body["artifacts"])


def _short(detail: str) -> str:
    """The words of a refusal ({"detail": ...} or a DRF field list), on one line."""
    try:
        data = json.loads(detail)
    except ValueError:
        return detail.strip()[:300]
    if isinstance(data, dict) and len(data) == 1:
        data = next(iter(data.values()))
    if isinstance(data, list) and data:
        data = data[0] if len(data) == 1 else "; ".join(str(x) for x in data[:3])
    return str(data)[:300]


def _retry_after(exc: urllib.error.HTTPError) -> float:
    value = (exc.headers.get("Retry-After") or "").strip() if exc.headers else ""
    try:
        return min(max(float(value), 0.0), 60.0)
    except ValueError:
        return 0.0


def _refused_points(points: list[Point], count: Any) -> list[Point]:
    """Which of a key's points the site refused, when it stored the others: the site keeps
    every finite value and says how many it refused (``points``); when that is the number of
    non-finite values here, those are they. Otherwise (a key or a step the site refused for
    its own reasons, or an answer without the count) all of the key's points are taken as
    refused: spilling a stored point costs nothing, a replay upserts it again."""
    not_finite = [p for p in points if not math.isfinite(p.value)]
    if type(count) is int and count == len(not_finite):
        return not_finite
    return points


def _key_list(entries: Any) -> list[tuple[str, str, Any, Any]]:
    """(key, reason, first step, points) from an answer's ``refused`` or ``flagged``: a list
    of ``{key, reason, first_step, points}`` objects, or an object keyed by metric key."""
    out: list[tuple[str, str, Any, Any]] = []
    if isinstance(entries, dict):
        entries = [
            {"key": key, **(value if isinstance(value, dict) else {"reason": value})}
            for key, value in entries.items()
        ]
    if not isinstance(entries, list):
        return out
    for entry in entries:
        if isinstance(entry, dict) and isinstance(entry.get("key"), str):
            reason = entry.get("reason", entry.get("detail", ""))
            first = entry.get("first_step", entry.get("step"))
            out.append((entry["key"], str(reason)[:500], first, entry.get("points")))
    return out


# --- replaying a spill file ------------------------------------------------------------------


def read_spill(data: bytes, report: ReplayReport) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(header, line) for every readable point line. A last line without its newline is the
    cut of a file written when the process died: reported, not read."""
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    if tail.strip():
        report.cut = tail.decode(errors="replace")
    header: dict[str, Any] = {}
    out = []
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except ValueError:
            report.unusable[f"line {number} is not JSON"] += 1
            continue
        if not isinstance(line, dict):
            report.unusable["a line that is not a point"] += 1
        elif line.get("spill") == SPILL_HEADER:
            header = line
        else:
            out.append((header, line))
    return out


def replay_file(
    client: RunClient, path: Path, *, passing_only: bool = False, retry_for: float | None = None
) -> ReplayReport:
    """Send a spill file's points of ``client``'s run through ``client``, trying for
    ``retry_for`` seconds (None: once, the sender thread tries again later). Other runs'
    points, and with ``passing_only`` the refused ones, go back to ``client.spill_path``;
    points still not delivered stay in the client's buffer. The caller holds the client's
    send lock, or owns the client."""
    report = ReplayReport(str(path))
    taking = path.with_name(f"{path.name}.replaying-{os.getpid()}")
    with client._spill_lock:
        path.rename(taking)
        client._spilled_passing = 0
        client._spill_header_written = False
    keep: list[tuple[dict[str, Any], dict[str, Any]]] = []
    points: list[Point] = []
    for header, line in read_spill(taking.read_bytes(), report):
        ours = not header or (
            str(header.get("run_id")) == client.run_id
            and str(header.get("api_url", client.api_url)).rstrip("/") == client.api_url.rstrip("/")
        )
        if not ours or (passing_only and str(line.get("reason", "")) not in PASSING):
            keep.append((header, line))
            continue
        if isinstance(line.get("report"), dict):
            with client._report_lock:
                _merge_report(client._report, line["report"])
            report.reports += 1
            continue
        value = line.get("value")
        if value in _NOT_FINITE:  # spilled as text: JSON has no NaN
            value = float(value)
        checked = client._check(line.get("key"), line.get("step"), value, line.get("time", 0))
        if isinstance(checked, Point):
            points.append(checked)
        else:
            report.unusable[checked] += 1
    _write_back(client, keep)
    client.in_spill = max(0, client.in_spill - len(points) - report.unusable.total())
    client.stats["replayed"] += len(points)
    sent_before = client.stats["sent"]
    spilled_before = _spilled(client)
    client._buffer[:0] = points
    deadline = None if retry_for is None else time.monotonic() + retry_for
    if client._send_buffer(deadline) and report.reports:
        client._send_report(deadline)
    report.sent = client.stats["sent"] - sent_before
    report.respilled = len(keep) + _spilled(client) - spilled_before
    report.waiting = len(client._buffer)
    taking.unlink()
    return report


def _spilled(client: RunClient) -> int:
    return sum(v for k, v in client.stats.items() if k.startswith("spilled"))


def _write_back(client: RunClient, kept: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
    if not kept:
        return
    with client._spill_lock, client.spill_path.open("a", encoding="utf-8") as spill:
        current: dict[str, Any] | None = None
        for header, line in kept:
            if header and header is not current:
                spill.write(json.dumps(header) + "\n")
                current = header
            spill.write(json.dumps(line) + "\n")


# --- the command: marin-site-client replay FILE -----------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="marin-site-client",
        description="Tools of marin-site's run client.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    replay = commands.add_parser(
        "replay",
        help="send the points of a spill file (unsent_metrics.jsonl) to the site",
        description="Send a spill file's points to their run. The run and the site come from "
        "the file's header unless given; the token from $RUN_TOKEN (or --token-env). What is "
        "still not taken stays in the file.",
    )
    replay.add_argument("file", type=Path)
    replay.add_argument("--api-url", default=None, help="the site's API, e.g. https://SITE/api/v1/")
    replay.add_argument("--run-id", default=None)
    replay.add_argument("--token-env", default="RUN_TOKEN", help="the variable holding the token")
    replay.add_argument("--retry-for", type=float, default=30.0, help="seconds to keep trying")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")

    path: Path = args.file
    if not path.is_file():
        sys.stderr.write(f"marin-site-client: no file {path}\n")
        return 2
    header: dict[str, Any] = {}
    probe = ReplayReport(str(path))
    for first, _ in read_spill(path.read_bytes(), probe):
        header = first
        if header:
            break
    api_url = args.api_url or header.get("api_url") or os.environ.get("RUN_API_URL", "")
    run_id = args.run_id or header.get("run_id") or os.environ.get("RUN_ID", "")
    token = os.environ.get(args.token_env, "")
    missing = [
        n
        for n, v in (("--api-url", api_url), ("--run-id", run_id), (args.token_env, token))
        if not v
    ]
    if missing:
        sys.stderr.write(f"marin-site-client: replay needs {', '.join(missing)}\n")
        return 2
    client = RunClient(
        api_url=api_url,
        run_id=run_id,
        token=token,
        retry_for=args.retry_for,
        spill_path=path,
        replay_spill=False,
    )
    report = replay_file(client, path, retry_for=args.retry_for)
    if client._buffer:
        client._spill_points(client._buffer, UNREACHABLE)
        report.respilled += len(client._buffer)
        report.waiting = 0
        client._buffer = []
    if client._report:
        client._spill_report(client._report, UNREACHABLE)
        report.respilled += 1
    sys.stdout.write(report.describe() + "\n")
    for key, reason in client.refused_keys.items():
        sys.stdout.write(f"refused {key}: {reason}\n")
    for key, reason in client.flagged_keys.items():
        sys.stdout.write(f"flagged {key}: {reason}\n")
    return 0 if not (report.respilled or report.unusable or report.cut) else 1


if __name__ == "__main__":
    sys.exit(main())
