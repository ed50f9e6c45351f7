"""Links a run reports about itself: its W&B run, checkpoint locations, other artifacts.

A W&B link also becomes the run's ``wandb_url`` (the run table links it). Reporting the same
link again changes nothing. Links are shown as links only when they are http(s); a
checkpoint at ``gs://`` or ``s3://`` is shown as text.
"""

from __future__ import annotations

import re
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from marin_site.errors import TransitionNotAllowed
from runs.models import Run, RunArtifact, RunState

URI = re.compile(r"^(https?|gs|s3|hf|file)://[^\s\x00-\x1f\x7f]{1,990}\Z", re.IGNORECASE)
MAX_ARTIFACTS = 1000


def run_artifact_add(*, run: Run, data: Any) -> RunArtifact:
    """Record one artifact of a running run: ``{"kind", "uri", "name"?, "step"?}``."""
    if not isinstance(data, dict):
        raise ValidationError({"non_field_errors": ["send a JSON object"]})
    kind = data.get("kind")
    if kind not in RunArtifact.Kind.values:
        raise ValidationError({"kind": [f"must be one of {', '.join(RunArtifact.Kind.values)}"]})
    uri = data.get("uri")
    if not isinstance(uri, str) or not URI.match(uri):
        raise ValidationError(
            {"uri": ["must be an http(s), gs, s3, hf or file URI of at most 1000 characters"]}
        )
    if kind == RunArtifact.Kind.WANDB and not uri.lower().startswith("https://"):
        raise ValidationError({"uri": ["a W&B run is an https:// link"]})
    name = data.get("name", "")
    if not isinstance(name, str) or len(name) > 200 or any(ord(c) < 32 for c in name):
        raise ValidationError({"name": ["must be one line of at most 200 characters"]})
    step = data.get("step")
    if step is not None and (type(step) is not int or not 0 <= step < 2**62):
        raise ValidationError({"step": ["must be a non-negative integer, or null"]})
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.state != RunState.RUNNING:
            raise TransitionNotAllowed(
                action="report an artifact", current=locked.state, allowed=[RunState.RUNNING]
            )
        artifact = RunArtifact.objects.filter(run=locked, kind=kind, uri=uri).first()
        if artifact is not None:
            return artifact
        if RunArtifact.objects.filter(run=locked).count() >= MAX_ARTIFACTS:
            raise ValidationError({"uri": [f"a run keeps at most {MAX_ARTIFACTS} artifacts"]})
        artifact = RunArtifact.objects.create(
            run=locked, kind=kind, uri=uri, name=name.strip(), step=step, attempt=locked.attempt
        )
        if kind == RunArtifact.Kind.WANDB and len(uri) <= 200:
            locked.wandb_url = uri
            locked.save(update_fields=["wandb_url", "updated_at"])
        return artifact
