"""The local executor with real subprocesses: start once, exit codes, time limit, cancel."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from runs.executors import JobSpec, JobState
from runs.executors.local import LocalExecutor
from tests.runs.runs_helpers import wait_for


def job(tmp_path: Path, code: str, *, time_limit: int = 30, name: str = "job") -> JobSpec:
    return JobSpec(
        job_id=name,
        argv=[sys.executable, "-c", code],
        workdir=tmp_path / name,
        env={"RUN_ID": "7", "RUN_TOKEN": "secret-token"},
        files={"config.json": json.dumps({"steps": 1})},
        time_limit_seconds=time_limit,
    )


def done(executor: LocalExecutor, external_id: str) -> JobState | None:
    status = executor.poll(external_id)
    return status.state if status.is_done else None


def test_job_runs_in_own_dir_and_group_with_its_env(tmp_path: Path) -> None:
    executor = LocalExecutor(grace_seconds=1)
    code = (
        "import os, json; print(json.dumps({'cwd': os.getcwd(), 'run': os.environ['RUN_ID'], "
        "'token': os.environ['RUN_TOKEN'], 'pgid': os.getpgid(0), 'pid': os.getpid(), "
        "'config': open('config.json').read()}))"
    )
    external_id = executor.submit(job(tmp_path, code))
    assert wait_for(lambda: done(executor, external_id)) == JobState.SUCCEEDED
    report = json.loads(executor.logs(external_id))
    assert report["cwd"] == str((tmp_path / "job").resolve())
    assert (report["run"], report["token"]) == ("7", "secret-token")
    assert report["pgid"] == report["pid"] != os.getpgid(0)
    assert json.loads(report["config"]) == {"steps": 1}


def test_submitting_twice_starts_one_job(tmp_path: Path) -> None:
    executor = LocalExecutor(grace_seconds=1)
    code = "open('starts.txt', 'a').write('x')"
    first = executor.submit(job(tmp_path, code))
    second = executor.submit(job(tmp_path, code))
    assert first == second
    wait_for(lambda: done(executor, first))
    assert (tmp_path / "job" / "starts.txt").read_text() == "x"


@pytest.mark.parametrize(
    ("code", "state", "kind"),
    [
        ("raise SystemExit(1)", JobState.FAILED, "code"),
        ("raise SystemExit(2)", JobState.FAILED, "config"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", JobState.FAILED, "oom"),
    ],
)
def test_exit_codes_map_to_failure_kinds(
    tmp_path: Path, code: str, state: JobState, kind: str
) -> None:
    executor = LocalExecutor(grace_seconds=1)
    external_id = executor.submit(job(tmp_path, code))
    assert wait_for(lambda: done(executor, external_id)) == state
    assert executor.poll(external_id).failure_kind == kind


def test_time_limit_stops_the_job(tmp_path: Path) -> None:
    executor = LocalExecutor(grace_seconds=0.5)
    external_id = executor.submit(job(tmp_path, "import time; time.sleep(60)", time_limit=1))
    assert wait_for(lambda: done(executor, external_id), timeout=10) == JobState.FAILED
    assert executor.poll(external_id).failure_kind == "timeout"


def test_cancel_sends_sigterm_then_sigkill_after_grace(tmp_path: Path) -> None:
    executor = LocalExecutor(grace_seconds=0.5)
    code = (
        "import signal, time, pathlib\n"
        "signal.signal(signal.SIGTERM, lambda *a: pathlib.Path('got-term').touch())\n"
        "pathlib.Path('ready').touch()\n"
        "while True: time.sleep(0.05)\n"
    )
    external_id = executor.submit(job(tmp_path, code))
    wait_for((tmp_path / "job" / "ready").exists)
    executor.cancel(external_id)
    assert wait_for(lambda: done(executor, external_id), timeout=10) == JobState.STOPPED
    assert (tmp_path / "job" / "got-term").exists()  # asked politely first, then killed
    child = json.loads((tmp_path / "job" / "child.json").read_text())
    with pytest.raises(ProcessLookupError):
        os.killpg(child["pgid"], 0)


def test_job_whose_supervisor_vanished_is_missing(tmp_path: Path) -> None:
    executor = LocalExecutor(grace_seconds=0.5)
    external_id = executor.submit(job(tmp_path, "import time; time.sleep(60)"))
    wait_for((tmp_path / "job" / "child.json").exists)
    pids = json.loads((tmp_path / "job" / "child.json").read_text())
    os.kill(pids["supervisor"], signal.SIGKILL)
    os.killpg(pids["pgid"], signal.SIGKILL)
    assert wait_for(lambda: done(executor, external_id), timeout=10) == JobState.MISSING
