"""The iris executor reaching its cluster as Marin does: by a controller's URL, a named
cluster (``iris --cluster NAME``) or a cluster config file (``iris --config PATH``), the
same options on every call (submit, status, logs, cancel); exactly one of them."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.core.cache import cache

from runs.executors import get_executor
from runs.executors import iris as iris_module
from runs.executors.base import ExecutorError, JobSpec, JobState
from runs.executors.iris import IrisExecutor, target_problem
from runs.executors.iris_process import Answer
from tests.runs.executors.iris_controller import IrisController, iris_controller  # noqa: F401
from tests.runs.runs_helpers import wait_for


@pytest.fixture(autouse=True)
def _no_backoff() -> None:
    cache.delete(iris_module.BACKOFF_KEY)


def job(tmp_path: Path, name: str, code: str) -> JobSpec:
    return JobSpec(
        job_id=f"{name}-attempt-1",
        argv=[sys.executable, "-c", code],
        workdir=tmp_path / name,
        env={"RUN_ID": "7", "RUN_TOKEN": "s3cr3t"},
        files={"config.json": json.dumps({"width": 32})},
    )


def test_exactly_one_way_to_the_cluster_is_set_up(tmp_path: Path) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text("name: x\n")
    assert target_problem(controller_url="", cluster="", config="") == (
        "no Iris controller is set up on this site "
        "(RUNS_IRIS_CONTROLLER_URL, RUNS_IRIS_CLUSTER or RUNS_IRIS_CONFIG)"
    )
    assert target_problem(controller_url="http://c:10000", cluster="marin", config="") == (
        "Iris is set up more than once (RUNS_IRIS_CONTROLLER_URL and RUNS_IRIS_CLUSTER): "
        "set only one of them"
    )
    assert "RUNS_IRIS_CLUSTER and RUNS_IRIS_CONFIG" in target_problem(
        controller_url="", cluster="marin", config=str(config)
    )
    assert target_problem(controller_url="", cluster="--help", config="") == (
        "RUNS_IRIS_CLUSTER '--help' is no cluster name (letters, digits, '.-_')"
    )
    assert target_problem(controller_url="", cluster="", config=str(tmp_path / "no.yaml")) == (
        f"RUNS_IRIS_CONFIG: there is no cluster config at {tmp_path / 'no.yaml'}"
    )
    for ok in ({"controller_url": "http://c:1"}, {"cluster": "marin"}, {"config": str(config)}):
        assert target_problem(**{"controller_url": "", "cluster": "", "config": "", **ok}) == ""


def test_unavailable_says_so_when_set_up_twice_or_not_at_all(settings: Any) -> None:
    settings.RUNS_IRIS_CONTROLLER_URL = "http://127.0.0.1:1"
    settings.RUNS_IRIS_CLUSTER = "marin"
    settings.RUNS_IRIS_CONFIG = ""
    executor = get_executor("iris")
    assert executor.unavailable().startswith("Iris is set up more than once")
    with pytest.raises(ExecutorError, match="set up more than once"):
        executor.submit(JobSpec(job_id="j", argv=["true"], workdir=Path("/nonexistent")))
    settings.RUNS_IRIS_CONTROLLER_URL = ""
    settings.RUNS_IRIS_CLUSTER = ""
    assert get_executor("iris").unavailable().startswith("no Iris controller is set up")


class Recorder:
    """Stands for the `iris` command: records each command line, answers as Iris would."""

    def __init__(self) -> None:
        self.commands: list[list[str]] = []

    def answer(self, executor: IrisExecutor, command: list[str]) -> Answer:
        self.commands.append(command)
        words = command[len(executor.command) :]
        if words[2:5] == ["rpc", "controller", "list-jobs"]:
            return Answer(0, json.dumps({"jobs": []}), "")
        if words[2:5] == ["rpc", "controller", "get-job-status"]:
            wanted = json.loads(words[-1])["job_id"]
            if wanted == "/nobody/gone":
                return Answer(1, "", f"connectrpc.errors.ConnectError: Job {wanted} not found\n")
            return Answer(
                0, json.dumps({"job": {"job_id": wanted, "state": "JOB_STATE_RUNNING"}}), ""
            )
        if words[2:5] == ["rpc", "controller", "terminate-job"]:
            return Answer(0, "{}", "")
        if words[2:4] == ["job", "run"]:
            return Answer(0, "/root/the-job\n", "")
        if words[2:4] == ["job", "logs"]:
            return Answer(0, "the log\n", "")
        return Answer(2, "", "Error: unexpected")


@pytest.mark.parametrize(
    ("setting", "target"),
    [("cluster", ["--cluster", "marin"]), ("config", ["--config", "CONFIG"])],
)
def test_every_call_names_the_cluster_or_its_config(
    monkeypatch: Any, settings: Any, tmp_path: Path, setting: str, target: list[str]
) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text("name: marin\n")
    target = [str(config) if word == "CONFIG" else word for word in target]
    settings.RUNS_IRIS_CONTROLLER_URL = ""
    settings.RUNS_IRIS_CLUSTER = "marin" if setting == "cluster" else ""
    settings.RUNS_IRIS_CONFIG = str(config) if setting == "config" else ""
    settings.RUNS_IRIS_SUBMITTER = "command"
    recorder = Recorder()

    def run(self: IrisExecutor, command: list[str], **kwargs: Any) -> Answer:
        return recorder.answer(self, command)

    monkeypatch.setattr(IrisExecutor, "_run", run)
    executor = IrisExecutor(command=sys.executable)  # a command that exists
    assert executor.unavailable() == ""
    assert executor.submit(job(tmp_path, "one", "print(1)")) == "/root/the-job"
    assert executor.poll("/root/the-job").state == JobState.RUNNING
    missing = executor.poll("/nobody/gone")
    assert missing.state == JobState.MISSING
    executor.cancel("/root/the-job")
    assert executor.logs("/root/the-job") == "the log\n"
    heads = [command[1:5] for command in recorder.commands]
    assert [command[1:3] for command in recorder.commands] == [target] * len(heads)
    assert [head[2:] for head in heads] == [
        ["rpc", "controller"],  # unavailable: list-jobs
        ["rpc", "controller"],  # the look-up by name before the submit
        ["rpc", "controller"],  # again under the submit's lock
        ["job", "run"],
        ["rpc", "controller"],
        ["rpc", "controller"],
        ["rpc", "controller"],  # terminate-job
        ["job", "logs"],
    ]
    assert [command[5] for command in recorder.commands if command[3] == "rpc"] == [
        "list-jobs",
        "list-jobs",
        "list-jobs",
        "get-job-status",
        "get-job-status",
        "terminate-job",
    ]
    assert not any("s3cr3t" in word for command in recorder.commands for word in command)
    assert not any("--controller-url" in command for command in recorder.commands)


def test_a_cluster_that_does_not_answer_is_said_by_its_name(
    monkeypatch: Any, settings: Any
) -> None:
    settings.RUNS_IRIS_CONTROLLER_URL = ""
    settings.RUNS_IRIS_CLUSTER = "marin"
    settings.RUNS_IRIS_CONFIG = ""
    settings.RUNS_IRIS_SUBMITTER = "command"

    def down(executor: IrisExecutor, command: list[str], **kwargs: Any) -> Answer:
        return Answer(1, "", "click.exceptions.ClickException: Error: Could not connect\n")

    monkeypatch.setattr(IrisExecutor, "_run", down)
    reason = IrisExecutor(command=sys.executable).unavailable()
    assert reason.startswith("Iris cluster marin does not answer ListJobs: "), reason
    assert "tried again in" in IrisExecutor(command=sys.executable).unavailable()


@pytest.mark.iris
@pytest.mark.django_db
def test_a_job_runs_on_a_cluster_named_by_its_config_file(
    iris_controller: IrisController,  # noqa: F811
    settings: Any,
    tmp_path: Path,
) -> None:
    """A manual cluster's config whose controller is the local test controller: submit,
    status, logs and cancel all go through `iris --config PATH`, none by the URL."""
    config = tmp_path / "cluster.yaml"
    config.write_text(
        "name: site-test\n"
        "platform:\n  manual: {}\n"
        "controller:\n  manual:\n    host: 127.0.0.1\n"
        "defaults:\n  worker:\n    docker_image: none\n"
        f"    controller_address: {iris_controller.url}\n"
    )
    settings.RUNS_IRIS_CONTROLLER_URL = ""
    settings.RUNS_IRIS_CLUSTER = ""
    settings.RUNS_IRIS_CONFIG = str(config)
    settings.RUNS_IRIS_COMMAND = iris_controller.command
    settings.RUNS_IRIS_HOME = iris_controller.home
    settings.RUNS_IRIS_LOCAL = True
    settings.RUNS_IRIS_LOGS_TIMEOUT = 180
    settings.RUNS_IRIS_JOB_PREFIX = f"c{uuid.uuid4().hex[:10]}"
    executor = get_executor("iris")
    assert isinstance(executor, IrisExecutor)
    assert executor.unavailable() == ""
    job_id = executor.submit(job(tmp_path, "by-config", "print('trained by config')"))
    assert job_id.startswith("/")
    assert executor.submit(job(tmp_path, "by-config", "print('again')")) == job_id  # found

    def ended() -> JobState | None:
        status = executor.poll(job_id)
        return status.state if status.is_done else None

    assert wait_for(ended, timeout=240) == JobState.SUCCEEDED
    assert "trained by config" in executor.logs(job_id)
    assert executor.poll("/nobody/never-was").state == JobState.MISSING
    executor.cancel("/nobody/never-was")  # a job Iris does not know is stopped
