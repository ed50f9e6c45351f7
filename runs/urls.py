from django.urls import path

from runs import views

app_name = "runs"

urlpatterns = [
    path("", views.recipe_list, name="recipe-list"),
    path("new/", views.recipe_create, name="recipe-create"),
    path("<slug:name>/v<str:version>/", views.recipe_detail, name="recipe-detail"),
    path("<slug:name>/v<str:version>/edit/", views.recipe_edit, name="recipe-edit"),
]

# Results pages, mounted at the site root (marin_site/urls.py) with names of their own.
result_urlpatterns = [
    path("runs/compare/", views.run_compare, name="run-compare"),
    path("plans/<int:plan_id>/runs/", views.plan_run_table, name="plan-run-table"),
    path("plans/<int:plan_id>/loss.png", views.plan_loss_png, name="plan-loss-png"),
]
