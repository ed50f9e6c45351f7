"""The run client against a local fake site speaking the metrics API's protocol: batching,
retries, the site away, refusals per key and of the whole batch, the spill file and its
replay. ``test_client_live.py`` runs it against the real site."""

from __future__ import annotations

import json
import logging
import math
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from marin_client import client as client_module
from marin_client.client import RunClient

BAD_KEY = "has a space"


class FakeApi:
    """Records what arrives. ``fail_next`` requests get a 503 first; ``answer_lists`` makes it
    answer as the per-key site does (2xx, refused and flagged keys listed); otherwise a batch
    with a key holding a space is refused whole with a 400, as the site once did."""

    def __init__(self) -> None:
        self.points: dict[tuple[str, int], float] = {}
        self.requests: list[tuple[str, int, int]] = []  # path, points, bytes
        self.fail_next = 0
        self.down = False  # every request answered 503
        self.answer_lists = False
        self.token = "t0k"
        self.status: list[dict[str, Any]] = []
        self.lock = threading.Lock()


def good(point: dict[str, Any]) -> bool:
    return " " not in point["key"] and math.isfinite(point["value"])


@pytest.fixture
def fake() -> Iterator[tuple[FakeApi, ThreadingHTTPServer]]:
    api = FakeApi()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def answer(self, code: int, body: dict[str, Any]) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            if code == 503:
                self.send_header("Retry-After", "0")
            self.end_headers()
            self.wfile.write(json.dumps(body).encode())

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            with api.lock:
                if self.headers["Authorization"] != f"Bearer {api.token}":
                    self.answer(403, {"detail": "This token does not belong to this run."})
                    return
                if api.down or api.fail_next > 0:
                    api.fail_next = max(0, api.fail_next - 1)
                    self.answer(503, {"detail": "away"})
                    return
                data = json.loads(body)
                points = data.get("points", [])
                api.requests.append((self.path, len(points), len(body)))
                bad = [p for p in points if not good(p)]
                if bad and not api.answer_lists:
                    self.answer(400, {"points": [f"{bad[0]['key']!r} is not a key"]})
                    return
                refused: list[dict[str, Any]] = []
                flagged: list[dict[str, Any]] = []
                for p in points:
                    if not good(p):
                        if p["key"] not in [r["key"] for r in refused]:
                            reason = "not a key" if " " in p["key"] else "not finite"
                            refused.append(
                                {"key": p["key"], "reason": reason, "first_step": p["step"]}
                            )
                        continue
                    if p["key"] == "moe/drop_fraction" and p["value"] > 1 and not flagged:
                        flagged.append(
                            {"key": p["key"], "reason": "above 1", "first_step": p["step"]}
                        )
                    api.points[(p["key"], p["step"])] = p["value"]
                if self.path.endswith("/status/"):
                    api.status.append(data)
            answer: dict[str, Any] = {"cancel_requested": False, "stored": len(points)}
            if api.answer_lists:
                answer.update(refused=refused, flagged=flagged)
            self.answer(200, answer)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield api, server
    server.shutdown()
    server.server_close()


def url_of(server: ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host!s}:{port}/api/v1/"


def client_for(server: ThreadingHTTPServer, tmp_path: Path, **kwargs: Any) -> RunClient:
    kwargs.setdefault("spill_path", tmp_path / "unsent.jsonl")
    return RunClient(api_url=url_of(server), run_id=9, token="t0k", **kwargs)


def spilled(path: Path) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    return [line for line in lines if "spill" not in line]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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


def test_background_thread_delivers_then_reports_status(fake: Any, tmp_path: Path) -> None:
    api, server = fake
    client = client_for(server, tmp_path, flush_interval=0.05)
    client.start()
    for step in range(50):
        client.log("train/loss", step, float(step))
    assert client.finish("finished")
    assert len(api.points) == 50
    assert api.status == [{"state": "finished", "failure_kind": "", "message": ""}]
    assert client.stats == {"sent": 50}


def test_site_down_until_the_end_spills_every_point_with_its_reason(tmp_path: Path) -> None:
    client = RunClient(
        api_url=f"http://127.0.0.1:{free_port()}/api/v1/",  # nothing listens
        run_id=9,
        token="t0k",
        retry_for=0.5,
        flush_interval=0.05,
        spill_path=tmp_path / "unsent.jsonl",
    )
    client.start()
    client.log("train/loss", 1, 3.0)
    client.log_many({"train/loss": 2.5, "eval/loss": 2.75}, step=2)
    assert client.finish("finished") is False  # never raises, the status too is not delivered
    lines = spilled(tmp_path / "unsent.jsonl")
    assert sorted((p["key"], p["step"], p["value"], p["reason"]) for p in lines) == [
        ("eval/loss", 2, 2.75, "site unreachable"),
        ("train/loss", 1, 3.0, "site unreachable"),
        ("train/loss", 2, 2.5, "site unreachable"),
    ]
    assert client.stats == {"spilled: site unreachable": 3}


def test_log_never_blocks_while_the_site_hangs(tmp_path: Path) -> None:
    """A site that accepts connections and never answers: the training loop does not wait."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    try:
        client = RunClient(
            api_url=f"http://127.0.0.1:{port}/api/v1/",
            run_id=9,
            token="t0k",
            flush_interval=0.01,
            request_timeout=2.0,
            retry_for=0.0,
            max_points=10,
            spill_path=tmp_path / "unsent.jsonl",
        )
        client.start()
        started = time.perf_counter()
        for step in range(200):
            client.log_many({f"k/{i}": float(i) for i in range(50)}, step)
        elapsed = time.perf_counter() - started
        assert elapsed < 1.0  # 10,000 points queued while a request hangs
        assert client.close() is False
        assert len(spilled(tmp_path / "unsent.jsonl")) == 10_000
    finally:
        listener.close()


def test_bad_values_are_spilled_and_counted_never_raised(fake: Any, tmp_path: Path) -> None:
    """What cannot be a point stays here; NaN and infinities go to the site (its divergence
    alert reads them), which refuses them: into the spill file with its reason."""
    api, server = fake
    client = client_for(server, tmp_path)
    client.log("train/loss", 1, float("nan"))
    client.log("train/loss", 2, float("inf"))
    client.log("train/loss", 3, "fast")  # type: ignore[arg-type]
    client.log("train/loss", 4, True)
    client.log(None, 5, 1.0)  # type: ignore[arg-type]
    client.log("train/loss", 6, 1.5)
    client.log_many({"a": float("-inf"), "b": 2.0}, step=7)
    assert client.close() is False
    assert api.points == {("train/loss", 6): 1.5, ("b", 7): 2.0}
    reasons = {(p["key"], p["step"]): (p["value"], p["reason"]) for p in spilled(client.spill_path)}
    refused = "refused by the site (400): 'train/loss' is not a key"
    assert reasons == {
        ("train/loss", 1): ("nan", refused),
        ("train/loss", 2): ("inf", refused),
        ("train/loss", 3): ("'fast'", "value is not a number"),
        ("train/loss", 4): ("True", "a boolean, not a number"),
        ("None", 5): (1.0, "key is not a non-empty string"),
        ("a", 7): ("-inf", "refused by the site (400): 'a' is not a key"),
    }
    assert client.stats["sent"] == 2
    assert sum(n for k, n in client.stats.items() if k.startswith("spilled")) == 6


@pytest.mark.parametrize("answer_lists", [False, True], ids=["batch-refused", "per-key-lists"])
def test_a_refused_key_does_not_hold_back_the_others(
    fake: Any, tmp_path: Path, answer_lists: bool, caplog: pytest.LogCaptureFixture
) -> None:
    api, server = fake
    api.answer_lists = answer_lists
    client = client_for(server, tmp_path, flush_interval=0.02)
    client.start()
    with caplog.at_level(logging.WARNING, logger="marin_client"):
        for step in range(30):
            client.log_many({"train/loss": 1.0 / (step + 1), BAD_KEY: 2.0}, step)
            if step % 10 == 9:
                time.sleep(0.1)  # several batches, the bad key in each
        assert client.close() is False  # the bad key's points are in the spill file
    assert sorted(s for k, s in api.points if k == "train/loss") == list(range(30))
    assert not any(k == BAD_KEY for k, _ in api.points)
    lines = spilled(client.spill_path)
    assert sorted(p["step"] for p in lines) == list(range(30))
    assert {p["key"] for p in lines} == {BAD_KEY}
    assert all("refused by the site" in p["reason"] for p in lines)
    said = [r.getMessage() for r in caplog.records]
    refusals = [m for m in said if m.startswith(f"marin-site refused {BAD_KEY}")]
    assert len(refusals) == 1  # once per key, not once per batch
    assert list(client.refused_keys) == [BAD_KEY]
    assert client.stats["sent"] == 30
    assert client.stats["spilled: refused by the site: not a key"] == (30 if answer_lists else 0)


def test_flagged_keys_are_logged_once_and_stored(
    fake: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    api, server = fake
    api.answer_lists = True
    client = client_for(server, tmp_path, max_points=4)
    with caplog.at_level(logging.WARNING, logger="marin_client"):
        for step in range(10):
            client.log_many({"moe/drop_fraction": 250.0, "train/loss": 2.0}, step)
        assert client.close() is True
    assert len([k for k in api.points if k[0] == "moe/drop_fraction"]) == 10
    flagged = [r for r in caplog.records if "flagged moe/drop_fraction" in r.getMessage()]
    assert len(flagged) == 1
    assert "above 1" in flagged[0].getMessage()
    assert client.flagged_keys == {"moe/drop_fraction": "above 1"}
    assert not client.spill_path.exists()


def test_a_refused_token_spills_everything_and_never_raises(fake: Any, tmp_path: Path) -> None:
    api, server = fake
    client = client_for(server, tmp_path)
    client.token = "wrong"
    client.log("a", 1, 1.0)
    client.log("a", 2, 2.0)
    assert client.flush() is True  # nothing left waiting: it is all in the spill file
    client.log("a", 3, 3.0)
    assert client.finish("finished") is False
    lines = spilled(client.spill_path)
    assert [p["step"] for p in lines] == [1, 2, 3]
    assert all(p["reason"].startswith("run refused by the site (403)") for p in lines)
    assert api.points == {}


def test_the_next_start_replays_the_spill_file(fake: Any, tmp_path: Path) -> None:
    api, server = fake
    api.down = True
    first = client_for(server, tmp_path, retry_for=0.2)
    for step in range(25):
        first.log("train/loss", step, float(step))
    assert first.close() is False
    assert len(spilled(first.spill_path)) == 25
    api.down = False
    second = client_for(server, tmp_path, flush_interval=0.05)
    second.start()
    second.log("train/loss", 25, 25.0)
    assert second.close() is True
    assert sorted(s for _, s in api.points) == list(range(26))
    assert not second.spill_path.exists()
    assert [r.sent for r in second.replays] == [25]


def test_another_runs_spill_stays_in_the_file(fake: Any, tmp_path: Path) -> None:
    api, server = fake
    api.down = True
    other = RunClient(
        api_url=url_of(server), run_id=8, token="t0k", retry_for=0.1, spill_path=tmp_path / "u"
    )
    other.log("train/loss", 1, 1.0)
    other.close()
    api.down = False
    mine = client_for(server, tmp_path, spill_path=tmp_path / "u", flush_interval=0.05)
    mine.start()
    assert mine.close() is True
    assert api.points == {}
    assert [(p["key"], p["step"]) for p in spilled(tmp_path / "u")] == [("train/loss", 1)]
    header = json.loads((tmp_path / "u").read_text().splitlines()[0])
    assert header["run_id"] == "8"


def test_the_site_back_within_the_session_gets_what_was_spilled(fake: Any, tmp_path: Path) -> None:
    """Past ``max_queued`` points wait in the spill file; once the site answers again the
    client replays them itself."""
    api, server = fake
    api.down = True
    client = client_for(server, tmp_path, flush_interval=0.02, max_queued=100)
    client.start()
    for step in range(500):
        client.log("train/loss", step, float(step))
        if step % 50 == 0:
            time.sleep(0.03)
    deadline = time.monotonic() + 10
    while not client.spill_path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert client.spill_path.exists()
    api.down = False
    deadline = time.monotonic() + 20
    while len(api.points) < 500 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.close() is True
    assert sorted(s for _, s in api.points) == list(range(500))
    assert client.stats["sent"] == 500


def test_replay_command_sends_up_to_a_cut_and_reports_it(
    fake: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    api, server = fake
    api.down = True
    writer = client_for(server, tmp_path, retry_for=0.1)
    for step in range(5):
        writer.log("train/loss", step, float(step))
    writer.close()
    spill = writer.spill_path
    text = spill.read_text()
    spill.write_text(text + '{"key": "train/loss", "step": 5, "val')  # the process died here
    api.down = False
    monkeypatch.setenv("RUN_TOKEN", "t0k")
    code = client_module.main(["replay", str(spill)])
    out = capsys.readouterr().out
    assert code == 1  # not everything could be replayed: the cut line
    assert "5 points sent" in out
    assert "cut in the middle of its last line" in out
    assert sorted(s for _, s in api.points) == [0, 1, 2, 3, 4]
    assert not spill.exists()


def test_replay_command_keeps_what_the_site_still_refuses(
    fake: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    api, server = fake
    api.answer_lists = True
    spill = tmp_path / "unsent.jsonl"
    header = {"spill": client_module.SPILL_HEADER, "api_url": url_of(server), "run_id": "9"}
    lines = [
        header,
        {"key": "train/loss", "step": 1, "value": 2.0, "time": 1.8e9, "reason": "site unreachable"},
        {"key": BAD_KEY, "step": 1, "value": 2.0, "time": 1.8e9, "reason": "refused"},
        {"key": "train/loss", "step": 2, "value": "fast", "time": 1.8e9, "reason": "not a number"},
    ]
    spill.write_text("".join(json.dumps(x) + "\n" for x in lines) + "not json\n")
    monkeypatch.setenv("RUN_TOKEN", "t0k")
    assert client_module.main(["replay", str(spill)]) == 1
    out = capsys.readouterr().out
    assert api.points == {("train/loss", 1): 2.0}
    assert "1 not sendable (value is not a number)" in out
    assert "1 not sendable (line 5 is not JSON)" in out
    assert f"refused {BAD_KEY}: not a key" in out
    assert [(p["key"], p["step"]) for p in spilled(spill)] == [(BAD_KEY, 1)]


def test_replay_command_without_a_token_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("RUN_TOKEN", raising=False)
    spill = tmp_path / "unsent.jsonl"
    spill.write_text('{"key": "a", "step": 1, "value": 1.0}\n')
    assert (
        client_module.main(["replay", str(spill), "--api-url", "http://x/", "--run-id", "3"]) == 2
    )
    assert "replay needs RUN_TOKEN" in capsys.readouterr().err
    assert client_module.main(["replay", str(tmp_path / "none.jsonl")]) == 2


def test_close_twice_and_log_after_close_never_raise(fake: Any, tmp_path: Path) -> None:
    _, server = fake
    client = client_for(server, tmp_path)
    client.start()
    client.log("a", 1, 1.0)
    assert client.close() is True
    assert client.close() is True
    client.log("a", 2, 2.0)  # after the end: nobody would send it, so it is spilled
    assert client.pending == 0
    assert [(p["step"], p["reason"]) for p in spilled(client.spill_path)] == [
        (2, "logged after close")
    ]
