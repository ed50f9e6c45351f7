from django.urls import path

from proposals.board import views

app_name = "board"

urlpatterns = [
    path("", views.board, name="board"),
    path("runs.json", views.board_export, name="export"),
]
