"""The REST API under /api/v1/."""

from django.urls import path
from rest_framework.routers import DefaultRouter

from proposals.api import CommentViewSet, ProposalViewSet, ReviewViewSet
from runs.api import PlanPreviewView, RecipeViewSet

router = DefaultRouter()
router.register("proposals", ProposalViewSet, basename="proposal")
router.register("reviews", ReviewViewSet, basename="review")
router.register("comments", CommentViewSet, basename="comment")
router.register("recipes", RecipeViewSet, basename="recipe")

urlpatterns = [
    path("plans/preview/", PlanPreviewView.as_view(), name="plan-preview"),
    *router.urls,
]
