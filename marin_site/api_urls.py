"""The REST API under /api/v1/."""

from django.urls import path
from rest_framework.routers import DefaultRouter

from proposals.api import CommentViewSet, ProposalSearchView, ProposalViewSet, ReviewViewSet
from proposals.board.api import BoardTracksView, BoardView
from runs.alerts.api import AlertRuleViewSet, AlertViewSet
from runs.api import PlanPreviewView, RecipeViewSet, RunViewSet
from runs.campaigns.api import CampaignViewSet
from runs.pools.api import (
    AgentLeaseCodeView,
    AgentLeaseRenewView,
    AgentLeaseReportView,
    AgentPollView,
    AgentRegisterView,
    AgentRevokeView,
    PoolViewSet,
)
from runs.runner_api import (
    RunArtifactView,
    RunConfigView,
    RunHeartbeatView,
    RunMetricsView,
    RunReportView,
    RunStatusView,
)
from runs.series.api import PlanSeriesView, RunsSeriesView
from runs.trackers.api import RunTrackerImportsView, RunTrackerImportView
from runs.verdicts.api import VerdictCheckView, VerdictRulesView

router = DefaultRouter()
router.register("proposals", ProposalViewSet, basename="proposal")
router.register("reviews", ReviewViewSet, basename="review")
router.register("comments", CommentViewSet, basename="comment")
router.register("recipes", RecipeViewSet, basename="recipe")
router.register("runs", RunViewSet, basename="run")
router.register("pools", PoolViewSet, basename="pool")
router.register("alert-rules", AlertRuleViewSet, basename="alert-rule")
router.register("alerts", AlertViewSet, basename="alert")
router.register("campaigns", CampaignViewSet, basename="campaign")

urlpatterns = [
    path("search/", ProposalSearchView.as_view(), name="proposal-search"),
    path("plans/preview/", PlanPreviewView.as_view(), name="plan-preview"),
    path("verdicts/check/", VerdictCheckView.as_view(), name="verdict-check"),
    path("verdicts/rules/", VerdictRulesView.as_view(), name="verdict-rules"),
    path("board/", BoardView.as_view(), name="board-entries"),
    path("board/tracks/", BoardTracksView.as_view(), name="board-tracks"),
    path("plans/<int:plan_id>/series/", PlanSeriesView.as_view(), name="plan-series"),
    path("runs/series/", RunsSeriesView.as_view(), name="runs-series"),  # before runs/<pk>/
    path("runs/<int:pk>/metrics/", RunMetricsView.as_view(), name="run-metrics"),
    path("runs/<int:pk>/heartbeat/", RunHeartbeatView.as_view(), name="run-heartbeat"),
    path("runs/<int:pk>/status/", RunStatusView.as_view(), name="run-status"),
    path("runs/<int:pk>/report/", RunReportView.as_view(), name="run-report"),
    path("runs/<int:pk>/config/", RunConfigView.as_view(), name="run-config"),
    path("runs/<int:pk>/artifacts/", RunArtifactView.as_view(), name="run-artifacts"),
    path(
        "runs/<int:pk>/tracker-metrics/", RunTrackerImportView.as_view(), name="run-tracker-metrics"
    ),
    path(
        "runs/<int:pk>/tracker-imports/",
        RunTrackerImportsView.as_view(),
        name="run-tracker-imports",
    ),
    # The agents' door (runs/pools/api.py): the agent's own credential, no session.
    path("agent/register/", AgentRegisterView.as_view(), name="agent-register"),
    path("agent/poll/", AgentPollView.as_view(), name="agent-poll"),
    path("agent/leases/<int:lease_id>/renew/", AgentLeaseRenewView.as_view(), name="agent-renew"),
    path(
        "agent/leases/<int:lease_id>/report/", AgentLeaseReportView.as_view(), name="agent-report"
    ),
    path("agent/leases/<int:lease_id>/code/", AgentLeaseCodeView.as_view(), name="agent-code"),
    path("agents/<int:agent_id>/revoke/", AgentRevokeView.as_view(), name="agent-revoke"),
    *router.urls,
]
