"""The local executor with real subprocesses: start once, exit codes, time limit, cancel."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from runs.executors import JobSpec, JobState
from runs.executors import local as local_module
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


def test_a_claim_whose_submitter_died_before_starting_is_taken_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed after claiming a job and before starting it: the next submit (the
    reconciler's) waits out the claim's grace, then starts the job, once; it never returns
    the id of a job nobody will start."""
    monkeypatch.setattr(local_module, "CLAIM_GRACE_SECONDS", 1.0)
    executor = LocalExecutor(grace_seconds=1)
    code = "open('starts.txt', 'a').write('x')"
    claim = tmp_path / "job" / "claim"
    claim.parent.mkdir()
    claim.touch()  # claimed just now by a submit that then died
    started = time.monotonic()
    external_id = executor.submit(job(tmp_path, code))
    assert time.monotonic() - started >= 0.9  # not before the grace
    assert wait_for(lambda: done(executor, external_id)) == JobState.SUCCEEDED
    assert executor.submit(job(tmp_path, code)) == external_id  # started: never twice
    assert (tmp_path / "job" / "starts.txt").read_text() == "x"


def test_a_submit_waits_for_the_claim_s_submitter_to_start_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two submits at once: the second finds the first's claim and returns once the first
    has started the job (its supervisor recorded), starting nothing itself."""
    monkeypatch.setattr(local_module, "CLAIM_GRACE_SECONDS", 30.0)
    workdir = tmp_path / "job"
    workdir.mkdir()
    (workdir / "claim").touch()
    timer = threading.Timer(
        0.5, lambda: (workdir / "supervisor.json").write_text(json.dumps({"pid": os.getpid()}))
    )
    timer.start()
    started = time.monotonic()
    external_id = LocalExecutor(grace_seconds=1).submit(
        job(tmp_path, "open('starts.txt', 'a').write('x')")
    )
    waited = time.monotonic() - started
    timer.join()
    assert external_id == str(workdir.resolve())
    assert 0.4 <= waited < 5
    assert not (workdir / "starts.txt").exists()
    assert not list(workdir.glob("claim.abandoned-*"))


@pytest.mark.parametrize(
    ("code", "state", "kind", "words"),
    [
        ("raise SystemExit(1)", JobState.FAILED, "code", "exited with 1"),
        ("raise SystemExit(2)", JobState.FAILED, "config", "exit 2"),
        (
            "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
            JobState.KILLED,
            "",
            "killed by SIGKILL from outside",
        ),
        (
            "import os, signal; os.kill(os.getpid(), signal.SIGTERM)",
            JobState.PREEMPTED,
            "",
            "SIGTERM from outside",
        ),
        (
            "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)",
            JobState.FAILED,
            "code",
            "SIGSEGV",
        ),
    ],
)
def test_exit_codes_and_signals_map_to_states_from_evidence(
    tmp_path: Path, code: str, state: JobState, kind: str, words: str
) -> None:
    executor = LocalExecutor(grace_seconds=1)
    external_id = executor.submit(job(tmp_path, code))
    assert wait_for(lambda: done(executor, external_id)) == state
    status = executor.poll(external_id)
    assert status.failure_kind == kind
    assert words in status.message
    assert "most likely" not in status.message


@pytest.mark.parametrize(
    ("evidence", "state", "kind", "words"),
    [
        (
            {"oom_kills": 1, "cgroup": "/sys/fs/cgroup/job"},
            JobState.FAILED,
            "oom",
            "oom_kill +1 in /sys/fs/cgroup/job",
        ),
        (
            {"oom_kills": 0, "cgroup": "/sys/fs/cgroup/job"},
            JobState.KILLED,
            "",
            "no OOM kill was counted",
        ),
        ({"oom_kills": None, "cgroup": ""}, JobState.KILLED, "", "no OOM counter could be read"),
    ],
)
def test_a_sigkill_is_an_oom_only_when_the_cgroup_counted_one(
    evidence: dict[str, object], state: JobState, kind: str, words: str
) -> None:
    status = LocalExecutor._status_from_exit(
        {"returncode": -signal.SIGKILL, "reason": "exited", **evidence}
    )

    assert (status.state, status.failure_kind) == (state, kind)
    assert words in status.message


def test_the_supervisor_records_the_cgroup_s_oom_counter(tmp_path: Path) -> None:
    from marin_client.agent import oom_counter

    executor = LocalExecutor(grace_seconds=1)
    external_id = executor.submit(job(tmp_path, "pass"))
    wait_for(lambda: done(executor, external_id))
    ended = json.loads((tmp_path / "job" / "exit.json").read_text())
    count, cgroup = oom_counter()
    assert ended["cgroup"] == cgroup
    assert ended["oom_kills"] == (0 if count is not None else None)


def test_sigterm_to_the_supervisor_from_outside_is_a_preemption(tmp_path: Path) -> None:
    executor = LocalExecutor(grace_seconds=0.5)
    external_id = executor.submit(job(tmp_path, "import time; time.sleep(60)"))
    wait_for((tmp_path / "job" / "child.json").exists)
    supervisor = json.loads((tmp_path / "job" / "child.json").read_text())["supervisor"]

    os.kill(supervisor, signal.SIGTERM)  # the machine is going away; nobody asked to cancel

    assert wait_for(lambda: done(executor, external_id), timeout=10) == JobState.PREEMPTED


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
