"""The board's pages, under ``/board/``; its API is in ``marin_site/api_urls.py``."""

from django.urls import path

from proposals.board import views
from proposals.board.feeds import BoardFeed

app_name = "board"

urlpatterns = [
    path("", views.board, name="board"),
    path("chart.json", views.board_chart, name="chart"),
    path("runs.json", views.board_export, name="export"),
    path("feed/", BoardFeed(), name="feed"),
]
