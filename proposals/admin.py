from django.contrib import admin
from django.db import models

from proposals.models import Amendment, Comment, Event, Label, Proposal, Review


class ReviewInline(admin.TabularInline):
    model = Review
    extra = 0


@admin.register(Proposal)
class ProposalAdmin(admin.ModelAdmin):
    list_display = ["id", "title", "state", "outcome", "recipe", "author", "created_at"]
    list_filter = ["state", "outcome", "recipe", "labels"]
    search_fields = ["title", "summary", "hypothesis"]
    raw_id_fields = ["author", "plan"]
    inlines = [ReviewInline]
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}


@admin.register(Review)
class ReviewAdmin(admin.ModelAdmin):
    list_display = ["proposal", "reviewer", "score", "recommendation", "created_at"]
    raw_id_fields = ["proposal", "reviewer"]


@admin.register(Comment)
class CommentAdmin(admin.ModelAdmin):
    list_display = ["proposal", "author", "author_label", "created_at"]
    raw_id_fields = ["proposal", "author"]


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    list_display = ["proposal", "verb", "from_state", "to_state", "door", "actor", "created_at"]
    list_filter = ["door", "verb"]
    raw_id_fields = ["proposal", "actor"]


admin.site.register(Label)
admin.site.register(Amendment)
