"""The admin site: Django's, opened also to the people an app gives something to manage in it.

Django's admin lets in staff accounts only. This one also lets in an active user who holds
an app's module permission (``user.has_module_perms(app_label)``, which django-rules answers
from the apps' ``permissions.py``: maintainers, for the recipes and the GitHub sync), and every
page inside still asks the model's own permission. So a maintainer, made in the admin or
through ``GITHUB_MAINTAINERS``, opens the admin for what they manage without a staff flag,
and a contributor does not open it at all.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from django.http import HttpRequest


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
