"""The runner client against a local fake server speaking the metrics API's protocol."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from marin_client.client import RunClient, RunClientError


class FakeApi:
    """Records what arrives; answers ``fail_next`` requests with 503 first."""

    def __init__(self) -> None:
        self.points: dict[tuple[str, int], float] = {}
        self.requests: list[tuple[str, int, int]] = []  # path, points, bytes
        self.fail_next = 0
        self.status: list[dict[str, Any]] = []
        self.lock = threading.Lock()


@pytest.fixture
def fake() -> Iterator[tuple[FakeApi, ThreadingHTTPServer]]:
    api = FakeApi()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            with api.lock:
                if self.headers["Authorization"] != "Bearer t0k":
                    self.send_response(403)
                    self.end_headers()
                    return
                if api.fail_next > 0:
                    api.fail_next -= 1
                    self.send_response(503)
                    self.send_header("Retry-After", "0")
                    self.end_headers()
                    return
                data = json.loads(body)
                points = data.get("points", [])
                api.requests.append((self.path, len(points), len(body)))
                for p in points:
                    api.points[(p["key"], p["step"])] = p["value"]
                if self.path.endswith("/status/"):
                    api.status.append(data)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"cancel_requested": false}')

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield api, server
    server.shutdown()
    server.server_close()


def client_for(server: ThreadingHTTPServer, tmp_path: Path, **kwargs: Any) -> RunClient:
    host, port = server.server_address[:2]
    return RunClient(
        api_url=f"http://{host!s}:{port}/api/v1/",
        run_id=9,
        token="t0k",
        spill_path=tmp_path / "unsent.jsonl",
        **kwargs,
    )


def test_batches_hold_at_most_1000_points(fake: Any, tmp_path: Path) -> None:
    api, server = fake
    client = client_for(server, tmp_path)
    for step in range(2500):
        client.log("train/loss", step, 1.0 / (step + 1))
    assert client.flush()
    metric_requests = [r for r in api.requests if r[0].endswith("/metrics/")]
    assert [r[1] for r in metric_requests] == [1000, 1000, 500]
    assert len(api.points) == 2500


def test_batches_split_at_one_megabyte(fake: Any, tmp_path: Path) -> None:
    api, server = fake
    client = client_for(server, tmp_path, max_points=10_000)
    for step in range(4500):
        client.log("k" * 190 + "/x", step, 0.5)
    assert client.flush()
    assert all(size <= 1_000_000 for _, _, size in api.requests)
    assert len(api.requests) == 2
    assert len(api.points) == 4500


def test_a_brief_outage_loses_no_points(fake: Any, tmp_path: Path) -> None:
    api, server = fake
    api.fail_next = 3
    client = client_for(server, tmp_path, retry_for=10)
    client.log_many({"train/loss": 2.0, "eval/loss": 2.5}, step=1)
    assert client.flush()
    assert api.points == {("train/loss", 1): 2.0, ("eval/loss", 1): 2.5}


def test_api_down_until_the_end_spills_points_to_a_file(tmp_path: Path) -> None:
    client = RunClient(
        api_url="http://127.0.0.1:9/api/v1/",  # nothing listens on the discard port
        run_id=9,
        token="t0k",
        retry_for=0.5,
        spill_path=tmp_path / "unsent.jsonl",
    )
    client.log("train/loss", 1, 3.0)
    assert client.finish("finished") is False
    spilled = [json.loads(x) for x in (tmp_path / "unsent.jsonl").read_text().splitlines()]
    assert [(p["key"], p["step"], p["value"]) for p in spilled] == [("train/loss", 1, 3.0)]


def test_background_thread_delivers_then_reports_status(fake: Any, tmp_path: Path) -> None:
    api, server = fake
    client = client_for(server, tmp_path, flush_interval=0.05)
    client.start()
    for step in range(50):
        client.log("train/loss", step, float(step))
    assert client.finish("finished")
    assert len(api.points) == 50
    assert api.status == [{"state": "finished", "failure_kind": "", "message": ""}]


def test_refused_token_is_an_error_not_a_retry(fake: Any, tmp_path: Path) -> None:
    _, server = fake
    client = client_for(server, tmp_path)
    client.token = "wrong"
    client.log("a", 1, 1.0)
    with pytest.raises(RunClientError, match="403"):
        client.flush()


def test_non_finite_values_are_refused_locally(tmp_path: Path) -> None:
    client = RunClient(api_url="http://127.0.0.1:9/", run_id=1, token="t")
    with pytest.raises(ValueError, match="finite"):
        client.log("train/loss", 3, float("nan"))
