from django.urls import path

from runs.campaigns import views

app_name = "campaigns"

urlpatterns = [
    path("", views.campaign_list, name="list"),
    path("<slug:slug>/", views.campaign_detail, name="detail"),
    path("<slug:slug>/interventions/", views.intervention_add, name="intervention-add"),
]
