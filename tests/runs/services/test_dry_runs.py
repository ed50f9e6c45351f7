"""Dry runs: the recipe's script in its plan-only mode as a CPU job, its output read for the
steps, FLOPs and cost it says it would spend, beside the site's estimate."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runs.executors.local import LocalExecutor
from runs.models import DryRun, DryRunState
from runs.services import dry_runs
from runs.services.recipes import recipe_update
from tests.runs.runs_helpers import eager_tasks, wait_for  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("eager_tasks")]

# Prints its plan when given --dry_run true; trains (here: fails) when given --run.
SCRIPT = (
    "import json, sys; args = sys.argv[1:]; "
    "assert '--run' not in args, 'the dry run must not train'; "
    "print('would train', json.load(open('config.json'))['steps'], 'steps'); "
    "print('DRY_RUN', json.dumps(dict(steps=12, flops=3.5e12, cost=0.25)))"
)


@pytest.fixture(autouse=True)
def _run_dir(settings: Any, tmp_path: Path) -> Iterator[None]:
    settings.RUNS_WORK_DIR = tmp_path / "runs"
    yield
    for workdir in (tmp_path / "runs").glob("dry-run-*"):
        LocalExecutor().cancel(str(workdir))


def settle(dry_run: DryRun) -> DryRun:
    def ended() -> DryRun | None:
        done = dry_runs.dry_run_settle(dry_run_id=dry_run.pk)
        return done if done is not None and done.state in ("succeeded", "failed") else None

    result: DryRun = wait_for(ended, timeout=30, every=0.2)
    return result


def with_script(recipe: Any, script: str) -> Any:
    return recipe_update(
        recipe=recipe,
        data={
            "command_template": ["{python}", "-c", script, "--version", "{version}", "--run"],
            "launch": {"dry_run": {"drop": ["--run"], "append": ["--dry_run", "true"]}},
        },
    )


def test_figures_are_read_from_the_marker_line_or_the_words() -> None:
    assert dry_runs.dry_run_figures('x\nDRY_RUN {"steps": 5, "flops": 1e18, "cost": 12.5}\n') == {
        "steps": 5.0,
        "flops": 1e18,
        "cost": 12.5,
    }
    words = "Plan: 2,000 steps, total FLOPs: 1.2e+19, estimated cost $1,234.50"
    assert dry_runs.dry_run_figures(words) == {"steps": 2000.0, "flops": 1.2e19, "cost": 1234.5}
    assert dry_runs.dry_run_figures("nothing to say") == {}


def test_a_dry_run_runs_the_plan_only_mode_and_keeps_its_figures(
    recipe: Any, maintainer: Any, django_capture_on_commit_callbacks: Any
) -> None:
    recipe = with_script(recipe, SCRIPT)
    config = {**recipe.default_config, "steps": 12}
    with django_capture_on_commit_callbacks(execute=True):
        dry_run = dry_runs.dry_run_start(
            recipe=recipe, config=config, subject="proposal-1", actor=maintainer
        )
    assert dry_run.command.endswith("--version 1 --dry_run true")
    assert "--run" not in dry_run.command.split()
    done = settle(dry_run)
    assert done.state == DryRunState.SUCCEEDED, done.output
    assert done.figures == {"steps": 12.0, "flops": 3.5e12, "cost": 0.25}
    assert "would train 12 steps" in done.output
    assert done.estimate["flops"] > 0  # the site's own, beside it


def test_a_failing_dry_run_says_so_with_its_output(
    recipe: Any, maintainer: Any, django_capture_on_commit_callbacks: Any
) -> None:
    recipe = with_script(recipe, "import sys; print('no data for d768'); sys.exit(3)")
    with django_capture_on_commit_callbacks(execute=True):
        dry_run = dry_runs.dry_run_start(
            recipe=recipe, config=dict(recipe.default_config), subject="proposal-2", actor=None
        )
    done = settle(dry_run)
    assert done.state == DryRunState.FAILED
    assert "no data for d768" in done.output
    assert done.reason
