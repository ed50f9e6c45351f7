"""A recipe's command, filled without a shell: an argument list whose arguments may hold
placeholders from the run (``{config.learning_rate}``, ``{scale}``, ``{run_id}``,
``{version}``, ``{output_root}``, ``{python}``, ``{config_path}``...) and environment
variables from an allow-list (``$RUN_ID``, ``${RUN_TOKEN}``; ``$$`` is a dollar sign), and
how the run's overrides reach the script (``launch.overrides``: a config file, flags or
environment variables).

Everything is checked when the recipe is saved (``launch_problems``): an unknown placeholder
or environment variable refuses the recipe, naming it. Filling (``command_fill``) takes
plain values, so every executor, the agents' leases and the claims build the same argv
(``runs/services/dispatch.py`` is the one caller that reads the database). No Django here.

A stored command is a string of shell-like words (``{python} -m trainers.tiny_moe --config
{config_path}``) split with ``shlex`` before any placeholder is filled, so a value holding
spaces or quotes stays one argument and is never read as syntax; a recipe file may write
the command as a YAML list instead, stored as those words (``shlex.join``).
"""

from __future__ import annotations

import functools
import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Placeholders from the run, with what they mean (shown in docs and refusals).
RUN_PLACEHOLDERS: dict[str, str] = {
    "python": "the Python that runs the job (an agent's own)",
    "config_path": "the run's resolved config as a JSON file in the job's folder",
    "run_id": "the run's id on the site",
    "run_name": "the name of the run's tracker run (W&B), unique per run",
    "scale": "the run's scale name (empty without scales)",
    "seed": "the run's seed (empty without seeds)",
    "version": "the recipe's version",
    "attempt": "the attempt number (1, then 2 after a preemption...)",
    "git_sha": "the code version pinned at approval",
    "output_root": "where the run writes its outputs, the same on every attempt",
}
CONFIG_PREFIX = "config."

# Environment variables the site sets on every job: a command may name them.
JOB_ENV_NAMES = (
    "RUN_ID",
    "RUN_TOKEN",
    "RUN_API_URL",
    "RUN_ATTEMPT",
    "RUN_GIT_SHA",
    "RUN_GIT_REF",
    "RUN_NAME",
    "RUN_OUTPUT_ROOT",
    "MLFLOW_TRACKING_URI",
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_EXPERIMENT_ID",
)
# Their values never appear in a recorded command, a log or a page: ``$NAME`` is shown.
SECRET_JOB_ENV = frozenset({"RUN_TOKEN", "MLFLOW_TRACKING_TOKEN"})

OVERRIDE_MODES = ("config_file", "flags", "env")
FLAG_STYLES = ("space", "equals")
LAUNCH_KEYS = (
    "overrides",
    "flag_style",
    "env_prefix",
    "env",
    "dry_run",
    "trainings",
    "executors",
)
MAX_EXECUTORS = 20
DRY_RUN_KEYS = ("append", "drop")
MAX_ARGS = 200
MAX_ENV = 50
ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,63}")
PLACEHOLDER_NAME = re.compile(r"[a-z_]+(\.[A-Za-z0-9_\-]+)*")


class CommandError(ValueError):
    """A command or launch option that cannot be used, in words naming what is wrong."""


@dataclass(frozen=True)
class Launch:
    """How a recipe's runs are launched, besides the command itself (``Recipe.launch``)."""

    overrides: str = "config_file"
    flag_style: str = "space"
    env_prefix: str = ""
    env: dict[str, str] = field(default_factory=dict)  # name -> template of one argument
    dry_run_append: list[str] = field(default_factory=list)
    dry_run_drop: list[str] = field(default_factory=list)
    trainings: str = ""  # "" (one run per job) or "plan": one job trains the plan's runs
    # The executors and pools a launch may choose (empty: any); names checked by
    # runs.services.recipes.recipe_validate, the choice by runs.services.plans.plan_launch.
    executors: list[str] = field(default_factory=list)

    @classmethod
    def from_data(cls, data: Any) -> Launch:
        """The options ``data`` (a recipe's ``launch`` mapping) says; CommandError if it is
        not one ``launch_problems`` accepts."""
        problems = launch_shape_problems(data)
        if problems:
            raise CommandError("; ".join(problems))
        data = data or {}
        dry = data.get("dry_run") or {}
        return cls(
            overrides=data.get("overrides") or "config_file",
            flag_style=data.get("flag_style") or "space",
            env_prefix=data.get("env_prefix") or "",
            env=dict(data.get("env") or {}),
            dry_run_append=list(dry.get("append") or []),
            dry_run_drop=list(dry.get("drop") or []),
            trainings=data.get("trainings") or "",
            executors=list(data.get("executors") or []),
        )


@dataclass(frozen=True)
class RunValues:
    """What a run's placeholders are filled from (plain values, no database)."""

    run_id: int
    config: Mapping[str, Any]
    default_config: Mapping[str, Any] = field(default_factory=dict)
    python: str = "python"
    config_path: str = "config.json"
    run_name: str = ""
    scale: str = ""
    seed: int | None = None
    version: str = ""
    attempt: int = 1
    git_sha: str = ""
    output_root: str = ""
    env: Mapping[str, str] = field(default_factory=dict)  # the job's environment, as set


@dataclass(frozen=True)
class Filled:
    """A filled command: the argv to execute, the argv to show (secrets as ``$NAME``), and
    the environment variables it adds to the job's."""

    argv: list[str]
    shown: list[str]
    env: dict[str, str]


@functools.lru_cache(maxsize=256)
def _split(template: str) -> tuple[str, ...]:
    """A command's words (a plan's runs share its command: a lease batch splits it once)."""
    return tuple(shlex.split(template))


def command_words(template: Any) -> list[str]:
    """The arguments of a stored command (words) or of a list; CommandError if unusable."""
    if isinstance(template, list):
        if not all(isinstance(arg, str) for arg in template):
            raise CommandError("every argument must be text")
        words = list(template)
    elif isinstance(template, str):
        try:
            words = list(_split(template))
        except ValueError as exc:
            raise CommandError(f"cannot be split into arguments: {exc}") from exc
    else:
        raise CommandError("must be text or a list of arguments")
    if not words:
        raise CommandError("is empty")
    if len(words) > MAX_ARGS:
        raise CommandError(f"has more than {MAX_ARGS} arguments")
    return words


def command_store(template: Any) -> str:
    """How a command (text or a list of arguments) is stored: its words, shell-quoted."""
    if isinstance(template, list):
        return " ".join(_quoted(word) for word in command_words(template))
    return template if isinstance(template, str) else ""


def _quoted(word: str) -> str:
    """A word as ``shlex.split`` reads it back: bare when it can be (placeholders stay
    readable: ``{python}``), quoted otherwise."""
    return word if re.fullmatch(r"[\w@%+=:,./{}$-]+", word) else shlex.quote(word)


_TOKEN = re.compile(
    r"(?P<dollar>\$\$)|\$\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)\}|\$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<lone>\$)|(?P<open>\{\{)|(?P<close>\}\})|\{(?P<field>[^{}]*)\}|(?P<brace>[{}])"
    r"|(?P<text>[^${}]+)"
)


def _pieces(arg: str) -> list[tuple[str, str]]:
    """An argument as (kind, value) pairs: ``text``, ``placeholder`` (its name) or ``env``
    (a variable's name); CommandError naming what cannot be read."""
    pieces: list[tuple[str, str]] = []
    for match in _TOKEN.finditer(arg):
        kind = match.lastgroup
        if kind == "dollar":
            pieces.append(("text", "$"))
        elif kind in ("braced", "bare"):
            pieces.append(("env", match.group(kind)))
        elif kind == "lone":
            raise CommandError(
                f"a lone '$' in {arg[:60]!r}: write $NAME, ${{NAME}}, or $$ for a dollar sign"
            )
        elif kind == "open":
            pieces.append(("text", "{"))
        elif kind == "close":
            pieces.append(("text", "}"))
        elif kind == "field":
            name = match.group("field")
            if ":" in name or "!" in name:
                raise CommandError(
                    f"placeholder {{{name[:60]}}} in {arg[:60]!r}: formats and conversions "
                    "are not accepted"
                )
            if not PLACEHOLDER_NAME.fullmatch(name):
                raise CommandError(f"unknown placeholder {{{name[:60]}}} in {arg[:60]!r}")
            pieces.append(("placeholder", name))
        elif kind == "brace":
            raise CommandError(
                f"a single '{match.group('brace')}' in {arg[:60]!r} (write {{{{ and }}}} for braces)"
            )
        else:
            pieces.append(("text", match.group("text")))
    return pieces


def _config_value(config: Mapping[str, Any], path: str) -> Any:
    value: Any = config
    for key in path.split("."):
        if not isinstance(value, Mapping) or key not in value:
            raise KeyError(path)
        value = value[key]
    return value


def argument_text(value: Any) -> str:
    """A config value as one argument: text as is, true/false, numbers and structures as JSON."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _allowed_env(launch: Launch) -> set[str]:
    return set(JOB_ENV_NAMES) | set(launch.env)


def _check_argument(
    arg: str, *, default_config: Mapping[str, Any], allowed_env: set[str], where: str
) -> None:
    for kind, name in _pieces(arg):
        if kind == "env" and name not in allowed_env:
            raise CommandError(
                f"{where}: ${name[:60]} is not an environment variable a command may "
                f"name (allowed: {', '.join(sorted(allowed_env))}; add it to launch.env, "
                "or let the job read it from its environment)"
            )
        if kind != "placeholder":
            continue
        if name.startswith(CONFIG_PREFIX):
            try:
                _config_value(default_config, name[len(CONFIG_PREFIX) :])
            except KeyError:
                raise CommandError(
                    f"{where}: unknown placeholder {{{name[:80]}}}: the default config has no "
                    f"'{name[len(CONFIG_PREFIX) :][:80]}'"
                ) from None
        elif name not in RUN_PLACEHOLDERS:
            raise CommandError(
                f"{where}: unknown placeholder {{{name[:60]}}} (known: "
                f"{', '.join('{' + n + '}' for n in RUN_PLACEHOLDERS)}, {{config.<key>}})"
            )


def launch_shape_problems(data: Any) -> list[str]:
    """What is wrong with the shape of a recipe's ``launch`` mapping (types and names)."""
    if data in (None, {}):
        return []
    if not isinstance(data, dict):
        return [f"must be a mapping ({', '.join(LAUNCH_KEYS)})"]
    problems = [
        f"'{str(key)[:40]}' is not a launch option (they are: {', '.join(LAUNCH_KEYS)})"
        for key in data
        if key not in LAUNCH_KEYS
    ]
    if data.get("overrides", "config_file") not in OVERRIDE_MODES:
        problems.append(f"overrides must be one of {', '.join(OVERRIDE_MODES)}")
    if data.get("flag_style", "space") not in FLAG_STYLES:
        problems.append(f"flag_style must be one of {', '.join(FLAG_STYLES)}")
    prefix = data.get("env_prefix", "")
    if not isinstance(prefix, str) or (prefix and not ENV_NAME.fullmatch(prefix)):
        problems.append("env_prefix must be upper-case letters, digits and '_'")
    env = data.get("env", {})
    if not isinstance(env, dict) or len(env) > MAX_ENV:
        problems.append(f"env must map at most {MAX_ENV} variable names to text")
    else:
        for name, value in env.items():
            if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
                problems.append(f"env: '{str(name)[:40]}' is not an upper-case variable name")
            elif name in JOB_ENV_NAMES:
                problems.append(f"env: {name} is set by the site on every job")
            if not isinstance(value, str | int | float) or isinstance(value, bool):
                problems.append(f"env: {str(name)[:40]} must be text")
    dry = data.get("dry_run", {})
    if not isinstance(dry, dict) or any(key not in DRY_RUN_KEYS for key in dry):
        problems.append("dry_run must be a mapping of append and drop, each a list of arguments")
    else:
        for key in DRY_RUN_KEYS:
            value = dry.get(key, [])
            if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
                problems.append(f"dry_run.{key} must be a list of arguments")
    if data.get("trainings", "") not in ("", "plan"):
        problems.append("trainings must be 'plan' (one job trains the plan's runs) or left out")
    executors = data.get("executors", [])
    if (
        not isinstance(executors, list)
        or len(executors) > MAX_EXECUTORS
        or not all(isinstance(name, str) and name for name in executors)
    ):
        problems.append(
            f"executors must be a list of at most {MAX_EXECUTORS} executor names "
            "(local, ray, iris, pool:<name>)"
        )
    return problems


def launch_problems(
    *, command: Any, launch_data: Any, default_config: Mapping[str, Any]
) -> dict[str, list[str]]:
    """Why a recipe's command and launch options cannot be saved, by field ({} when they can)."""
    problems: dict[str, list[str]] = {}
    shape = launch_shape_problems(launch_data)
    if shape:
        problems["launch"] = shape
    launch = Launch() if shape else Launch.from_data(launch_data)
    allowed = _allowed_env(launch)
    try:
        words = command_words(command)
        for arg in words:
            _check_argument(
                arg, default_config=default_config, allowed_env=allowed, where="command_template"
            )
    except CommandError as exc:
        problems.setdefault("command_template", []).append(str(exc))
        words = []
    if shape:
        return problems
    checks = [(f"launch.env.{name}", str(value)) for name, value in launch.env.items()]
    checks += [("launch.dry_run.append", arg) for arg in launch.dry_run_append]
    for where, arg in checks:
        try:
            # An env value may not name itself or another recipe variable: only the job's.
            _check_argument(
                arg,
                default_config=default_config,
                allowed_env=set(JOB_ENV_NAMES),
                where=where,
            )
        except CommandError as exc:
            problems.setdefault("launch", []).append(str(exc))
    missing = [arg for arg in launch.dry_run_drop if words and arg not in words]
    if missing:
        problems.setdefault("launch", []).append(
            f"dry_run.drop: {', '.join(m[:40] for m in missing)} is not an argument of the command"
        )
    return problems


def _fill_argument(arg: str, values: RunValues, env: Mapping[str, str]) -> tuple[str, str]:
    """One argument filled: (to execute, to show)."""
    run_values = {
        "python": values.python,
        "config_path": values.config_path,
        "run_id": str(values.run_id),
        "run_name": values.run_name,
        "scale": values.scale,
        "seed": "" if values.seed is None else str(values.seed),
        "version": values.version,
        "attempt": str(values.attempt),
        "git_sha": values.git_sha,
        "output_root": values.output_root,
    }
    out, shown = [], []
    for kind, name in _pieces(arg):
        if kind == "text":
            out.append(name)
            shown.append(name)
        elif kind == "env":
            if name not in env:
                raise CommandError(f"${name} is not set for this job")
            out.append(env[name])
            shown.append(f"${name}" if name in SECRET_JOB_ENV else env[name])
        elif name.startswith(CONFIG_PREFIX):
            try:
                value = argument_text(_config_value(values.config, name[len(CONFIG_PREFIX) :]))
            except KeyError:
                raise CommandError(
                    f"the run's config has no '{name[len(CONFIG_PREFIX) :]}' for {{{name}}}"
                ) from None
            out.append(value)
            shown.append(value)
        elif name in run_values:
            out.append(run_values[name])
            shown.append(run_values[name])
        else:
            raise CommandError(f"unknown placeholder {{{name}}}")
    return "".join(out), "".join(shown)


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def overrides_of(values: RunValues) -> dict[str, Any]:
    """The run's config where it differs from the recipe's defaults, by dotted key."""
    defaults = _flatten(values.default_config)
    missing = object()
    return {
        key: value
        for key, value in sorted(_flatten(values.config).items())
        if defaults.get(key, missing) != value
    }


def command_fill(
    *, template: Any, launch: Launch, values: RunValues, dry_run: bool = False
) -> Filled:
    """The run's argv and added environment; CommandError saying why it cannot be filled."""
    words = command_words(template)
    if dry_run:
        words = [w for w in words if w not in launch.dry_run_drop] + launch.dry_run_append
    env = dict(values.env)
    added: dict[str, str] = {}
    for name, raw in launch.env.items():
        added[name] = _fill_argument(str(raw), values, env)[0]
    overrides = overrides_of(values)
    if launch.overrides == "env":
        for key, value in overrides.items():
            name = launch.env_prefix + re.sub(r"[^A-Z0-9_]", "_", key.upper())
            added[name] = argument_text(value)
    env.update(added)
    argv, shown = [], []
    for arg in words:
        done, done_shown = _fill_argument(arg, values, env)
        argv.append(done)
        shown.append(done_shown)
    if launch.overrides == "flags":
        for key, value in overrides.items():
            flag = [f"--{key}={argument_text(value)}"]
            if launch.flag_style == "space":
                flag = [f"--{key}", argument_text(value)]
            argv += flag
            shown += flag
    return Filled(argv=argv, shown=shown, env=added)
