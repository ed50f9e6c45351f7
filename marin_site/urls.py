from allauth.socialaccount.providers.github import views as github_views
from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from marin_site import import_views, views
from runs import views as run_views
from runs.pools.urls import file_urlpatterns as agent_file_urlpatterns
from runs.urls import result_urlpatterns

urlpatterns = [
    # First: GitHub's webhook is the busiest path, and Django tries the patterns in order.
    path("github/", include("proposals.github.urls")),
    path("mlflow/", include("runs.mlflow.urls")),  # MLflow's tracking REST API
    path("", include("proposals.urls")),
    path("recipes/", include("runs.urls")),
    path("runs/<int:pk>/", run_views.run_detail, name="run-page"),
    path("runs/<int:pk>/import/", run_views.run_import, name="run-import"),
    path("runs/<int:pk>/claim/", run_views.run_claim, name="run-page-claim"),
    path("runs/<int:pk>/give-back/", run_views.run_give_back, name="run-page-give-back"),
    path("runs/<int:pk>/<str:action>/", run_views.run_action, name="run-action"),
    path("pools/", include("runs.pools.urls")),
    path("campaigns/", include("runs.campaigns.urls")),
    path("board/", include("proposals.board.urls")),
    path("", include(agent_file_urlpatterns)),  # the agent program and the run client
    path("", include(result_urlpatterns)),  # compare, a plan's run table and loss PNG
    path("imports/", import_views.imports_page, name="imports"),  # maintainers: the past
    path("healthz", views.healthz, name="healthz"),
    path("favicon.ico", views.favicon, name="favicon"),
    # GitHub sign-in refuses in words where no GitHub OAuth app is set up (allauth: a 500).
    path("accounts/github/login/", views.github_sign_in(github_views.oauth2_login)),
    path("accounts/github/login/callback/", views.github_sign_in(github_views.oauth2_callback)),
    path("accounts/", include("allauth.urls")),
    path("admin/", admin.site.urls),
    path("api/", RedirectView.as_view(pattern_name="api-docs"), name="api"),  # its pages
    path("api/v1/", include("marin_site.api_urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path(
        "api/docs/",
        SpectacularSwaggerSplitView.as_view(url_name="api-schema", template_name="api_docs.html"),
        name="api-docs",
    ),
]

handler404 = "marin_site.views.not_found"
handler500 = "marin_site.views.server_error"
