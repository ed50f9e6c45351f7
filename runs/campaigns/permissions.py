"""Who may declare campaigns and record interventions: maintainers (django-rules names)."""

from __future__ import annotations

import rules

from marin_site.roles import is_maintainer

MANAGE_CAMPAIGNS = "runs.manage_campaign"
RECORD_INTERVENTION = "runs.record_intervention"

rules.add_perm(MANAGE_CAMPAIGNS, is_maintainer)
rules.add_perm(RECORD_INTERVENTION, is_maintainer)
# The admin's names, for the campaign rows maintainers declare there.
for _model in ("campaign", "campaignrun", "intervention"):
    for _action in ("view", "add", "change"):
        rules.add_perm(f"runs.{_action}_{_model}", is_maintainer)
