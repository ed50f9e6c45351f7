"""What trackers report about a run besides its points: the config they saw, a summary,
tags and artifacts (kept as links, never as files). One write function for every door: the
native runner API (the Levanter tracker), MLflow's params and tags, the jsonl import.
"""

from __future__ import annotations

import math
from typing import Any

import orjson
from django.core.exceptions import ValidationError
from django.db import transaction

from runs.metrics import declarations as metric_declarations
from runs.metrics.parse import METRIC_KEY
from runs.models import Run

MAX_CONFIG_BYTES = 256 * 1024
MAX_SUMMARY_KEYS = 2000
MAX_ARTIFACTS = 1000
MAX_TAGS = 1000


def _finite(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def summary_clean(summary: Any) -> tuple[dict[str, float], list[str]]:
    """A summary's finite numbers under storable keys, and what was left out."""
    if not isinstance(summary, dict):
        raise ValidationError({"summary": ["must be an object of metric keys to numbers"]})
    if len(summary) > MAX_SUMMARY_KEYS:
        raise ValidationError({"summary": [f"at most {MAX_SUMMARY_KEYS} keys"]})
    kept: dict[str, float] = {}
    left_out: list[str] = []
    for key, value in summary.items():
        if isinstance(key, str) and METRIC_KEY.match(key) and _finite(value):
            kept[key] = float(value)
        else:
            left_out.append(str(key)[:200])
    return kept, left_out


def artifact_clean(item: Any) -> dict[str, str]:
    if not isinstance(item, dict):
        raise ValidationError({"artifacts": ["each artifact is an object {uri, name?, type?}"]})
    uri = item.get("uri")
    if not isinstance(uri, str) or not uri.strip() or len(uri) > 2000:
        raise ValidationError({"artifacts": ["'uri' must be 1-2000 characters"]})
    name, kind = item.get("name") or "", item.get("type") or ""
    if not isinstance(name, str) or not isinstance(kind, str):
        raise ValidationError({"artifacts": ["'name' and 'type' must be strings"]})
    return {"uri": uri.strip(), "name": name[:200], "type": kind[:100]}


@transaction.atomic
def run_tracker_report(
    *,
    run_id: int,
    config: dict[str, Any] | None = None,
    replace_config: bool = False,
    summary: dict[str, float] | None = None,
    replace_summary: bool = False,
    artifacts: list[dict[str, str]] | None = None,
    tags: dict[str, str] | None = None,
    untag: list[str] | None = None,
) -> tuple[Run, list[str]]:
    """Merge (or replace) what a tracker reported into the run; returns the run and the
    summary values the recipe's declared units refused."""
    run = Run.objects.select_for_update().get(pk=run_id)
    fields = {"updated_at"}
    problems: list[str] = []
    if config is not None:
        merged = config if replace_config else {**(run.tracker_config or {}), **config}
        if len(orjson.dumps(merged)) > MAX_CONFIG_BYTES:
            raise ValidationError(
                {"config": [f"a run's config holds at most {MAX_CONFIG_BYTES} bytes"]}
            )
        run.tracker_config = merged
        fields.add("tracker_config")
    if summary is not None:
        declarations = metric_declarations.declarations_for_run(run_id=run_id)
        converted, problems = metric_declarations.summary_convert(
            declarations=declarations, summary=summary
        )
        run.final_metrics = (
            converted if replace_summary else {**(run.final_metrics or {}), **converted}
        )
        fields.add("final_metrics")
    if artifacts:
        known = list(run.tracker_artifacts or [])
        for artifact in artifacts:
            if artifact not in known:
                known.append(artifact)
        if len(known) > MAX_ARTIFACTS:
            raise ValidationError({"artifacts": [f"a run keeps at most {MAX_ARTIFACTS} artifacts"]})
        run.tracker_artifacts = known
        fields.add("tracker_artifacts")
    if tags or untag:
        current = {**(run.tracker_tags or {}), **(tags or {})}
        for key in untag or []:
            current.pop(key, None)
        if len(current) > MAX_TAGS:
            raise ValidationError({"tags": [f"a run keeps at most {MAX_TAGS} tags"]})
        run.tracker_tags = current
        fields.add("tracker_tags")
    if len(fields) > 1:
        run.save(update_fields=sorted(fields))
    return run, problems
