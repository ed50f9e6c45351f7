from django.urls import path

from runs.pools import views

app_name = "pools"

urlpatterns = [
    path("", views.pool_list, name="list"),
    path("new/", views.pool_create, name="create"),
    path("<slug:name>/", views.pool_detail, name="detail"),
    path("<slug:name>/tokens/", views.pool_token_create, name="token-create"),
    path("<slug:name>/tokens/<int:token_id>/revoke/", views.pool_token_revoke, name="token-revoke"),
    path("<slug:name>/agents/<int:agent_id>/revoke/", views.agent_revoke, name="agent-revoke"),
    path("<slug:name>/retire/", views.pool_retire, name="retire"),
]

# The agent program and the run client, at stable addresses (marin_site/urls.py mounts these).
file_urlpatterns = [
    path(
        "agent/marin-site-agent.py",
        views.served_file,
        {"name": "marin-site-agent.py"},
        name="agent-program",
    ),
    path(
        "agent/marin_run_client.py",
        views.served_file,
        {"name": "marin_run_client.py"},
        name="run-client",
    ),
]
