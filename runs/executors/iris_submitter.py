"""A long-lived ``iris`` command: the Iris CLI, imported once, answering JSON lines.

Run by the Python of Iris's own environment (``RUNS_IRIS_PYTHON``: ``.venv-iris/bin/python``,
or ``uv run python`` in a Marin checkout), never by the site's: it imports nothing of the
site and nothing but the standard library until it imports Iris. The ``iris`` executor
(``runs/executors/iris.py``) starts one per worker process, lazily, and starts it again if
it dies. Importing Iris costs seconds of CPU; an ``iris job run`` process pays them on every
submit, this program once.

Each request is one line of JSON on stdin, ``{"argv": [...], "cwd": "...", "environ":
{...}}``: the arguments an ``iris`` command would get, the folder it would start in and
variables it would see besides this process's. It runs Iris's own command-line entry point
in this process with them (so a submit is exactly what ``iris job run`` does: the same
flags, the same bundle of ``cwd``, the secrets read from ``cwd/.marin.yaml``), and answers
one line ``{"returncode", "stdout", "stderr"}``. Nothing a request holds is logged. At the
end of its input (the worker went away) it exits, and after ``argv[1]`` seconds without a
request (0: never), which frees its memory (about 220 MB) on a worker that is idle.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import select
import sys
import traceback
from collections.abc import Iterator
from typing import Any, TextIO


def answer_one(request: dict[str, Any], entry_point: Any) -> dict[str, Any]:
    """Run ``iris *argv`` in ``cwd`` with ``environ`` set, as its process would have run."""
    argv = [str(arg) for arg in request.get("argv") or []]
    environ = {str(k): str(v) for k, v in (request.get("environ") or {}).items()}
    saved = {name: os.environ.get(name) for name in environ}
    stdout, stderr = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(stderr)
    handler.setLevel(logging.INFO)
    root = logging.getLogger()
    returncode = 0
    here = os.getcwd()
    try:
        os.chdir(request.get("cwd") or here)
        os.environ.update(environ)
        sys.argv = ["iris", *argv]  # Iris reads it (its help check, the job's provenance)
        root.addHandler(handler)
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            entry_point.main(args=argv, prog_name="iris", standalone_mode=True)
    except SystemExit as done:
        code = done.code
        returncode = code if isinstance(code, int) else (0 if code is None else 1)
    except Exception:  # what would have ended the process: its traceback, as it printed it
        stderr.write(traceback.format_exc())
        returncode = 1
    finally:
        root.removeHandler(handler)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        os.chdir(here)
    return {"returncode": returncode, "stdout": stdout.getvalue(), "stderr": stderr.getvalue()}


def requests_of(fd: int, idle_seconds: float) -> Iterator[str]:
    """The request lines read from ``fd``, until its end or ``idle_seconds`` without one
    (this process then exits; the site starts another when it next needs one)."""
    pending = b""
    while True:
        while b"\n" not in pending:
            ready, _, _ = select.select([fd], [], [], idle_seconds or None)
            if not ready:
                return
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return
            pending += chunk
        line, _, pending = pending.partition(b"\n")
        yield line.decode("utf-8", errors="replace")


def serve(fd: int, answers: TextIO, idle_seconds: float) -> None:
    from iris.cli import iris as entry_point  # the seconds an `iris` process spends, once

    with contextlib.suppress(ImportError):  # Iris's logging, set up on the real stderr
        from rigging.log_setup import configure_logging

        configure_logging(level=logging.INFO)
    # Started: from now on what Iris logs outside a request's capture is dropped (a process
    # that lives for hours must not fill a file); a request's own log is in its answer.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    answers.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    answers.flush()
    for line in requests_of(fd, idle_seconds):
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except ValueError:
            reply = {"returncode": 2, "stdout": "", "stderr": "Error: a request is one JSON line"}
        else:
            reply = answer_one(request if isinstance(request, dict) else {}, entry_point)
        answers.write(json.dumps(reply) + "\n")
        answers.flush()


def main() -> int:
    # This file sits beside the site's own ``iris.py``: its folder must not shadow Iris.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    # The answers go to a descriptor of their own; whatever Iris writes to the process's
    # stdout (outside a request's capture) goes to stderr and cannot break the protocol.
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    idle = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
    serve(0, answers, idle)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
