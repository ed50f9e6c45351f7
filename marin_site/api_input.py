"""The input policy (``marin_site.input``) on DRF serializers: ``Serializer`` and
``ModelSerializer`` here check each writable field's raw value by the field's kind before
DRF's own coercion can bend it (``1.5`` read as id 1, ``true`` as 1.0, ``1e400`` stored as
the text "inf"), and answer 400 with every refused field named.

A JSON body must write integers as numbers; a form-encoded one (the browsable API, a form
post) only has text, so there a string of digits is an integer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from django.db.models import Model
from django.http import QueryDict
from rest_framework import serializers

from marin_site.input import (
    InputRefused,
    clean_text,
    document_problem,
    finite_number,
    strict_id,
)

_I = TypeVar("_I")
_M = TypeVar("_M", bound=Model)


def field_refusal(field: serializers.Field, value: Any, *, name: str, text_only: bool) -> None:
    """Raise ``InputRefused`` when ``value`` breaks the policy for ``field``'s kind."""
    if value is None or isinstance(field, serializers.BooleanField):
        return
    if isinstance(field, serializers.ManyRelatedField):
        if isinstance(value, list):
            for item in value:
                field_refusal(field.child_relation, item, name=name, text_only=text_only)
        return
    if isinstance(field, serializers.PrimaryKeyRelatedField | serializers.IntegerField):
        strict_id(value, field=name, digits_allowed=text_only)
    elif isinstance(field, serializers.FloatField | serializers.DecimalField):
        finite_number(value, field=name, digits_allowed=text_only)
    elif isinstance(field, serializers.CharField):
        clean_text(value, field=name)
    elif isinstance(field, serializers.JSONField | serializers.DictField):
        problem = document_problem(value, where=name)
        if problem:
            raise InputRefused(name, problem.removeprefix(f"{name}: "))
    elif isinstance(field, serializers.ListField) and isinstance(value, list):
        child = field.child
        if child is not None:
            for index, item in enumerate(value):
                field_refusal(child, item, name=f"{name}[{index}]", text_only=text_only)


class InputPolicyMixin:
    """Checks a serializer's input under the policy before DRF reads it."""

    fields: Any

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            text_only = isinstance(data, QueryDict)
            errors: dict[str, list[str]] = {}
            for name, field in self.fields.items():
                if field.read_only or name not in data:
                    continue
                value = data[name]
                if text_only and isinstance(data, QueryDict):
                    values = data.getlist(name)
                    value = values if isinstance(field, serializers.ListField) else data.get(name)
                try:
                    field_refusal(field, value, name=name, text_only=text_only)
                except InputRefused as exc:
                    errors[name] = [exc.message]
            if errors:
                raise serializers.ValidationError(errors)
        return super().to_internal_value(data)  # type: ignore[misc]


class Serializer(InputPolicyMixin, serializers.Serializer[_I]):
    """``serializers.Serializer`` under the input policy."""


class ModelSerializer(InputPolicyMixin, serializers.ModelSerializer[_M]):
    """``serializers.ModelSerializer`` under the input policy."""
