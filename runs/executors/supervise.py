"""The local executor's supervisor: runs one job, enforces its limits, records how it ended.

Started by ``LocalExecutor.submit`` in its own session, it outlives the Celery worker that
started it, so a worker restart loses nothing: the job's end is written to ``exit.json`` in
the job's working directory for whoever polls next. The job itself runs in its own process
group; a time limit or a cancel (SIGTERM to this supervisor) sends SIGTERM to that group,
waits the grace period, then SIGKILL. A cancel is a SIGTERM after the executor wrote a
``cancel`` file; a SIGTERM without one came from outside (the machine is going away) and
is recorded as a preemption. The cgroup's OOM-kill counter is read before and after the job,
so a SIGKILL is put down to the OOM killer only on that evidence. Imports nothing from
Django, to start fast.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from types import FrameType

from marin_client.agent import oom_counter


def write_json_atomically(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def stop_group(child: subprocess.Popen[bytes], grace_seconds: float) -> None:
    try:
        os.killpg(child.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(timeout=grace_seconds)
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    child.wait()


def _child_environ(pythonpath: str) -> dict[str, str] | None:
    """The job's environment: this one's, and when the job imports its code from the pinned
    checkout (which every job at that commit shares), that checkout on its path and no
    bytecode written into it, or the next run at the commit would find its tree changed."""
    if not pythonpath:
        return None
    return {**os.environ, "PYTHONPATH": pythonpath, "PYTHONDONTWRITEBYTECODE": "1"}


def supervise(
    argv: list[str], workdir: Path, time_limit: float, grace: float, pythonpath: str = ""
) -> int:
    canceled = False

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        nonlocal canceled
        canceled = True

    signal.signal(signal.SIGTERM, on_sigterm)
    oom_before, cgroup = oom_counter()
    started = time.monotonic()
    with (workdir / "log.txt").open("ab") as log:
        child = subprocess.Popen(  # noqa: S603  (argv comes from the recipe's command template)
            argv,
            cwd=workdir,
            env=_child_environ(pythonpath),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    write_json_atomically(
        workdir / "child.json", {"pid": child.pid, "pgid": child.pid, "supervisor": os.getpid()}
    )
    reason = "exited"
    while True:
        returncode = child.poll()
        if returncode is not None:
            break
        if canceled or time.monotonic() - started > time_limit:
            if canceled:
                reason = "canceled" if (workdir / "cancel").exists() else "preempted"
            else:
                reason = "time_limit"
            stop_group(child, grace)
            break
        time.sleep(0.1)
    returncode = child.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)  # leftovers of the job's group go with it
    oom_after, _ = oom_counter()
    oom_kills = None if oom_before is None or oom_after is None else oom_after - oom_before
    write_json_atomically(
        workdir / "exit.json",
        {
            "returncode": returncode,
            "reason": reason,
            "seconds": time.monotonic() - started,
            "oom_kills": oom_kills,
            "cgroup": cgroup,
        },
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--time-limit", type=float, required=True)
    parser.add_argument("--grace", type=float, default=10.0)
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    parser.add_argument("--detach", action="store_true", help="fork, record the pid, return")
    parser.add_argument(
        "--child-pythonpath", default="", help="the job's PYTHONPATH: the pinned checkout"
    )
    args = parser.parse_args()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if args.detach:
        # Fork so the supervisor is nobody's child: the worker that started it need not
        # reap it, and it lives on when that worker dies.
        pid = os.fork()
        if pid > 0:
            write_json_atomically(args.workdir / "supervisor.json", {"pid": pid})
            os._exit(0)
        os.setsid()
    return supervise(argv, args.workdir, args.time_limit, args.grace, args.child_pythonpath)


if __name__ == "__main__":
    raise SystemExit(main())
