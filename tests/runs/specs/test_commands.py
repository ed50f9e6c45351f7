"""Command templates without a shell: placeholders, allowed environment variables, how
overrides reach the script, and the checks made when a recipe is saved."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from runs.recipes.demo import TINY_MOE
from runs.specs.commands import (
    CommandError,
    Launch,
    RunValues,
    command_fill,
    command_store,
    launch_problems,
)

DEFAULTS = {"learning_rate": 0.003, "model": {"width": 64}, "name": "base", "flag": False}
ENV = {"RUN_ID": "7", "RUN_TOKEN": "mrun_secret", "RUN_API_URL": "http://site/api/v1/"}


def values(**changes: Any) -> RunValues:
    base: dict[str, Any] = {
        "run_id": 7,
        "config": {**DEFAULTS, "learning_rate": 0.01, "model": {"width": 128}},
        "default_config": DEFAULTS,
        "python": "/usr/bin/python3",
        "run_name": "grug-d512-run7",
        "scale": "d512",
        "seed": 3,
        "version": "2",
        "attempt": 2,
        "git_sha": "abc123",
        "output_root": "gs://bucket/grug/run-7",
        "env": ENV,
    }
    return RunValues(**{**base, **changes})


def fill(template: Any, launch: dict[str, Any] | None = None, **changes: Any) -> Any:
    return command_fill(
        template=template, launch=Launch.from_data(launch or {}), values=values(**changes)
    )


def problems(command: Any, launch: Any = None) -> dict[str, list[str]]:
    return launch_problems(command=command, launch_data=launch, default_config=DEFAULTS)


def test_stored_tiny_command_still_fills_as_before() -> None:
    filled = fill("{python} -m runs.tiny_moe --config {config_path}")
    assert filled.argv == ["/usr/bin/python3", "-m", "runs.tiny_moe", "--config", "config.json"]
    assert filled.env == {}
    assert problems("{python} -m runs.tiny_moe --config {config_path}") == {}
    assert problems(TINY_MOE["command_template"]) == {}


def test_run_placeholders_and_config_values_fill_one_argument_each() -> None:
    template = [
        "{python}",
        "-m",
        "experiments.grug.moe.launch",
        "--version",
        "{version}",
        "--lr={config.learning_rate}",
        "--width",
        "{config.model.width}",
        "--name",
        "{run_name}",
        "--out",
        "{output_root}/{scale}/s{seed}",
        "--flag",
        "{config.flag}",
        "--sha={git_sha}",
        "a{attempt}-{run_id}",
    ]
    filled = fill(template, config={**DEFAULTS, "learning_rate": 0.01, "model": {"width": 128}})
    assert filled.argv == [
        "/usr/bin/python3",
        "-m",
        "experiments.grug.moe.launch",
        "--version",
        "2",
        "--lr=0.01",
        "--width",
        "128",
        "--name",
        "grug-d512-run7",
        "--out",
        "gs://bucket/grug/run-7/d512/s3",
        "--flag",
        "false",
        "--sha=abc123",
        "a2-7",
    ]


def test_a_value_with_spaces_and_quotes_stays_one_argument_never_syntax() -> None:
    config = {**DEFAULTS, "name": "it's; rm -rf / $RUN_TOKEN"}
    filled = fill("train --name {config.name}", config=config)
    assert filled.argv == ["train", "--name", "it's; rm -rf / $RUN_TOKEN"]


def test_allowed_environment_variables_expand_and_secrets_are_shown_by_name() -> None:
    filled = fill("train --token $RUN_TOKEN --id=${RUN_ID} --price $$5")
    assert filled.argv == ["train", "--token", "mrun_secret", "--id=7", "--price", "$5"]
    assert filled.shown == ["train", "--token", "$RUN_TOKEN", "--id=7", "--price", "$5"]
    assert "mrun_secret" not in shlex.join(filled.shown)


def test_unknown_placeholder_refuses_the_recipe_naming_it() -> None:
    found = problems("train --lr {config.learnin_rate} --x {scael}")
    assert "{config.learnin_rate}" in found["command_template"][0]
    found = problems("train --x {scael}")
    assert "unknown placeholder {scael}" in found["command_template"][0]
    assert "{output_root}" in found["command_template"][0]  # it lists what is known


def test_environment_variable_outside_the_allow_list_refuses_the_recipe() -> None:
    found = problems("train --key $WANDB_API_KEY")
    assert "$WANDB_API_KEY" in found["command_template"][0]
    assert problems("train --key $WANDB_PROJECT", {"env": {"WANDB_PROJECT": "marin"}}) == {}
    assert "lone '$'" in problems("train --cost 5$")["command_template"][0]


@pytest.mark.parametrize(
    ("command", "words"),
    [
        ("train {config.learning_rate!r}", "formats and conversions"),
        ("train {config.learning_rate:.3f}", "formats and conversions"),
        ("train 'unclosed", "cannot be split"),
        ("", "is empty"),
        (["train", 3], "must be text"),
        ("train {0}", "unknown placeholder {0}"),
        ("train }", "braces"),
    ],
)
def test_malformed_commands_are_refused_in_words(command: Any, words: str) -> None:
    assert words in problems(command)["command_template"][0]


def test_launch_options_are_checked_by_name() -> None:
    found = problems("train", {"overrides": "yaml", "colour": 1, "env": {"lower": "x"}})
    text = " ".join(found["launch"])
    assert "overrides must be one of config_file, flags, env" in text
    assert "'colour' is not a launch option" in text
    assert "'lower' is not an upper-case variable name" in text
    assert "RUN_ID is set by the site" in " ".join(
        problems("t", {"env": {"RUN_ID": "1"}})["launch"]
    )
    found = problems("train --run", {"dry_run": {"drop": ["--go"], "append": ["{nope}"]}})
    assert "{nope}" in " ".join(found["launch"])
    assert "--go is not an argument" in " ".join(found["launch"])
    assert "must be a mapping" in problems("t", ["x"])["launch"][0]


def test_overrides_as_flags_pass_only_what_differs_from_the_defaults() -> None:
    filled = fill("{python} train.py", {"overrides": "flags"})
    assert filled.argv[2:] == ["--learning_rate", "0.01", "--model.width", "128"]
    filled = fill("{python} train.py", {"overrides": "flags", "flag_style": "equals"})
    assert filled.argv[2:] == ["--learning_rate=0.01", "--model.width=128"]


def test_overrides_as_environment_and_recipe_env_reach_the_job() -> None:
    launch = {"overrides": "env", "env_prefix": "GRUG_", "env": {"WANDB_NAME": "{run_name}"}}
    filled = fill("train --name $WANDB_NAME", launch)
    assert filled.env == {
        "WANDB_NAME": "grug-d512-run7",
        "GRUG_LEARNING_RATE": "0.01",
        "GRUG_MODEL_WIDTH": "128",
    }
    assert filled.argv == ["train", "--name", "grug-d512-run7"]


def test_dry_run_drops_and_appends_arguments() -> None:
    launch = Launch.from_data({"dry_run": {"drop": ["--run"], "append": ["--dry_run", "true"]}})
    filled = command_fill(
        template="python -m launch --version {version} --run",
        launch=launch,
        values=values(),
        dry_run=True,
    )
    assert filled.argv == ["python", "-m", "launch", "--version", "2", "--dry_run", "true"]


def test_a_list_command_is_stored_as_its_words_and_reads_back_the_same() -> None:
    words = ["python", "-c", "print('a b')", "{config.name}"]
    stored = command_store(words)
    assert isinstance(stored, str)
    assert fill(stored).argv == ["python", "-c", "print('a b')", "base"]


def test_a_config_key_missing_at_fill_time_says_which() -> None:
    with pytest.raises(CommandError, match=r"no 'model\.depth'"):
        fill("train {config.model.depth}")
