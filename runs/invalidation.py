"""What a write of a row of runs/ makes stale.

The table of ``marin_site.invalidation``, for this app: registered from ``RunsConfig.ready``.
Every row below is shown on a public page (a recipe's, a run's, a campaign's, and through
proposals/ a proposal's), so each write bumps the page cache's generation; the home page's
list of active campaigns is a fragment of its own. Metric points bump nothing: the pages
that show them read the chart data, which is never cached.

Bulk writes in this app apply the same rules with ``rows_changed`` (the runs a plan expands
into, the events of a dispatch, a plan's cancel); where a bulk write skips it, its comment
says why.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from marin_site.fragments import Dependency
from marin_site.invalidation import Rule
from runs.alerts.rules import RULES_VERSION
from runs.board.read import BOARD_VERSION
from runs.campaigns.selectors import CAMPAIGN_LIST_VERSION


def _campaign_list(instance: Any, **kwargs: Any) -> Iterable[Dependency]:
    return [CAMPAIGN_LIST_VERSION]


def _alert_rules(instance: Any, **kwargs: Any) -> Iterable[Dependency]:
    """Every process's kept alert rules (a recipe's declarations are rules too)."""
    return [RULES_VERSION]


RULES = (
    Rule(
        "runs.Recipe",
        "the recipe pages and lists; the alert rules made from it",
        versions=_alert_rules,
    ),
    Rule(
        "runs.AlertRule", "the alert rules every process keeps", page=False, versions=_alert_rules
    ),
    Rule("runs.RecipeEvent", "a recipe's history"),
    Rule("runs.Plan", "a plan's table on its proposal's page"),
    Rule("runs.PlanLaunch", "a launch's summary and results"),
    Rule("runs.Run", "run pages, run tables, a campaign's progress, the board"),
    # The board (runs/board/rank.py writes its entries and changes in bulk, then applies the
    # track's rule with rows_changed: one bump for a whole ranking).
    Rule(
        "runs.BoardTrack",
        "the board's pages, its chart, its feed and its API",
        versions=lambda instance, **kwargs: [(BOARD_VERSION, instance.pk)],
    ),
    Rule(
        "runs.BoardEntry",
        "the board's pages, its chart and its API",
        versions=lambda instance, **kwargs: [(BOARD_VERSION, instance.track_id)],
    ),
    Rule(
        "runs.BoardRankChange",
        "the board's latest rank changes and its feed",
        versions=lambda instance, **kwargs: [(BOARD_VERSION, instance.track_id)],
    ),
    Rule("runs.RunEvent", "run timelines and the proposal's merged timeline"),
    Rule("runs.MetricFlag", "a run's flagged metrics on its page"),
    Rule("runs.Alert", "open alerts on run, proposal and campaign pages"),
    Rule("runs.Campaign", "campaign pages, the home page's campaigns", versions=_campaign_list),
    Rule("runs.CampaignRun", "a campaign's runs"),
    Rule("runs.Intervention", "a campaign's interventions"),
    Rule("runs.DryRun", "a proposal's dry runs beside its plan"),
)
