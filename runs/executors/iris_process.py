"""The site's end of the long-lived Iris submitter (``runs/executors/iris_submitter.py``).

An ``iris job run`` process spends seconds of CPU importing Iris before it submits; on a
busy machine that was most of the time from approval to the job submitted. So each worker
process keeps one submitter, run by the Python of Iris's own environment: started lazily
(or at the worker's start: ``submitter_warm``), asked one command at a time over a pipe
(JSON lines: the arguments, the folder, a few variables; never a secret: those stay in the
folder's ``.marin.yaml``, as for the command), and started again when it has died. A
submitter that does not answer within the command's time limit is killed, as the command
would have been; the executor then looks the job up by its name, as after any submit that
did not say how it went.

``RUNS_IRIS_PYTHON`` names that Python; unset, it follows ``RUNS_IRIS_COMMAND``: the
``python`` beside a path to ``iris`` (``.venv-iris/bin/iris`` -> ``.venv-iris/bin/python``),
or the same words with ``iris`` replaced (``uv run --project /srv/marin iris`` -> ``uv run
--project /srv/marin python``). ``RUNS_IRIS_SUBMITTER=command`` goes back to one ``iris``
process per submit.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shlex
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from django.conf import settings

from runs.executors.base import ExecutorError

PROGRAM = Path(__file__).with_name("iris_submitter.py")
ANSWER_MAX_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Answer:
    returncode: int
    stdout: str
    stderr: str


def submitter_python(command: list[str]) -> list[str]:
    """The Python of the environment ``command`` (the ``iris`` command) runs in, or []
    when it cannot be told (then each submit starts the command)."""
    if configured := settings.RUNS_IRIS_PYTHON:
        return shlex.split(configured)
    if not command or Path(command[-1]).name != "iris":
        return []
    if len(command) == 1 and os.sep in command[0]:
        python = Path(command[0]).with_name("python")
        return [str(python)] if python.exists() else []
    return [*command[:-1], str(Path(command[-1]).with_name("python"))]


class Submitter:
    """One submitter process, for the process that started it; one request at a time."""

    def __init__(self, python: list[str], env: dict[str, str]) -> None:
        self.python = python
        self.env = env
        self.lock = threading.Lock()
        self.process: subprocess.Popen[bytes] | None = None
        self.errors: IO[bytes] | None = None
        self.ready = False
        self.pending = b""

    def start(self) -> None:
        """Start the process (not waiting for it: ``run`` waits for its ready line)."""
        self.stop()
        self.errors = tempfile.TemporaryFile()  # noqa: SIM115  (what it said if it did not start; closed by stop)
        self.ready = False
        self.pending = b""
        try:
            self.process = subprocess.Popen(  # noqa: S603  (the configured Python, this file)
                [*self.python, str(PROGRAM), str(settings.RUNS_IRIS_SUBMITTER_IDLE_SECONDS)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.errors,
                env=self.env,
                cwd=tempfile.gettempdir(),
            )
        except OSError as exc:
            self.process = None
            raise ExecutorError(f"the Iris submitter cannot start: {exc}") from exc

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            with contextlib.suppress(OSError):
                process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
            for stream in (process.stdin, process.stdout):
                with contextlib.suppress(OSError):
                    if stream is not None:
                        stream.close()
        if self.errors is not None:
            self.errors.close()
            self.errors = None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _line(self, deadline: float) -> dict[str, Any]:
        """The next line the process answers, by ``deadline``."""
        assert self.process is not None and self.process.stdout is not None
        fd = self.process.stdout.fileno()
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise EOFError
            self.pending += chunk
            if len(self.pending) > ANSWER_MAX_BYTES:
                raise ExecutorError("the Iris submitter answered more than it may")
        line, _, self.pending = self.pending.partition(b"\n")
        return dict(json.loads(line))

    def _said(self) -> str:
        """The last line the process wrote to its stderr (why it could not start)."""
        if self.errors is None:
            return ""
        self.errors.seek(0)
        lines = [
            line.strip()
            for line in self.errors.read()[-4096:].decode(errors="replace").splitlines()
        ]
        return next((line for line in reversed(lines) if line), "it said nothing")[:300]

    def run(
        self, argv: list[str], *, cwd: Path | None, environ: dict[str, str], timeout: float
    ) -> Answer:
        request = json.dumps({"argv": argv, "cwd": str(cwd) if cwd else "", "environ": environ})
        deadline = time.monotonic() + timeout
        with self.lock:
            for _try in range(2):  # a process found dead before it read the request: once more
                if not self.alive():
                    self.start()
                assert self.process is not None and self.process.stdin is not None
                try:
                    if not self.ready:
                        self._line(deadline)  # {"ready": true}
                        self.ready = True
                except (EOFError, ValueError) as exc:
                    reason = self._said()
                    self.stop()
                    raise ExecutorError(f"the Iris submitter did not start: {reason}") from exc
                except TimeoutError as exc:
                    self.stop()
                    raise ExecutorError(
                        f"the Iris submitter did not start in {timeout:g} s"
                    ) from exc
                try:
                    self.process.stdin.write(request.encode() + b"\n")
                    self.process.stdin.flush()
                except (BrokenPipeError, ValueError, OSError):
                    self.stop()  # it ended (idle, or killed) before reading the request
                    continue
                try:
                    answer = self._line(deadline)
                except TimeoutError as exc:
                    self.stop()
                    raise ExecutorError(f"the Iris command took over {timeout:g} s") from exc
                except (EOFError, ValueError) as exc:
                    self.stop()
                    raise ExecutorError("the Iris submitter ended before it answered") from exc
                return Answer(
                    int(answer.get("returncode", 1)),
                    str(answer.get("stdout", "")),
                    str(answer.get("stderr", "")),
                )
        raise ExecutorError("the Iris submitter keeps ending before it reads a request")


_submitters: dict[tuple[Any, ...], Submitter] = {}
_owner = [os.getpid()]  # the process the submitters above belong to
_guard = threading.Lock()


def submitter_for(python: list[str], env: dict[str, str]) -> Submitter:
    """This process's submitter for that Python and environment (a forked child gets its
    own: it never writes to its parent's pipes)."""
    with _guard:
        if _owner[0] != os.getpid():
            _submitters.clear()  # the parent's: left to the parent
            _owner[0] = os.getpid()
        key = (tuple(python), tuple(sorted(env.items())))
        if key not in _submitters:
            _submitters[key] = Submitter(python, env)
        return _submitters[key]


def submitters_stop() -> None:
    """Stop this process's submitters (tests; a worker's submitters end with it anyway)."""
    with _guard:
        if _owner[0] == os.getpid():
            for submitter in _submitters.values():
                with submitter.lock:
                    submitter.stop()
        _submitters.clear()
