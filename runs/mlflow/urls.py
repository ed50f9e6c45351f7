"""Under ``/mlflow/`` (marin_site/urls.py): MLflow clients call
``<tracking_uri>/api/2.0/mlflow/...``; its UI calls the same under ``ajax-api``."""

from django.urls import re_path

from runs.mlflow import views

urlpatterns = [
    re_path(r"^(?:ajax-)?api/2\.0/(?:preview/)?mlflow/(?P<path>.*)$", views.endpoint),
    re_path(r"^(?P<path>.*)$", views.elsewhere),
]
