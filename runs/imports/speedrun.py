"""Marin's speedrun results as imported runs (kind ``speedrun``).

Two files of Marin's ``experiments/speedrun/`` are read, as Marin writes them:

- a submission's ``speedrun_results.json``: ``{"runs": [{"run_info": {...}}, ...]}`` (an
  older file is one ``{"run_info": {...}}``), where ``run_info`` holds ``author`` (name,
  affiliation, url), ``description``, ``eval/paloma/c4_en/bpb``, ``model_flops``,
  ``training_hardware_flops``, ``training_time`` (seconds), ``model_size``,
  ``total_tokens``, ``model_config``, ``train_config``, ``resources``,
  ``tokenized_dataset``, ``run_completion_timestamp`` and ``wandb_run_link``;
- the leaderboard's ``runs.json``: a list of entries with ``run_name`` (the submission's
  directory under ``experiments/speedrun/``), ``results_filepath``, ``author``,
  ``model_size``, ``training_hardware_flops``, ``training_time``, ``model_flops``,
  ``eval_paloma_c4_en_bpb``, ``wandb_link``, ``run_completion_timestamp``, ``description``.

**Where the runs go.** Speedruns were not proposals of this site, and ``runs/`` owns no
proposal: each becomes a finished run of the inactive recipe ``marin-speedrun`` (version
``imported``), in one plan per **track**. The track is the size the submission's directory
names (``130m``, ``300m``, ``520m``, ``1_2b``: Marin's speedrun scales), or the ``track``
option; a result whose track cannot be told is refused. The figures are the run's final
metrics under Marin's own keys (``eval/paloma/c4_en/bpb``, ``model_flops``,
``training_hardware_flops``, ``training_time``, ``model_size``, ``total_tokens``), so the
boards rank them as Marin did; the author, affiliation and description are the run's tags.

A run is known again by its source (``Run.imported_from``: the W&B run as
``wandb:entity/project/run_id``, else ``speedrun:<directory>``): importing a file twice
changes nothing, and a result whose figures changed updates its run.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Max

from marin_site import importing, links
from marin_site.doors import Door
from marin_site.events import Verb
from marin_site.nudges import nudge
from marin_site.untrusted import untrusted_problem
from runs.models import Plan, PlanEntry, Recipe, Run, RunEvent, RunOrigin, RunState
from runs.specs.ablation import config_hash

KIND = "speedrun"
RECIPE_NAME = "marin-speedrun"
RECIPE_VERSION = "imported"
MAX_BYTES = 64 * 1024 * 1024  # a results file is read whole
BPB = "eval/paloma/c4_en/bpb"
# Marin's figures: (key in speedrun_results.json, key in runs.json, required)
FIGURES: tuple[tuple[str, str, bool], ...] = (
    (BPB, "eval_paloma_c4_en_bpb", True),
    ("model_flops", "model_flops", True),
    ("training_hardware_flops", "training_hardware_flops", True),
    ("training_time", "training_time", True),
    ("model_size", "model_size", True),
    ("total_tokens", "total_tokens", False),
)
METRICS = [
    {"key": BPB, "unit": "bits/byte", "direction": "lower", "display": "C4-EN BPB", "column": True},
    {"key": "model_flops", "unit": "flops", "display": "Model FLOPs", "column": True},
    {
        "key": "training_hardware_flops",
        "unit": "flops",
        "display": "Hardware FLOPs",
        "column": True,
    },
    {"key": "training_time", "unit": "seconds", "display": "Training time", "column": True},
    {"key": "model_size", "unit": "count", "display": "Parameters", "column": True},
    {"key": "total_tokens", "unit": "tokens", "display": "Tokens"},
]
TRACK = re.compile(r"^[0-9]+(?:_[0-9]+)?[mb]$")
NAME = re.compile(r"^[A-Za-z0-9_.\-/#]{1,300}$")
CONFIG_PARTS = ("model_config", "train_config", "resources", "tokenized_dataset", "total_tokens")


@dataclass
class SpeedrunResult:
    name: str  # the submission's directory under experiments/speedrun/, or its W&B run
    figures: dict[str, float]
    author: dict[str, str] = field(default_factory=dict)
    description: str = ""
    wandb: str = ""  # wandb:entity/project/run_id
    wandb_url: str = ""
    completed_at: datetime | None = None
    config: dict[str, Any] = field(default_factory=dict)
    results_filepath: str = ""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _timestamp(value: Any) -> datetime | None:
    """Marin writes ``2025-06-27 06:41:56 UTC``; ISO 8601 is read too."""
    if not isinstance(value, str) or not value.strip():
        return None
    text = value.strip()
    for pattern in ("%Y-%m-%d %H:%M:%S UTC", "%Y-%m-%d %H:%M:%S"):
        try:
            return datetime.strptime(text, pattern).replace(tzinfo=UTC)
        except ValueError:
            pass
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _author(value: Any) -> dict[str, str]:
    if isinstance(value, str):
        return {"name": value[:200]}
    if not isinstance(value, dict):
        return {}
    return {key: str(value[key])[:300] for key in ("name", "affiliation", "url") if value.get(key)}


def _result(data: Any, *, leaderboard: bool, name: str) -> SpeedrunResult | str:
    """A result read from one run of either file, or why it cannot be."""
    if not isinstance(data, dict):
        return "not a JSON object"
    problem = untrusted_problem(data)
    if problem:
        return problem
    figures: dict[str, float] = {}
    for key, board_key, required in FIGURES:
        source_key = board_key if leaderboard else key
        raw = data.get(source_key)
        value = _number(raw)
        if value is None:
            if raw is None and not required:
                continue
            what = "is missing" if raw is None else f"is not a number ({str(raw)[:40]!r})"
            return f"'{source_key}' {what}"
        figures[key] = value
    link = str(data.get("wandb_link" if leaderboard else "wandb_run_link") or "")[:500]
    wandb = links.link_canonical(link) if link else None
    if wandb is not None and not wandb.startswith("wandb:"):
        wandb = None
    if leaderboard:
        name = str(data.get("run_name") or "")
    if not name and wandb:
        name = wandb.rsplit("/", 1)[1]
    if not NAME.match(name):
        return "the run has no name (a directory under experiments/speedrun/ or a W&B run)"
    return SpeedrunResult(
        name=name,
        figures=figures,
        author=_author(data.get("author")),
        description=str(data.get("description") or "")[:2000],
        wandb=wandb or "",
        wandb_url=link if wandb else "",
        completed_at=_timestamp(data.get("run_completion_timestamp")),
        config={k: data[k] for k in CONFIG_PARTS if k in data and not leaderboard},
        results_filepath=str(data.get("results_filepath") or "")[:500],
    )


def _results(document: Any, source_name: str) -> list[tuple[str, SpeedrunResult | str]]:
    """(place, result or problem) for every run of either file."""
    if isinstance(document, list):
        return [
            (f"entry {n}", _result(item, leaderboard=True, name=""))
            for n, item in enumerate(document, start=1)
        ]
    if isinstance(document, dict):
        runs = document.get("runs", [document])
        if not isinstance(runs, list):
            return [("file", "'runs' must be a list")]
        directory = _directory_of(source_name)
        found: list[tuple[str, SpeedrunResult | str]] = []
        for n, item in enumerate(runs, start=1):
            info = item.get("run_info") if isinstance(item, dict) else None
            if not isinstance(info, dict):
                found.append((f"run {n}", "it has no 'run_info' object"))
                continue
            name = directory if len(runs) == 1 or not directory else f"{directory}#{n}"
            found.append((f"run {n}", _result(info, leaderboard=False, name=name)))
        return found
    return [("file", "neither a speedrun_results.json nor the leaderboard's runs.json")]


def _directory_of(source_name: str) -> str:
    """``adamw_llama_scaling/130m`` from ``.../experiments/speedrun/adamw_llama_scaling/130m/
    speedrun_results.json``; empty when the path does not say."""
    parts = [p for p in re.split(r"[\\/]", source_name) if p]
    if len(parts) < 2 or not parts[-1].startswith("speedrun_results"):
        return ""
    if "speedrun" in parts[:-1]:
        start = len(parts) - parts[::-1].index("speedrun")
        return "/".join(parts[start:-1])
    return "/".join(parts[-3:-1]) if len(parts) >= 3 else parts[-2]


def _track_of(result: SpeedrunResult, given: str) -> str | None:
    if given:
        return given
    for part in reversed(result.name.split("#")[0].split("/")):
        if TRACK.match(part.lower()):
            return part.lower()
    return None


def _recipe() -> Recipe:
    recipe, _ = Recipe.objects.get_or_create(
        name=RECIPE_NAME,
        version=RECIPE_VERSION,
        defaults={
            "title": "Marin speedrun (imported results)",
            "description": "Results of Marin's speedrun, imported: not run by this site.",
            "command_template": "(imported: not run by this site)",
            "metrics": METRICS,
            "is_active": False,
        },
    )
    return recipe


def _plan(recipe: Recipe, track: str) -> Plan:
    plan = (
        Plan.objects.select_for_update().filter(recipe=recipe, spec__speedrun_track=track).first()
    )
    if plan is None:
        plan = Plan.objects.create(
            recipe=recipe,
            recipe_snapshot={"name": recipe.name, "version": recipe.version, "metrics": METRICS},
            spec={"speedrun_track": track},
            spec_text=f"Marin speedrun, track {track} (imported results)",
            run_count=0,
            total_flops=0.0,
            total_accelerator_hours=0.0,
        )
    return plan


def _source_id(result: SpeedrunResult) -> str:
    return result.wandb or f"speedrun:{result.name}"


def _tags(result: SpeedrunResult, track: str) -> dict[str, str]:
    tags = {
        "speedrun.name": result.name,
        "speedrun.track": track,
        "author": result.author.get("name", ""),
        "author.affiliation": result.author.get("affiliation", ""),
        "author.url": result.author.get("url", ""),
        "description": result.description,
        "results_filepath": result.results_filepath,
    }
    return {k: v for k, v in tags.items() if v}


def _next(top: int | None) -> int:
    return 0 if top is None else top + 1


def _same_figures(stored: dict[str, Any], figures: dict[str, float]) -> bool:
    """The database may give back 1.7e18 as an integer (jsonb keeps numbers as numeric)."""
    if set(stored) != set(figures):
        return False
    return all(
        isinstance(stored[k], int | float) and math.isclose(stored[k], v, rel_tol=1e-12)
        for k, v in figures.items()
    )


def _store(result: SpeedrunResult, *, track: str, by: Any) -> tuple[Run, str]:
    """The result's run: created, updated (figures changed) or found as it is."""
    source = _source_id(result)
    tags = _tags(result, track)
    recipe = Recipe.objects.select_for_update().get(pk=_recipe().pk)
    existing = Run.objects.filter(origin=RunOrigin.IMPORTED, imported_from=source).first()
    if existing is not None:
        if _same_figures(existing.final_metrics, result.figures) and existing.tracker_tags == tags:
            return existing, "unchanged"
        existing.final_metrics = result.figures
        existing.tracker_tags = tags
        existing.save(update_fields=["final_metrics", "tracker_tags", "updated_at"])
        return existing, "updated"
    plan = _plan(recipe, track)
    config = result.config or {"speedrun": result.name}
    digest = config_hash(config)
    entry = PlanEntry.objects.filter(plan=plan, config_hash=digest).first()
    if entry is None:
        index = _next(plan.entries.aggregate(top=Max("index"))["top"])
        entry = PlanEntry.objects.create(
            plan=plan,
            index=index,
            scale=track,
            config=config,
            config_hash=digest,
            flops=result.figures["model_flops"],
            accelerator_hours=0.0,
        )
    sequence = _next(entry.runs.aggregate(top=Max("sequence"))["top"])
    finished = result.completed_at
    seconds = result.figures["training_time"]
    run = Run.objects.create(
        plan=plan,
        entry=entry,
        sequence=sequence,
        recipe_name=recipe.name,
        recipe_version=recipe.version,
        config=config,
        config_hash=digest,
        state=RunState.FINISHED,
        state_reason="imported from Marin's speedrun results",
        origin=RunOrigin.IMPORTED,
        imported_from=source,
        final_metrics=result.figures,
        tracker_tags=tags,
        resources=config.get("resources") if isinstance(config.get("resources"), dict) else {},
        wandb_url=result.wandb_url,
        finished_at=finished,
        started_at=finished - timedelta(seconds=seconds) if finished and seconds >= 0 else None,
        attempt=1,
    )
    Plan.objects.filter(pk=plan.pk).update(
        run_count=plan.entries.count(),
        total_flops=sum(plan.entries.values_list("flops", flat=True)),
    )
    RunEvent.build(
        run=run,
        verb=Verb.CREATED,
        door=Door.WEB if getattr(by, "is_authenticated", False) else Door.SYSTEM,
        actor=by,
        actor_label="" if by else "manage.py import_history",
        to_state=RunState.FINISHED,
        message=f"imported from Marin's speedrun results ({source})",
    ).save()
    return run, "created"


def speedrun_import(
    source: Any, *, by: Any, dry_run: bool, track: str = ""
) -> importing.ImportReport:
    """Import a ``speedrun_results.json`` or the leaderboard's ``runs.json``."""
    report = importing.report_start(source, KIND)
    track = track.strip().lower()
    if track and not TRACK.match(track):
        report.refused("option track", f"'{track[:40]}' is not a size such as 130m or 1_2b")
        return report
    try:
        document = json.load(source)
    except (ValueError, UnicodeDecodeError) as exc:
        report.refused("file", f"not JSON: {str(exc)[:200]}")
        return report
    changed = False
    for place, result in _results(document, report.source):
        if isinstance(result, str):
            report.refused(place, result)
            continue
        where = f"{place} ({result.name})"
        run_track = _track_of(result, track)
        if run_track is None:
            report.refused(
                where,
                "matches no track: its directory names no size (130m, 1_2b, ...); "
                "give the track option",
            )
            continue
        with importing.item_transaction(dry_run=dry_run):
            run, what = _store(result, track=run_track, by=by)
        figures = f"{BPB} {result.figures[BPB]:.4g}"
        if what == "unchanged":
            report.skipped(where, f"already imported as run {run.pk}, unchanged")
        elif dry_run:
            report.matched(where, f"would be {what}: track {run_track}, {figures}")
        else:
            report.matched(where, f"run {run.pk} {what}: track {run_track}, {figures}")
            changed = True
    if changed:  # the board's speedrun tracks read these runs (runs/board/rank.py)
        nudge("runs.board_rank", recipe_name=RECIPE_NAME)
    return report


def register() -> None:
    importing.register_importer(
        KIND,
        "Speedrun results (speedrun_results.json or the leaderboard's runs.json)",
        speedrun_import,
        description=(
            "Each run becomes a finished, imported run of the marin-speedrun recipe in its "
            "track's plan, with Marin's figures as its final metrics."
        ),
        options=(
            importing.ImportOption(
                "track", "Speedrun track", help="the size, e.g. 130m, when the path names none"
            ),
        ),
        accepts_url=True,
        max_bytes=MAX_BYTES,
    )
