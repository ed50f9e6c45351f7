"""The GitHub sync panel of a proposal page: `{% github_sync_panel proposal %}`."""

from __future__ import annotations

from typing import Any

from django import template

from proposals.github import client

register = template.Library()


@register.inclusion_tag("proposals/_github_sync.html")
def github_sync_panel(proposal: Any) -> dict[str, Any]:
    enabled, issue_url = github_sync_facts(proposal)
    return {"proposal": proposal, "github_sync_enabled": enabled, "github_issue_url": issue_url}


def github_sync_facts(proposal: Any) -> tuple[bool, str]:
    """What the panel shows besides the proposal's own fields: whether sync is on, and the
    issue's address (both from the site's settings)."""
    number = proposal.github_issue_number
    return client.sync_enabled(), client.issue_html_url(number) if number else ""
