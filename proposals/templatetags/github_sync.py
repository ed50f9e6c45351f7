"""The GitHub sync panel of a proposal page: `{% github_sync_panel proposal %}`."""

from __future__ import annotations

from typing import Any

from django import template

from proposals.github import client

register = template.Library()


@register.inclusion_tag("proposals/_github_sync.html")
def github_sync_panel(proposal: Any) -> dict[str, Any]:
    enabled, issue_url = client.sync_facts(proposal.github_issue_number)
    return {"proposal": proposal, "github_sync_enabled": enabled, "github_issue_url": issue_url}
