"""The permissions of runs, declared once (django-rules) and used by every door.

Roles are the site's Django groups; a maintainer (group ``maintainer`` or a superuser)
registers recipes and dispatches, cancels, reruns and retries runs. Reading runs and metrics is public.
"""

from __future__ import annotations

from typing import Any

import rules

ROLE_MAINTAINER = "maintainer"

CANCEL_RUN = "runs.cancel_run"
RERUN_RUN = "runs.rerun_run"
RETRY_RUN = "runs.retry_run"
IMPORT_METRICS = "runs.import_metrics_run"
MANAGE_RECIPES = "runs.manage_recipe"


@rules.predicate
def is_run_maintainer(user: Any) -> bool:
    if not getattr(user, "is_authenticated", False) or not user.is_active:
        return False
    return bool(user.is_superuser or user.groups.filter(name=ROLE_MAINTAINER).exists())


rules.add_perm(CANCEL_RUN, is_run_maintainer)
rules.add_perm(RERUN_RUN, is_run_maintainer)
rules.add_perm(RETRY_RUN, is_run_maintainer)
rules.add_perm(IMPORT_METRICS, is_run_maintainer)
rules.add_perm(MANAGE_RECIPES, is_run_maintainer)

# The admin asks Django's permission names (marin_site/admin.py): maintainers open it for the
# recipes they manage (added and edited through the recipe services' validation) and read the
# plans and runs there. Nothing is deleted from the admin but by a superuser.
rules.add_perm("runs", is_run_maintainer)
rules.add_perm("runs.add_recipe", is_run_maintainer)
rules.add_perm("runs.change_recipe", is_run_maintainer)
for _model in (
    "recipe",
    "plan",
    "planentry",
    "planlaunch",
    "run",
    "runevent",
    "metricsummary",
    "metricseries",
):
    rules.add_perm(f"runs.view_{_model}", is_run_maintainer)
