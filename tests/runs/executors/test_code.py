"""Code at the pinned commit: a clean checkout per commit from a cached mirror, a source
archive of it, and a commit that does not exist refused by name; then a local job that
imports its code from the checkout (a repository made in the test; no network)."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runs.executors.code import CodeError, archive_path, checkout_materialize, commit_resolve
from runs.executors.local import LocalExecutor
from runs.models import PlanLaunch, Run, RunState
from runs.services import dispatch as dispatching
from runs.services import reconcile
from tests.runs.git_helpers import git, repo_fixture  # noqa: F401  (the repo fixture)
from tests.runs.runs_helpers import launched_plan, wait_for


@pytest.fixture(autouse=True)
def _dirs(settings: Any, tmp_path: Path) -> Iterator[None]:
    settings.RUNS_CODE_DIR = tmp_path / "code"
    settings.RUNS_WORK_DIR = tmp_path / "runs"
    settings.RUNS_LOCAL_GRACE_SECONDS = 0.5
    yield
    for workdir in (tmp_path / "runs").glob("run-*/attempt-*"):
        LocalExecutor().cancel(str(workdir))


def test_a_checkout_is_the_pinned_commit_clean_and_made_once(repo: Path) -> None:
    first = git("rev-parse", "HEAD~1", cwd=repo)
    checkout = checkout_materialize(repository=str(repo), ref=first[:10])
    assert checkout.sha == first
    assert checkout.clean
    assert "'first'" in (checkout.path / "pinned_job" / "__main__.py").read_text()
    again = checkout_materialize(repository=str(repo), ref=first)
    assert again.path == checkout.path
    (checkout.path / "stray.txt").write_text("a job wrote here")
    assert not checkout_materialize(repository=str(repo), ref=first).clean


def test_a_new_commit_is_fetched_into_the_cached_mirror(repo: Path) -> None:
    commit_resolve(repository=str(repo), ref="main")
    (repo / "later.txt").write_text("x")
    git("add", ".", cwd=repo)
    git("commit", "--quiet", "-m", "later", cwd=repo)
    later = git("rev-parse", "HEAD", cwd=repo)
    assert commit_resolve(repository=str(repo), ref=later) == later


@pytest.mark.parametrize("ref", ["0" * 40, "no-such-branch", "--upload-pack=evil", "a..b"])
def test_a_commit_that_does_not_exist_is_refused_naming_it(repo: Path, ref: str) -> None:
    with pytest.raises(CodeError, match=r"does not exist|is not a git ref"):
        commit_resolve(repository=str(repo), ref=ref)


def test_the_source_archive_holds_the_commit_tree(repo: Path) -> None:
    first = git("rev-parse", "HEAD~1", cwd=repo)
    path = archive_path(repository=str(repo), sha=first)
    with tarfile.open(fileobj=io.BytesIO(path.read_bytes()), mode="r:gz") as tar:
        member = tar.extractfile("pinned_job/__main__.py")
        assert member is not None and b"'first'" in member.read()
    with pytest.raises(CodeError, match="full commit SHA"):
        archive_path(repository=str(repo), sha="main")


@pytest.mark.django_db
def test_a_local_job_runs_the_pinned_commit_and_the_run_records_it(
    recipe: Any, repo: Path, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    settings.RUNS_CODE_REPOSITORY = str(repo)
    first = git("rev-parse", "HEAD~1", cwd=repo)
    plan = launched_plan(recipe, "", git_ref=first[:12])
    PlanLaunch.objects.filter(plan=plan).update(command_template="{python} -m pinned_job")
    with django_capture_on_commit_callbacks(execute=True):
        dispatching.runs_dispatch()
    run = Run.objects.get(plan=plan)
    assert run.git_sha == first and run.git_clean is True

    def finished() -> Run | None:
        reconcile.run_reconcile(run_id=run.pk)
        done = Run.objects.get(pk=run.pk)
        return done if done.state == RunState.FINISHED else None

    wait_for(finished, timeout=30, every=0.2)
    which = dispatching.run_workdir(run=run) / "which.json"
    assert json.loads(which.read_text()) == {"version": "first"}


@pytest.mark.django_db
def test_a_local_job_importing_from_the_checkout_leaves_it_clean_for_the_next_run(
    recipe: Any, repo: Path, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    """The checkout is shared by every job at its commit: a job importing a module from it
    writes no bytecode there, so the next run at that commit is still recorded clean."""
    (repo / "pinned_lib.py").write_text("import json, pathlib\n"
                                        "pathlib.Path('which.json').write_text(json.dumps('lib'))\n")  # fmt: skip
    git("add", ".", cwd=repo)
    git("commit", "--quiet", "-m", "a module to import", cwd=repo)
    head = git("rev-parse", "HEAD", cwd=repo)
    settings.RUNS_CODE_REPOSITORY = str(repo)
    plan = launched_plan(recipe, "", git_ref=head)
    PlanLaunch.objects.filter(plan=plan).update(command_template='{python} -c "import pinned_lib"')
    with django_capture_on_commit_callbacks(execute=True):
        dispatching.runs_dispatch()
    run = Run.objects.get(plan=plan)

    def ended() -> Run | None:
        reconcile.run_reconcile(run_id=run.pk)
        done = Run.objects.get(pk=run.pk)
        return done if done.state in {RunState.FINISHED, RunState.FAILED} else None

    assert wait_for(ended, timeout=30, every=0.2).state == RunState.FINISHED
    assert json.loads((dispatching.run_workdir(run=run) / "which.json").read_text()) == "lib"
    checkout = checkout_materialize(repository=str(repo), ref=head)
    assert not list(checkout.path.rglob("*.pyc"))
    assert checkout.clean


@pytest.mark.django_db
def test_a_pinned_commit_that_does_not_exist_fails_the_run_before_submitting(
    recipe: Any, repo: Path, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    settings.RUNS_CODE_REPOSITORY = str(repo)
    plan = launched_plan(recipe, "", git_ref="f" * 40)
    with django_capture_on_commit_callbacks(execute=True):
        dispatching.runs_dispatch()
    run = Run.objects.get(plan=plan)
    assert run.state == RunState.FAILED
    assert run.failure_kind == "config"
    assert f"commit {'f' * 40} does not exist in {repo}; nothing was submitted" in run.state_reason
    assert not dispatching.run_workdir(run=run).exists()
