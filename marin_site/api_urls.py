"""The REST API under /api/v1/."""

from django.urls import path
from rest_framework.routers import DefaultRouter

from proposals.api import CommentViewSet, ProposalSearchView, ProposalViewSet, ReviewViewSet
from runs.api import (
    PlanPreviewView,
    PlanSeriesView,
    RecipeViewSet,
    RunHeartbeatView,
    RunMetricsView,
    RunReportView,
    RunsSeriesView,
    RunStatusView,
    RunTrackerImportsView,
    RunTrackerImportView,
    RunViewSet,
)

router = DefaultRouter()
router.register("proposals", ProposalViewSet, basename="proposal")
router.register("reviews", ReviewViewSet, basename="review")
router.register("comments", CommentViewSet, basename="comment")
router.register("recipes", RecipeViewSet, basename="recipe")
router.register("runs", RunViewSet, basename="run")

urlpatterns = [
    path("search/", ProposalSearchView.as_view(), name="proposal-search"),
    path("plans/preview/", PlanPreviewView.as_view(), name="plan-preview"),
    path("plans/<int:plan_id>/series/", PlanSeriesView.as_view(), name="plan-series"),
    path("runs/series/", RunsSeriesView.as_view(), name="runs-series"),  # before runs/<pk>/
    path("runs/<int:pk>/metrics/", RunMetricsView.as_view(), name="run-metrics"),
    path("runs/<int:pk>/heartbeat/", RunHeartbeatView.as_view(), name="run-heartbeat"),
    path("runs/<int:pk>/status/", RunStatusView.as_view(), name="run-status"),
    path("runs/<int:pk>/report/", RunReportView.as_view(), name="run-report"),
    path(
        "runs/<int:pk>/tracker-metrics/", RunTrackerImportView.as_view(), name="run-tracker-metrics"
    ),
    path(
        "runs/<int:pk>/tracker-imports/",
        RunTrackerImportsView.as_view(),
        name="run-tracker-imports",
    ),
    *router.urls,
]
