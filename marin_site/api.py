"""API plumbing shared by both apps: the exception handler and a named-permission class."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import permissions, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView
from rest_framework.views import exception_handler as drf_exception_handler

from marin_site.errors import DomainError, TransitionNotAllowed


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Domain errors keep their status (403, 409, ...); Django validation errors become 400."""
    if isinstance(exc, TransitionNotAllowed):
        return Response(
            {
                "detail": exc.message,
                "current_state": exc.current,
                "allowed_states": exc.allowed,
            },
            status=exc.status_code,
        )
    if isinstance(exc, DomainError):
        return Response({"detail": exc.message}, status=exc.status_code)
    if isinstance(exc, DjangoValidationError):
        body = exc.message_dict if hasattr(exc, "error_dict") else {"detail": exc.messages}
        if "__all__" in body:
            body = {"non_field_errors": body.pop("__all__"), **body}
        return Response(body, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, RequestDataTooBig):
        return Response(
            {"detail": "Request body exceeds the configured cap."},
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    return drf_exception_handler(exc, context)


class HasNamedPermission(permissions.BasePermission):
    """Checks the view's ``permission_name`` (a django-rules name) for writes.

    Reads are public. The object-level check runs in the service too, so a door that
    forgets it still cannot act.
    """

    def has_permission(self, request: Request, view: APIView) -> bool:
        if request.method in permissions.SAFE_METHODS:
            return True
        name = getattr(view, "permission_name", None)
        if not request.user or not request.user.is_authenticated:
            return False
        return name is None or request.user.has_perm(name)

    def has_object_permission(self, request: Request, view: APIView, obj: Any) -> bool:
        if request.method in permissions.SAFE_METHODS:
            return True
        name = getattr(view, "object_permission_name", None)
        return name is None or request.user.has_perm(name, obj)
