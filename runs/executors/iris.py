"""The ``iris`` executor: Marin's own cluster scheduler, reached as Marin reaches it.

Jobs are submitted with the ``iris`` command of an environment of its own
(``RUNS_IRIS_COMMAND``: the site's ``.venv-iris/bin/iris`` made by ``bin/setup-iris``, or
``uv run iris`` inside a Marin checkout), so the site's Python need not be Iris's:
``iris --controller-url URL job run --no-wait --no-sync --job-name NAME [resources] -e NAME
VALUE ... -- CMD...``, run in the job's working folder, which Iris bundles: the job's files
and, when the launch pinned a commit, a copy of that commit's clean checkout
(``runs/executors/code.py``), so the job runs the pinned code. A worker does not start
that command for each submit (seconds of CPU importing Iris): its long-lived submitter,
run by Iris's own Python, runs the same command line in-process (``iris_process``;
``RUNS_IRIS_SUBMITTER=command`` starts the command instead). The run's time limit is the
job's ``--timeout``. The controller is
read through the same RPCs ``iris rpc controller get-job-status`` / ``list-jobs`` /
``terminate-job`` call, in Connect's JSON over HTTP (a fraction of a second where the
command takes seconds to start). A cluster named as Marin names it (``RUNS_IRIS_CLUSTER``:
``iris --cluster NAME``) or by its config file (``RUNS_IRIS_CONFIG``: ``--config PATH``) is
reached only through the command, which opens the way to its controller: every call names
it, and the RPCs are ``iris rpc controller ...`` run by the long-lived submitter.

The job's name is ``RUNS_IRIS_JOB_PREFIX`` and the job id (run and attempt), so it is
stable: ``submit`` looks the name up first and returns the job found, and Iris itself
refuses a second live job of one name; a worker killed mid-submit leaves a job the next
submit (or the reconciler) finds by its name instead of starting another.

Only named variables reach the job: plain ones with ``-e NAME VALUE``; secrets (the run's
token, ``RUNS_SECRET_ENV``, any name saying TOKEN, KEY, SECRET or PASSWORD) never go into
an argument list: they are written to ``.marin.yaml`` in the working folder (mode 0600,
which the ``iris`` command reads and the bundle leaves out) and removed after the submit.
A job file holding secrets (``JobSpec.secret_files``: the manifest of a job of several
trainings, with each run's token) is not bundled either: it goes as one such secret, and
the job's first step writes it out in its folder (mode 0600) before the command starts.

When the controller does not answer or refuses a submit, the executor says so through
``unavailable()`` for a backoff period that doubles up to ``RUNS_IRIS_BACKOFF_MAX_SECONDS``
(kept in the cache, shared by every worker): runs wait in the queue with that reason.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.cache import cache

from runs.executors.base import (
    ExecutorError,
    JobSpec,
    JobState,
    JobStatus,
    secret_files_step,
)
from runs.executors.code import checkout_copy
from runs.executors.iris_process import Answer, submitter_for, submitter_python

logger = logging.getLogger(__name__)

SERVICE = "iris.cluster.ControllerService"
SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
JOB_NAME = re.compile(r"[^A-Za-z0-9._-]+")
EXIT_CODE = re.compile(r"exit code:?\s*(-?\d+)", re.IGNORECASE)
OUT_OF_MEMORY = re.compile(r"out of memory|outofmemory|oom[ -]?kill|\boom\b", re.IGNORECASE)
TIMED_OUT = re.compile(r"timeout exceeded|timed out", re.IGNORECASE)
BACKOFF_KEY = "runs:iris:backoff"
ENV_FILE = ".marin.yaml"
ANSWER_MAX_BYTES = 8 * 1024 * 1024
CLUSTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")
NOT_FOUND = re.compile(r"\bnot[ _]found\b", re.IGNORECASE)
NOT_SET_UP = (
    "no Iris controller is set up on this site "
    "(RUNS_IRIS_CONTROLLER_URL, RUNS_IRIS_CLUSTER or RUNS_IRIS_CONFIG)"
)


def target_problem(*, controller_url: str, cluster: str, config: str) -> str:
    """Why the site's Iris cluster is not set up right ("" when it is): exactly one of a
    controller's URL, a named cluster (``iris --cluster``) or a cluster config file
    (``iris --config``)."""
    given = [
        name
        for name, value in (
            ("RUNS_IRIS_CONTROLLER_URL", controller_url),
            ("RUNS_IRIS_CLUSTER", cluster),
            ("RUNS_IRIS_CONFIG", config),
        )
        if value
    ]
    if not given:
        return NOT_SET_UP
    if len(given) > 1:
        return f"Iris is set up more than once ({' and '.join(given)}): set only one of them"
    if cluster and not CLUSTER_NAME.match(cluster):
        return f"RUNS_IRIS_CLUSTER '{cluster[:60]}' is no cluster name (letters, digits, '.-_')"
    if config and not Path(config).is_file():
        return f"RUNS_IRIS_CONFIG: there is no cluster config at {config[:200]}"
    return ""


def _field(data: dict[str, Any], name: str, default: Any = None) -> Any:
    """A field of Iris's JSON, spelled either way (the CLI prints snake_case, Connect's JSON
    camelCase)."""
    if name in data:
        return data[name]
    head, *rest = name.split("_")
    camel = head + "".join(part.title() for part in rest)
    return data.get(camel, default)


def iris_status(job: dict[str, Any]) -> JobStatus:
    """A job's state, from the JSON of ``get-job-status`` (its ``job``) or of one
    ``list-jobs`` entry: state, exit code, error, failure and preemption counts."""
    state = str(_field(job, "state", ""))
    error = str(_field(job, "error", "") or "")
    pending = str(_field(job, "pending_reason", "") or "")
    failures = int(_field(job, "failure_count", 0) or 0)
    preemptions = int(_field(job, "preemption_count", 0) or 0)
    exit_code = int(_field(job, "exit_code", 0) or 0)
    if not exit_code and (found := EXIT_CODE.search(error)):
        exit_code = int(found.group(1))
    if state in {"JOB_STATE_PENDING", "JOB_STATE_BUILDING", "JOB_STATE_UNSPECIFIED", ""}:
        return JobStatus(JobState.PENDING, message=pending)
    if state == "JOB_STATE_RUNNING":
        return JobStatus(JobState.RUNNING)
    if state == "JOB_STATE_SUCCEEDED":
        return JobStatus(JobState.SUCCEEDED)
    if state == "JOB_STATE_KILLED":
        return JobStatus(JobState.STOPPED, message=error or "terminated in Iris")
    if state == "JOB_STATE_WORKER_FAILED" or (
        state == "JOB_STATE_FAILED" and preemptions and not failures
    ):
        return JobStatus(
            JobState.PREEMPTED,
            message=f"Iris: {error or 'its worker went away'} ({preemptions} preemptions)",
        )
    if state == "JOB_STATE_UNSCHEDULABLE":
        return JobStatus(
            JobState.FAILED, "config", f"Iris could not schedule it: {error or pending}"
        )
    if state != "JOB_STATE_FAILED":
        return JobStatus(JobState.MISSING, message=f"Iris reports an unknown state {state[:40]}")
    message = f"Iris: {error}" if error else f"exit code {exit_code}"
    if TIMED_OUT.search(error):  # the job's timeout: the run's time limit (--timeout)
        return JobStatus(JobState.FAILED, "timeout", f"the time limit was reached ({message})")
    if OUT_OF_MEMORY.search(error):
        return JobStatus(JobState.FAILED, "oom", message)
    if exit_code in (-9, 137):
        return JobStatus(JobState.KILLED, message=f"killed by SIGKILL; {message}")
    return JobStatus(JobState.FAILED, "config" if exit_code == 2 else "code", message)


def is_secret(name: str) -> bool:
    return name in settings.RUNS_SECRET_ENV or bool(SECRET_NAME.search(name))


def resource_flags(resources: dict[str, Any]) -> list[str]:
    """``iris job run`` flags for a recipe's ``resources`` (checked when the recipe was
    saved: ``resources_problems``)."""
    flags: list[str] = []
    if tpu := resources.get("tpu"):
        flags += ["--tpu", str(tpu)]
    if gpu := resources.get("gpu"):
        flags += ["--gpu", str(gpu)]
    if any(resources.get(key) for key in ("tpu", "gpu", "memory", "disk")):
        flags.append("--enable-extra-resources")  # Iris asks for it above small CPU jobs
    for key in ("cpu", "memory", "disk", "zone", "priority", "replicas"):
        if resources.get(key) not in (None, ""):
            flags += [f"--{key}", str(resources[key])]
    for region in resources.get("region") or []:
        flags += ["--region", str(region)]
    for reserve in resources.get("reserve") or []:
        flags += ["--reserve", str(reserve)]
    if resources.get("preemptible") is True:
        flags.append("--preemptible")
    elif resources.get("preemptible") is False:
        flags.append("--no-preemptible")
    return flags


def default_command() -> str:
    return str(Path(settings.BASE_DIR) / ".venv-iris" / "bin" / "iris")


class IrisExecutor:
    name = "iris"
    ends_at_time_limit = True  # the run's limit goes as the job's --timeout

    def __init__(
        self,
        *,
        controller_url: str | None = None,
        command: str | None = None,
        home: str | None = None,
        cluster: str | None = None,
        config: str | None = None,
    ) -> None:
        url = controller_url if controller_url is not None else settings.RUNS_IRIS_CONTROLLER_URL
        self.controller_url = url.rstrip("/")
        self.cluster = cluster if cluster is not None else settings.RUNS_IRIS_CLUSTER
        self.config = config if config is not None else settings.RUNS_IRIS_CONFIG
        self.command = shlex.split(command or settings.RUNS_IRIS_COMMAND or default_command())
        self.home = home if home is not None else settings.RUNS_IRIS_HOME

    # -- which cluster ---------------------------------------------------------------------

    def set_up_problem(self) -> str:
        return target_problem(
            controller_url=self.controller_url, cluster=self.cluster, config=self.config
        )

    def target(self) -> list[str]:
        """The ``iris`` options naming the cluster, first on every command line."""
        if self.controller_url:
            return ["--controller-url", self.controller_url]
        if self.cluster:
            return ["--cluster", self.cluster]
        return ["--config", self.config]

    def where(self) -> str:
        """The cluster, as a reason names it."""
        if self.controller_url:
            return f"Iris at {self.controller_url}"
        return f"Iris cluster {self.cluster}" if self.cluster else f"Iris ({self.config})"

    # -- the controller's RPCs, in Connect's JSON ------------------------------------------

    def _rpc(self, method: str, body: dict[str, Any], *, timeout: float = 10.0) -> dict[str, Any]:
        """One controller RPC; ExecutorError when the controller does not answer or refuses
        (``not_found`` is raised as LookupError). With a named cluster or a config file (no
        URL the site can reach by itself: Iris opens the tunnel) it is ``iris rpc
        controller``, in the long-lived submitter when there is one."""
        if not self.controller_url:
            return self._rpc_by_command(method, body, timeout=timeout)
        request = urllib.request.Request(  # noqa: S310  (the configured controller's URL)
            f"{self.controller_url}/{SERVICE}/{method}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **self._auth()},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
                return dict(json.loads(response.read(ANSWER_MAX_BYTES) or b"{}"))
        except urllib.error.HTTPError as exc:
            try:
                problem = json.loads(exc.read(65536) or b"{}")
            except ValueError:
                problem = {}
            code, message = problem.get("code", ""), str(problem.get("message", exc.reason))
            if code == "not_found":
                raise LookupError(message) from exc
            raise ExecutorError(
                f"Iris refused {method}: {code or exc.code} {message[:300]}"
            ) from exc
        except (OSError, ValueError) as exc:
            raise ExecutorError(
                f"Iris at {self.controller_url} does not answer: {getattr(exc, 'reason', exc)}"
            ) from exc

    def _rpc_by_command(
        self, method: str, body: dict[str, Any], *, timeout: float
    ) -> dict[str, Any]:
        kebab = re.sub(r"(?<!^)(?=[A-Z])", "-", method).lower()
        command = [*self.command, *self.target(), "rpc", "controller", kebab, "--json"]
        answer = self._run(
            [*command, json.dumps(body)],
            cwd=None,
            timeout=max(timeout, settings.RUNS_IRIS_SUBMIT_TIMEOUT),
            submit=True,
        )
        if answer.returncode != 0:
            gist = _last_error(answer.stderr, {})
            if NOT_FOUND.search(gist):
                raise LookupError(gist)
            raise ExecutorError(f"{self.where()} does not answer {method}: {gist}")
        start = answer.stdout.find("{")
        try:
            return dict(json.loads(answer.stdout[start:] if start >= 0 else "{}"))
        except ValueError as exc:
            raise ExecutorError(f"{self.where()} answered {method} with no JSON") from exc

    def _auth(self) -> dict[str, str]:
        token = os.environ.get("RUNS_IRIS_TOKEN", "")
        return {"Authorization": f"Bearer {token}"} if token else {}

    def job_by_name(self, name: str) -> dict[str, Any] | None:
        """The job of that name (any user's prefix), or None: the look-up before a submit."""
        answer = self._rpc("ListJobs", {"query": {"name_filter": name, "limit": 500}})
        for job in answer.get("jobs") or []:
            job_id = str(_field(job, "job_id", ""))
            if job_id.rsplit("/", 1)[-1] == name:
                return dict(job)
        return None

    # -- the interface ---------------------------------------------------------------------

    def unavailable(self) -> str:
        if problem := self.set_up_problem():
            return problem
        program = self.command[0]
        if not (Path(program).is_absolute() and Path(program).exists()) and not _which(program):
            return f"the Iris command '{program[:80]}' is not installed (bin/setup-iris)"
        held = cache.get(BACKOFF_KEY)
        if isinstance(held, dict) and held.get("until", 0) > time.time():
            left = int(held["until"] - time.time()) + 1
            return f"{held.get('reason', 'Iris does not answer')} (tried again in {left} s)"
        try:
            self._rpc("ListJobs", {"query": {"limit": 1}}, timeout=5.0)
        except ExecutorError as exc:
            self.back_off(str(exc))
            return str(exc)
        cache.delete(BACKOFF_KEY)
        return ""

    def back_off(self, reason: str) -> None:
        """Hold submits to this controller for a while (doubling, up to the maximum)."""
        held = cache.get(BACKOFF_KEY)
        last = float(held.get("seconds", 0)) if isinstance(held, dict) else 0.0
        seconds = min(
            max(settings.RUNS_IRIS_BACKOFF_SECONDS, last * 2),
            settings.RUNS_IRIS_BACKOFF_MAX_SECONDS,
        )
        cache.set(
            BACKOFF_KEY,
            {"until": time.time() + seconds, "seconds": seconds, "reason": reason[:300]},
            timeout=int(seconds) + 3600,
        )

    def job_name(self, job: JobSpec) -> str:
        prefix = settings.RUNS_IRIS_JOB_PREFIX
        return JOB_NAME.sub("-", f"{prefix}-{job.job_id}" if prefix else job.job_id)[:120]

    def submit(self, job: JobSpec) -> str:
        if problem := self.set_up_problem():
            raise ExecutorError(problem)
        name = self.job_name(job)
        try:
            found = self.job_by_name(name)
        except ExecutorError as exc:  # down: runs wait in the queue until the backoff is over
            self.back_off(str(exc))
            raise
        if found:  # submitted before (a worker died mid-way): that job, not a second one
            return str(_field(found, "job_id"))
        # One submit of a name at a time, whichever worker: Iris refuses a second live job of
        # a name but would start a finished one again, so a racing submit must not go out.
        lock = f"runs:iris:submitting:{name}"
        deadline = time.monotonic() + settings.RUNS_IRIS_SUBMIT_TIMEOUT
        while not cache.add(lock, os.getpid(), timeout=int(settings.RUNS_IRIS_SUBMIT_TIMEOUT) + 5):
            if time.monotonic() > deadline:
                raise ExecutorError(f"job {name} is still being submitted by another worker")
            time.sleep(0.5)
        try:
            if found := self.job_by_name(name):  # the other worker's submit went through
                return str(_field(found, "job_id"))
            return self._submit(job, name)
        finally:
            cache.delete(lock)

    def _submit(self, job: JobSpec, name: str) -> str:
        workdir = job.workdir.resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        if job.code_dir is not None:  # the pinned commit's tree is what Iris bundles
            checkout_copy(job.code_dir, workdir)
        shipped = {k: v for k, v in job.files.items() if k not in job.secret_files}
        for file_name, content in shipped.items():
            (workdir / file_name).write_text(content)
        plain = {k: v for k, v in job.env.items() if not is_secret(k)}
        secret = {k: v for k, v in job.env.items() if is_secret(k)}
        for key in (*plain, *secret):
            if not ENV_NAME.match(key):
                raise ExecutorError(f"'{key[:60]}' is no environment variable name")
        argv = list(job.argv)
        # Files holding secrets (a manifest's tokens) stay out of the bundle: they go as a
        # secret variable, which the job's first step writes out (mode 0600).
        hidden, argv = secret_files_step(
            job, python=sys.executable if settings.RUNS_IRIS_LOCAL else "python"
        )
        secret.update(hidden)
        if settings.RUNS_IRIS_LOCAL:
            # A local controller runs tasks as subprocesses of its own working folder: each
            # job is started in its own folder (the bundle a worker would unpack), with the
            # site's code importable unless the folder holds the pinned commit's.
            plain.setdefault(
                "PYTHONPATH",
                "." if job.code_dir is not None else f".{os.pathsep}{settings.BASE_DIR}",
            )
            # Iris's process runtime rewrites every argument that starts with /tmp/ (its
            # tasks' /tmp is a folder of their own): a site checked out under /tmp would not
            # find its own Python. So the launcher is the base interpreter by its real path
            # (it needs the standard library only) and the folder and the command go inside
            # its code, where nothing is rewritten.
            launcher = os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable)
            argv = [launcher, "-c", CHDIR_LAUNCHER % (str(workdir), json.dumps(argv))]
        command = [
            *self.command,
            *self.target(),
            "job",
            "run",
            "--no-wait",
            "--no-sync",
            "--job-name",
            name,
            "--exclude",
            rf"(^|/){re.escape(ENV_FILE)}$",
            *[flag for file_name in shipped for flag in ("--include", file_name)],
            *[
                flag
                for name in job.secret_files
                for flag in ("--exclude", rf"(^|/){re.escape(name)}$")
            ],
            *resource_flags(job.resources),
            # The run's time limit is the job's: Iris ends a task that outlives it.
            *(
                ["--timeout", str(int(job.time_limit_seconds))]
                if job.time_limit_seconds > 0
                else []
            ),
            *[item for key, value in plain.items() for item in ("-e", key, value)],
            "--",
            *argv,
        ]
        env_file = workdir / ENV_FILE
        fd = os.open(env_file, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump({"env": secret}, out)  # YAML reads JSON
        try:
            answer = self._run(
                command, cwd=workdir, timeout=settings.RUNS_IRIS_SUBMIT_TIMEOUT, submit=True
            )
        except ExecutorError as exc:
            answer = Answer(1, "", str(exc))
        finally:
            with contextlib.suppress(FileNotFoundError):
                env_file.unlink()
        job_id = _last_line(answer.stdout)
        if answer.returncode == 0 and job_id.startswith("/"):
            cache.delete(BACKOFF_KEY)
            return job_id
        with contextlib.suppress(ExecutorError):  # a concurrent submit won, or it went through
            if found := self.job_by_name(name):
                return str(_field(found, "job_id"))
        reason = f"Iris refused job {name}: {_last_error(answer.stderr, secret)}"
        self.back_off(reason)
        raise ExecutorError(reason)

    def poll(self, external_id: str) -> JobStatus:
        try:
            answer = self._rpc("GetJobStatus", {"job_id": external_id})
        except LookupError:
            return JobStatus(JobState.MISSING, message=f"Iris has no job {external_id}")
        return iris_status(dict(answer.get("job") or {}))

    def cancel(self, external_id: str) -> None:
        """``iris job stop`` through its RPC (TerminateJob); a job Iris forgot is stopped."""
        with contextlib.suppress(LookupError):
            self._rpc("TerminateJob", {"job_id": external_id})

    def logs(self, external_id: str, *, tail_bytes: int = 65536) -> str:
        """The job's log tail, from ``iris job logs --tail`` (empty when Iris cannot say in
        ``RUNS_IRIS_LOGS_TIMEOUT`` seconds: a page never waits longer)."""
        lines = max(20, min(2000, tail_bytes // 80))
        try:
            answer = self._run(
                [
                    *self.command,
                    *self.target(),
                    "job",
                    "logs",
                    "--tail",
                    "--max-lines",
                    str(lines),
                    external_id,
                ],
                cwd=None,
                timeout=settings.RUNS_IRIS_LOGS_TIMEOUT,
            )
        except ExecutorError:
            return ""
        return answer.stdout[-tail_bytes:] if answer.returncode == 0 else ""

    # -- the command -----------------------------------------------------------------------

    def _environ(self, cwd: Path | None) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "HOME": self.home or os.environ.get("HOME", "/tmp"),  # noqa: S108
        }
        if cwd is not None:
            # Iris bundles what `git ls-files` lists in the folder; a working folder under
            # an ignored folder of another repository (the site's own var/) would list
            # nothing, so git stops at the folder and Iris takes its files by its patterns.
            env["GIT_CEILING_DIRECTORIES"] = str(cwd.parent)
        return env

    def _submitter_python(self) -> list[str]:
        """The Python a long-lived submitter runs in ([]: one ``iris`` process a submit)."""
        if settings.RUNS_IRIS_SUBMITTER != "process":
            return []
        return submitter_python(self.command)

    def warm(self) -> None:
        """Start this process's submitter now (a worker's start), so that its first submit
        does not wait for Iris to be imported; nothing when none is configured."""
        if not self.set_up_problem() and (python := self._submitter_python()):
            submitter = submitter_for(python, self._environ(None))
            with submitter.lock:
                if not submitter.alive():
                    submitter.start()

    def _run(
        self, command: list[str], *, cwd: Path | None, timeout: float, submit: bool = False
    ) -> Answer:
        """The ``iris`` command, run in ``cwd``: a submit goes to this process's long-lived
        submitter (``iris_process``) when there is one, anything else starts the command."""
        env = self._environ(cwd)
        if submit and (python := self._submitter_python()):
            base = self._environ(None)
            extra = {k: v for k, v in env.items() if base.get(k) != v}
            return submitter_for(python, base).run(
                command[len(self.command) :], cwd=cwd, environ=extra, timeout=timeout
            )
        try:
            done = subprocess.run(  # noqa: S603  (argv built here; secrets are not in it)
                command,
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise ExecutorError(f"the Iris command took over {timeout:g} s") from exc
        except OSError as exc:
            raise ExecutorError(f"the Iris command cannot start: {exc}") from exc
        return Answer(done.returncode, done.stdout, done.stderr)


# Runs in the site's Python on a local controller's machine: chdir, then become the job
# (its argument list given as JSON inside the code, never as arguments Iris could rewrite).
CHDIR_LAUNCHER = "import json, os; os.chdir(%r); a = json.loads(%r); os.execvp(a[0], a)"


def _which(program: str) -> str:
    return shutil.which(program) or ""


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _last_error(stderr: str, secret: dict[str, str]) -> str:
    """The gist of the command's complaint (its last meaningful line), secrets blanked."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    gist = next(
        (line for line in reversed(lines) if "Error" in line or "error" in line),
        lines[-1] if lines else "no reason given",
    )
    for value in secret.values():
        if value:
            gist = gist.replace(value, "***")
    return gist[:300]


# -- a recipe's ``resources`` block: what one job asks of the scheduler --------------------

SIZE = re.compile(r"^\d+(\.\d+)?\s*(B|K|M|G|T|KB|MB|GB|TB|KiB|MiB|GiB|TiB)$", re.IGNORECASE)
DEVICE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")
PLACE = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
PRIORITIES = ("production", "interactive", "batch")  # `system` is Iris's own
RESOURCE_KEYS = (
    "tpu",
    "gpu",
    "cpu",
    "memory",
    "disk",
    "region",
    "zone",
    "preemptible",
    "priority",
    "reserve",
    "replicas",
)


def resources_problems(value: Any) -> list[str]:
    """What is wrong with a recipe's ``resources`` (empty: nothing), each naming its key."""
    if value in (None, {}):
        return []
    if not isinstance(value, dict):
        return ["must be a mapping of tpu, gpu, cpu, memory, disk, region, zone, ... to values"]
    problems = []
    for key in value:
        if key not in RESOURCE_KEYS:
            problems.append(
                f"'{str(key)[:40]}' is not a resource (known: {', '.join(RESOURCE_KEYS)})"
            )
    for key in ("tpu", "gpu"):
        if key in value and not (isinstance(value[key], str) and DEVICE.match(value[key])):
            problems.append(f"{key}: a device type such as v5p-8 or H100x8 (letters, digits, -._:)")
    if value.get("tpu") and value.get("gpu"):
        problems.append("tpu and gpu: one job asks for one kind of accelerator")
    cpu = value.get("cpu")
    if "cpu" in value and (
        isinstance(cpu, bool) or not isinstance(cpu, int | float) or not 0 < cpu <= 1024
    ):
        problems.append("cpu: a number of cores above 0, at most 1024")
    for key in ("memory", "disk"):
        if key in value and not (isinstance(value[key], str) and SIZE.match(value[key].strip())):
            problems.append(f"{key}: a size such as 16GB or 512MiB")
    regions = value.get("region")
    if "region" in value and not (
        isinstance(regions, list)
        and 0 < len(regions) <= 16
        and all(isinstance(r, str) and PLACE.match(r) for r in regions)
    ):
        problems.append("region: a list of region names such as us-central2")
    if "zone" in value and not (isinstance(value["zone"], str) and PLACE.match(value["zone"])):
        problems.append("zone: a zone name such as us-central2-b")
    if "preemptible" in value and not isinstance(value["preemptible"], bool):
        problems.append("preemptible: true or false")
    if "priority" in value and value["priority"] not in PRIORITIES:
        problems.append(f"priority: one of {', '.join(PRIORITIES)}")
    reserve = value.get("reserve")
    if "reserve" in value and not (
        isinstance(reserve, list)
        and 0 < len(reserve) <= 16
        and all(isinstance(r, str) and DEVICE.match(r) for r in reserve)
    ):
        problems.append("reserve: a list of [COUNT:]DEVICE such as v5p-8 or 4:H100x8")
    replicas = value.get("replicas")
    if "replicas" in value and (
        isinstance(replicas, bool) or not isinstance(replicas, int) or not 1 <= replicas <= 4096
    ):
        problems.append("replicas: a whole number from 1 to 4096")
    return problems
