from django.urls import path
from django.views.generic import RedirectView

from proposals import follow_views, live, views
from proposals.feeds import FEEDS, InterventionsFeed

app_name = "proposals"

urlpatterns = [
    path("", views.proposal_list, name="list"),
    # The list lives at the site's root; /proposals/, where its pages sit, goes there too.
    path(
        "proposals/",
        RedirectView.as_view(pattern_name="proposals:list", query_string=True),
        name="list-at-root",
    ),
    path("proposals/new/", views.proposal_create, name="create"),
    path("proposals/review-queue/", views.review_queue, name="review-queue"),
    path("proposals/<int:pk>/", views.proposal_detail, name="detail"),
    path("proposals/<int:pk>/live/", live.proposal_live, name="live"),
    path("proposals/<int:pk>/edit/", views.proposal_edit, name="edit"),
    path(
        "proposals/<int:pk>/transition/<str:action>/", views.proposal_transition, name="transition"
    ),
    path("proposals/<int:pk>/dry-run/", views.proposal_dry_run, name="dry-run"),
    path("proposals/<int:pk>/hold/", views.proposal_hold, {"hold": True}, name="hold"),
    path("proposals/<int:pk>/unhold/", views.proposal_hold, {"hold": False}, name="unhold"),
    path("proposals/<int:pk>/review/", views.review_submit, name="review"),
    path("proposals/<int:pk>/comment/", views.comment_create, name="comment"),
    path("proposals/<int:pk>/outcome/", views.outcome_record, name="outcome"),
    path(
        "proposals/<int:pk>/follow/", follow_views.proposal_follow, {"follow": True}, name="follow"
    ),
    path(
        "proposals/<int:pk>/unfollow/",
        follow_views.proposal_follow,
        {"follow": False},
        name="unfollow",
    ),
    path(
        "campaigns/<slug:slug>/follow/",
        follow_views.campaign_follow,
        {"follow": True},
        name="campaign-follow",
    ),
    path(
        "campaigns/<slug:slug>/unfollow/",
        follow_views.campaign_follow,
        {"follow": False},
        name="campaign-unfollow",
    ),
    path("unsubscribe/<str:token>/", follow_views.unsubscribe, name="unsubscribe"),
    path("search/", views.search_page, name="search"),
    path("archive/", views.archive_page, name="archive"),
    path("export/proposals.<str:fmt>", views.export_download, name="export"),
    *(path(f"feeds/{kind}/", feed(), name=f"feed-{kind}") for kind, feed in FEEDS.items()),
    path("feeds/interventions/", InterventionsFeed(), name="feed-interventions"),
    *(
        path(f"feeds/labels/<str:label>/{kind}/", feed(), name=f"label-feed-{kind}")
        for kind, feed in FEEDS.items()
    ),
]
