"""The run client against the real site (live_server): a refused key beside good ones, the
site away and back, a spill file replayed into the run."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from marin_client import client as client_module
from marin_client.client import RunClient

from runs.models import MetricPoint, Run

pytestmark = pytest.mark.django_db(transaction=True)


class Door:
    """A door in front of the site that can be shut: shut, it drops every connection
    unanswered, as a site that is away does."""

    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self.shut = False
        door = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if door.shut:
                    self.close_connection = True
                    return  # no answer: the client sees the connection dropped
                request = urllib.request.Request(  # noqa: S310  (the live server)
                    door.target + self.path,
                    data=body,
                    method="POST",
                    headers={k: v for k, v in self.headers.items() if k.lower() != "host"},
                )
                try:
                    with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310
                        code, data, retry = answer.status, answer.read(), None
                except urllib.error.HTTPError as exc:
                    code, data, retry = exc.code, exc.read(), exc.headers.get("Retry-After")
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if retry:
                    self.send_header("Retry-After", retry)
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/v1/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def door(job: Run) -> Iterator[Door]:
    site = os.environ["RUN_API_URL"].removesuffix("/api/v1/")
    opened = Door(site)
    yield opened
    opened.server.shutdown()
    opened.server.server_close()


def stored(run: Run, key: str) -> list[int]:
    return sorted(MetricPoint.objects.filter(run=run, key=key).values_list("step", flat=True))


def spilled(path: Path) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    return [line for line in lines if "spill" not in line]


def test_a_key_the_site_refuses_does_not_hold_back_the_others(job: Run, tmp_path: Path) -> None:
    client = RunClient.from_env(spill_path=tmp_path / "unsent.jsonl", flush_interval=0.05)
    assert client is not None
    client.start()
    for step in range(40):
        client.log_many({"train/loss": 3.0 - step / 100, "has a space": 1.0}, step)
        if step % 10 == 9:
            time.sleep(0.1)
    assert client.close() is False
    assert stored(job, "train/loss") == list(range(40))
    assert not MetricPoint.objects.filter(run=job, key="has a space").exists()
    lines = spilled(client.spill_path)
    assert sorted(p["step"] for p in lines) == list(range(40))
    assert {p["key"] for p in lines} == {"has a space"}
    assert all("refused by the site" in p["reason"] for p in lines)
    assert list(client.refused_keys) == ["has a space"]
    assert client.stats["sent"] == 40


def test_a_nan_among_a_key_s_points_is_the_only_point_spilled(job: Run, tmp_path: Path) -> None:
    """The site stores a key's finite points and refuses its NaN alone: the client counts
    the stored ones as sent and spills only the NaN, not the points the site kept."""
    client = RunClient.from_env(spill_path=tmp_path / "unsent.jsonl", flush_interval=0.05)
    assert client is not None
    for step in range(20):
        client.log("train/loss", step, 3.0 - step / 10)
    client.log("train/loss", 20, float("nan"))
    assert client.close() is False
    assert stored(job, "train/loss") == list(range(20))
    assert [(p["key"], p["step"], p["value"]) for p in spilled(client.spill_path)] == [
        ("train/loss", 20, "nan")
    ]
    assert client.stats["sent"] == 20


def test_the_site_away_and_back_loses_nothing(job: Run, door: Door, tmp_path: Path) -> None:
    client = RunClient(
        api_url=door.url,
        run_id=job.pk,
        token=os.environ["RUN_TOKEN"],
        flush_interval=0.05,
        max_queued=300,  # past 300 waiting points the oldest go to the spill file
        spill_path=tmp_path / "unsent.jsonl",
    )
    client.start()
    for step in range(100):
        client.log("train/loss", step, 2.0)
    door.shut = True
    for step in range(100, 1100):
        client.log_many({"train/loss": 2.0}, step)
        if step % 100 == 0:
            time.sleep(0.05)
    time.sleep(0.3)
    door.shut = False
    deadline = time.monotonic() + 60
    while len(stored(job, "train/loss")) < 1100 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert client.close() is True
    assert stored(job, "train/loss") == list(range(1100))
    assert client.stats["replayed"] > 0  # the spill file was used, and replayed
    assert client.stats["sent"] == 1100
    assert not client.spill_path.exists()


def test_a_spill_file_is_replayed_by_the_next_start_and_by_the_command(
    job: Run, door: Door, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    door.shut = True
    token = os.environ["RUN_TOKEN"]
    first = RunClient(
        api_url=door.url, run_id=job.pk, token=token, retry_for=0.2, spill_path=tmp_path / "a"
    )
    for step in range(10):
        first.log("train/loss", step, 1.0)
    assert first.close() is False
    (tmp_path / "b").write_bytes((tmp_path / "a").read_bytes())
    door.shut = False

    second = RunClient(
        api_url=door.url, run_id=job.pk, token=token, flush_interval=0.05, spill_path=tmp_path / "a"
    )
    second.start()
    assert second.close() is True
    assert stored(job, "train/loss") == list(range(10))
    MetricPoint.objects.filter(run=job).delete()

    with (tmp_path / "b").open("a") as spill:  # the process died while writing a line
        spill.write('{"key": "train/loss", "step": 10, "va')
    assert client_module.main(["replay", str(tmp_path / "b")]) == 1
    out = capsys.readouterr().out
    assert "10 points sent" in out
    assert "cut in the middle of its last line" in out
    assert stored(job, "train/loss") == list(range(10))


def test_the_replay_command_is_a_console_script_of_the_distribution() -> None:
    from importlib.metadata import entry_points

    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts["marin-site-client"] == "marin_client.client:main"
    assert scripts["marin-site-agent"] == "marin_client.agent:main"
