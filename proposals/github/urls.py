from django.urls import path

from proposals.github import views

app_name = "github"

urlpatterns = [
    path("webhook/", views.webhook, name="webhook"),
    path("outbox/", views.outbox_page, name="outbox"),
    path("outbox/<int:pk>/retry/", views.outbox_retry, name="outbox-retry"),
]
