"""Field validators and the names they check, kept out of ``models.py`` so that the models
import nothing of the executors and the executors may import the models.

An executor name is ``local``, ``ray``, ``iris`` or ``pool:<name>`` (the agents of a pool
pull their runs); ``external`` (a run claimed by hand, or through MLflow) is never a target.
"""

from __future__ import annotations

import re

from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator

slug_validator = RegexValidator(
    r"^[a-z0-9][a-z0-9-]{0,62}$",
    "Use lowercase letters, digits and hyphens (at most 63 characters).",
)

EXECUTORS = ("local", "ray", "iris")
POOL_PREFIX = "pool:"
EXECUTOR_NAME_MAX = 40
POOL_EXECUTOR = re.compile(r"^pool:([a-z0-9][a-z0-9-]{0,31})\Z")


def pool_name(executor: str) -> str:
    """The pool an executor name targets, or "" when it is not ``pool:<name>``."""
    match = POOL_EXECUTOR.match(executor)
    return match.group(1) if match else ""


def allowed_executors(launch: object) -> list[str]:
    """The executors and pools a recipe's ``launch.executors`` allows (empty: any)."""
    found = launch.get("executors") if isinstance(launch, dict) else None
    return [name for name in found if isinstance(name, str)] if isinstance(found, list) else []


def is_pull_executor(executor: str) -> bool:
    """Whether runs on this executor are pulled by agents rather than pushed by the site."""
    return executor.startswith(POOL_PREFIX)


def validate_executor_name(value: str) -> None:
    """A model validator: ``local``, ``ray``, ``iris`` or ``pool:<slug>`` (blank is the field's business)."""
    if value and value not in EXECUTORS and not pool_name(value):
        raise ValidationError(
            f"'{value[:60]}' is no executor; use {', '.join(EXECUTORS)} or pool:<name> "
            "(a pool's name: lowercase letters, digits and '-', at most 32)."
        )
