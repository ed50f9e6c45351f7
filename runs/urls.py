from django.urls import path

from runs import views

app_name = "runs"

urlpatterns = [
    path("", views.recipe_list, name="recipe-list"),
    path("new/", views.recipe_create, name="recipe-create"),
    path("<slug:name>/v<str:version>/", views.recipe_detail, name="recipe-detail"),
    path("<slug:name>/v<str:version>/edit/", views.recipe_edit, name="recipe-edit"),
]
