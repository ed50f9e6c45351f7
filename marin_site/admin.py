"""The admin site, and the admin classes whose edits are recorded on timelines.

``SiteAdmin`` is Django's admin opened also to the people an app gives something to manage
in it. Django's admin lets in staff accounts only; this one also lets in an active user who
holds an app's module permission (``user.has_module_perms(app_label)``, which django-rules
answers from the apps' ``permissions.py``: maintainers, for the recipes and the GitHub sync),
and every page inside still asks the model's own permission. So a maintainer, made in the
admin or through ``GITHUB_MAINTAINERS``, opens the admin for what they manage without a staff
flag, and a contributor does not open it at all.

Edits made in the admin go on a timeline like any other change (door: admin).
``RecordedAdmin`` is a ModelAdmin whose saves and deletes call ``admin_event_record``, which
each app implements for its models: a proposal's edit lands on its own timeline, a comment's
or review's on its proposal's, a recipe's in the recipe's history, a run's on the run's
timeline. Timeline rows themselves are append-only: ``TimelineAdmin`` shows them and allows
nothing else.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from django.db.models import Model, QuerySet
from django.http import HttpRequest

from marin_site.events import Verb


class SiteAdminLoginForm(AdminAuthenticationForm):
    def confirm_login_allowed(self, user: Any) -> None:
        AuthenticationForm.confirm_login_allowed(self, user)  # active accounts only
        if not admin.site.user_may_enter(user):  # type: ignore[attr-defined]
            raise ValidationError(
                self.error_messages["invalid_login"],
                code="invalid_login",
                params={"username": self.username_field.verbose_name},
            )


class SiteAdmin(admin.AdminSite):
    login_form = SiteAdminLoginForm

    def user_may_enter(self, user: Any) -> bool:
        if not getattr(user, "is_active", False):
            return False
        if user.is_staff:
            return True
        labels = {model._meta.app_label for model in self._registry}
        return any(user.has_module_perms(label) for label in sorted(labels))

    def has_permission(self, request: HttpRequest) -> bool:
        return self.user_may_enter(request.user)


class RecordedAdmin(admin.ModelAdmin):
    """A ModelAdmin whose saves and deletes are recorded on a timeline."""

    def admin_event_record(
        self, *, request: HttpRequest, obj: Any, verb: Verb, message: str
    ) -> None:
        raise NotImplementedError

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        before = type(obj)._default_manager.filter(pk=obj.pk).first() if change else None
        super().save_model(request, obj, form, change)
        changed = sorted(_changed_fields(before, obj) | _changed_relations(obj, form))
        if change and not changed:
            return
        self.admin_event_record(
            request=request,
            obj=obj,
            verb=Verb.ADMIN_EDITED if change else Verb.ADMIN_CREATED,
            message="Changed " + ", ".join(changed) if change else "",
        )

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        self.admin_event_record(
            request=request, obj=obj, verb=Verb.ADMIN_DELETED, message=str(obj)[:200]
        )
        super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        for obj in queryset:
            self.admin_event_record(
                request=request, obj=obj, verb=Verb.ADMIN_DELETED, message=str(obj)[:200]
            )
        super().delete_queryset(request, queryset)


class TimelineAdmin(admin.ModelAdmin):
    """Timeline rows are appended by the code, never added, edited or deleted by hand."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


def _changed_fields(before: Model | None, after: Model) -> set[str]:
    """The stored fields whose value the save changed (the form's ``changed_data`` also
    names fields it merely re-formatted, such as JSON it wrote back the same)."""
    if before is None:
        return set()
    return {
        field.name
        for field in after._meta.concrete_fields
        if field.editable
        and not getattr(field, "auto_now", False)
        and field.value_from_object(before) != field.value_from_object(after)
    }


def _changed_relations(obj: Model, form: Any) -> set[str]:
    """Many-to-many fields the form changed (saved after the object, by ``save_related``)."""
    many = {field.name for field in obj._meta.many_to_many}
    return {name for name in form.changed_data if name in many}
