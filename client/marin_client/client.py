"""The client a training job uses to report to marin-site: metrics, heartbeats, status.

Standard library only, so any training environment can import it. Points are buffered and
sent in batches of at most 1000 points or 1 MB (split automatically) by a background
thread; a failed request (API down, 5xx, 429) is retried with backoff, honouring
``Retry-After``, and its points stay buffered until the server has them. Whatever cannot
be delivered by ``finish`` is written to a spill file (``unsent_metrics.jsonl``) that can be
imported later, so no point is lost. Values must be finite: the API refuses NaN and
infinities, and so does ``log``.

    client = RunClient.from_env()     # RUN_API_URL, RUN_ID, RUN_TOKEN; None when unset
    client.start()
    client.log("train/loss", step, loss)
    client.finish("finished")
"""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_POINTS_PER_REQUEST = 1000
MAX_BYTES_PER_REQUEST = 1_000_000
RETRIABLE_STATUS = {408, 425, 429, 500, 502, 503, 504}


class RunClientError(Exception):
    """The server refused a request for a reason retrying will not fix."""


@dataclass(frozen=True)
class Point:
    key: str
    step: int
    value: float
    time: float

    def as_json(self) -> str:
        return json.dumps(
            {"key": self.key, "step": self.step, "value": self.value, "time": self.time},
            allow_nan=False,
        )


class RunClient:
    def __init__(
        self,
        *,
        api_url: str,
        run_id: int | str,
        token: str,
        max_points: int = MAX_POINTS_PER_REQUEST,
        max_bytes: int = MAX_BYTES_PER_REQUEST,
        flush_interval: float = 2.0,
        heartbeat_interval: float = 15.0,
        retry_for: float = 120.0,
        request_timeout: float = 10.0,
        spill_path: Path | None = None,
    ) -> None:
        self.base = f"{api_url.rstrip('/')}/runs/{run_id}/"
        self.token = token
        self.max_points = max_points
        self.max_bytes = max_bytes
        self.flush_interval = flush_interval
        self.heartbeat_interval = heartbeat_interval
        self.retry_for = retry_for
        self.request_timeout = request_timeout
        self.spill_path = spill_path or Path("unsent_metrics.jsonl")
        self.cancel_requested = False
        self.requests_sent = 0
        self._buffer: list[Point] = []
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_env(cls, **kwargs: Any) -> RunClient | None:
        import os

        url, run_id, token = (os.environ.get(n) for n in ("RUN_API_URL", "RUN_ID", "RUN_TOKEN"))
        if not (url and run_id and token):
            return None
        return cls(api_url=url, run_id=run_id, token=token, **kwargs)

    # --- logging -------------------------------------------------------------------------

    def log(self, key: str, step: int, value: float, at: float | None = None) -> None:
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"{key} at step {step} is {value}; only finite values are recorded")
        point = Point(key, int(step), value, time.time() if at is None else at)
        with self._lock:
            self._buffer.append(point)
            full = len(self._buffer) >= self.max_points
        if full and self._thread is None:
            self.flush(retry_for=self.retry_for)

    def log_many(self, metrics: dict[str, float], step: int) -> None:
        at = time.time()
        for key, value in metrics.items():
            self.log(key, step, value, at)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._buffer)

    # --- sending -------------------------------------------------------------------------

    def _batches(self, points: list[Point]) -> list[list[Point]]:
        batches: list[list[Point]] = []
        current: list[Point] = []
        size = len('{"points": []}')
        for point in points:
            point_size = len(point.as_json()) + 2
            if current and (len(current) >= self.max_points or size + point_size > self.max_bytes):
                batches.append(current)
                current, size = [], len('{"points": []}')
            current.append(point)
            size += point_size
        if current:
            batches.append(current)
        return batches

    def flush(self, *, retry_for: float | None = None) -> bool:
        """Send everything buffered; True when the server has it all."""
        with self._send_lock:
            with self._lock:
                points = list(self._buffer)
            deadline = time.monotonic() + (self.retry_for if retry_for is None else retry_for)
            for batch in self._batches(points):
                body = ('{"points": [' + ", ".join(p.as_json() for p in batch) + "]}").encode()
                if not self._post_with_retry("metrics/", body, deadline):
                    return False
                with self._lock:
                    del self._buffer[: len(batch)]  # only the sender thread removes points
            return True

    def heartbeat(self) -> bool:
        answer = self._post("heartbeat/", b"{}")
        self.cancel_requested = bool(answer.get("cancel_requested"))
        return True

    def status(self, state: str, *, failure_kind: str = "", message: str = "") -> None:
        body = json.dumps({"state": state, "failure_kind": failure_kind, "message": message[:2000]})
        self._post_with_retry("status/", body.encode(), time.monotonic() + self.retry_for)

    def report(
        self,
        *,
        config: dict[str, Any] | None = None,
        summary: dict[str, float] | None = None,
        artifacts: list[dict[str, str]] | None = None,
    ) -> bool:
        """What a tracker reports besides points: the config it saw (merged into the run's
        reported config), a summary (finite numbers), artifacts as links ({uri, name, type}).
        Retried like everything else; True when the server has it."""
        body: dict[str, Any] = {}
        if config is not None:
            body["config"] = config
        if summary is not None:
            body["summary"] = {k: float(v) for k, v in summary.items() if math.isfinite(v)}
        if artifacts:
            body["artifacts"] = artifacts
        if not body:
            return True
        data = json.dumps(body, default=str, allow_nan=False).encode()
        return self._post_with_retry("report/", data, time.monotonic() + self.retry_for)

    def artifact(self, kind: str, uri: str, *, name: str = "", step: int | None = None) -> None:
        """Report a link: ``wandb`` (the W&B run), ``checkpoint`` (e.g. gs://...), ``link``."""
        body = json.dumps({"kind": kind, "uri": uri, "name": name, "step": step}).encode()
        self._post_with_retry("artifacts/", body, time.monotonic() + self.retry_for)

    def report_config(self, config: dict[str, Any]) -> bool:
        """Say which config the job really used; False when it is not the plan's (the site
        keeps its hash and flags the run)."""
        body = json.dumps({"config": config}).encode()
        answer = self._post("config/", body)
        return bool(answer.get("matches_plan"))

    def import_tracker_metrics(self, jsonl: str) -> None:
        """Send a ``tracker_metrics.jsonl`` (config and summary) as the run's final summary."""
        body = json.dumps({"jsonl": jsonl}).encode()
        self._post_with_retry("tracker-metrics/", body, time.monotonic() + self.retry_for)

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

    def _post_with_retry(self, path: str, body: bytes, deadline: float) -> bool:
        delay = 0.2
        while True:
            try:
                self._post(path, body)
                return True
            except urllib.error.HTTPError as exc:
                if exc.code not in RETRIABLE_STATUS:
                    detail = exc.read().decode(errors="replace")[:500]
                    raise RunClientError(f"{path} refused with {exc.code}: {detail}") from exc
                retry_after = exc.headers.get("Retry-After")
                wait = float(retry_after) if retry_after and retry_after.isdigit() else delay
            except (urllib.error.URLError, OSError):
                wait = delay
            if time.monotonic() + wait > deadline:
                return False
            time.sleep(wait)
            delay = min(delay * 2, 5.0)

    # --- the background thread and the end -----------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="run-client", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        last_heartbeat = 0.0
        while not self._stop.wait(self.flush_interval):
            try:
                if time.monotonic() - last_heartbeat >= self.heartbeat_interval:
                    self.heartbeat()
                    last_heartbeat = time.monotonic()
                self.flush(retry_for=self.flush_interval * 5)
            except (RunClientError, urllib.error.URLError, OSError):
                pass

    def close(self) -> bool:
        """Stop the thread and deliver what is left (or spill it); no status is reported, so
        the executor's view of how the job ended decides. True when everything arrived."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        delivered = self.flush()
        if not delivered:
            with self._lock, self.spill_path.open("a") as spill:
                for point in self._buffer:
                    spill.write(point.as_json() + "\n")
        return delivered

    def finish(self, state: str = "finished", *, failure_kind: str = "", message: str = "") -> bool:
        """Stop the thread, deliver what is left (or spill it), then report the final status."""
        delivered = self.close()
        self.status(state, failure_kind=failure_kind, message=message)
        return delivered
