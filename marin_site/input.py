"""The input policy: what every door (web forms, the API, MLflow's, the runner's and the
agents' doors, uploads) accepts of a value from outside, written once.

- JSON is parsed with limits on size, nesting and integer digits, and without NaN, Infinity
  or a number past the float range (``1e400``); a refusal names the field.
- Text has no NUL and no unpaired surrogate (refused, never mangled), is trimmed, and where a
  title or a name is asked for, has at least one visible character (control characters,
  zero-width and other format characters, or spaces alone are refused).
- An id is an integer: not a float (``1.5``, ``1e400``), not a boolean, and not a string of
  digits where the API says integer (a web form, which only sends text, may send digits).
- A number is finite where the field is a number, and a boolean is not a number.
- A web form whose bytes are not UTF-8 is refused in words, not stored with U+FFFD.

Every check raises ``InputRefused`` (a ``ValueError`` naming the field); each door turns it
into its own 400 (a form error, DRF's ``{"field": [...]}``, MLflow's INVALID_PARAMETER_VALUE).
The order of checks at every write is the permission first, then the input: a refusal never
tells someone who may not write what the form wants.
"""

from __future__ import annotations

import json
import math
import unicodedata
from typing import Any
from urllib.parse import unquote_to_bytes

from django import forms
from django.core.exceptions import FieldDoesNotExist, ValidationError

from marin_site.untrusted import INT_LIMIT, MAX_DEPTH, text_problem, untrusted_problem

MAX_JSON_BYTES = 1_000_000  # a JSON text area or field: a recipe's whole config fits in far less
MAX_INT_DIGITS = 19  # 2**63 has 19 digits: anything longer is past a bigint anyway
VISIBLE_FIELDS = frozenset({"title", "name", "username", "display_name"})


class InputRefused(ValueError):
    """A value the policy refuses: ``field`` names it, ``message`` says the rule."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ------------------------------------------------------------------------------ JSON


def _parse_int(field: str) -> Any:
    def parse(digits: str) -> int:
        if len(digits.lstrip("-")) > MAX_INT_DIGITS:
            raise InputRefused(field, f"an integer of {len(digits)} digits is past 64 bits")
        return int(digits)

    return parse


def _parse_float(field: str, *, finite: bool) -> Any:
    def parse(text: str) -> float:
        number = float(text[:400])  # a float's exponent, not its digits, makes it infinite
        if finite and not math.isfinite(number):
            raise InputRefused(field, f"the number {text[:40]} is past the float range")
        return number

    return parse


def _refuse_constant(field: str) -> Any:
    def parse(name: str) -> Any:
        raise InputRefused(field, f"{name} is not a JSON number")

    return parse


def json_depth_problem(text: str, limit: int = MAX_DEPTH) -> str | None:
    """Nesting past ``limit`` in JSON text, found by counting brackets outside strings, so
    neither the parser's recursion nor its memory is spent on a hostile document."""
    depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return f"nested deeper than {limit} levels"
        elif char in "]}":
            depth -= 1
    return None


def parse_json(
    raw: str | bytes,
    *,
    field: str,
    max_bytes: int = MAX_JSON_BYTES,
    finite: bool = True,
    walk: bool = True,
) -> Any:
    """``raw`` parsed under the policy; ``InputRefused`` naming ``field`` otherwise.
    ``walk=False`` leaves the walk of the parsed value (``document_problem``) to the caller."""
    if len(raw) > max_bytes:
        raise InputRefused(field, f"the JSON is {len(raw)} bytes; the limit is {max_bytes}")
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputRefused(field, f"not valid UTF-8 (at byte {exc.start})") from None
    else:
        text = raw
    depth = json_depth_problem(text)
    if depth:
        raise InputRefused(field, depth)
    try:
        value = json.loads(
            text,
            parse_int=_parse_int(field),
            parse_float=_parse_float(field, finite=finite),
            parse_constant=_refuse_constant(field),
        )
    except json.JSONDecodeError as exc:
        raise InputRefused(field, f"not JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise InputRefused(field, "nested too deeply") from None
    problem = document_problem(value, where=field, finite=finite) if walk else None
    if problem:
        raise InputRefused(field, problem)
    return value


def document_problem(value: Any, *, where: str = "", finite: bool = True) -> str | None:
    """The kernel's walk of a structured value (``marin_site.untrusted``), and, when
    ``finite``, no infinite or NaN float anywhere in it."""
    problem = untrusted_problem(value, where=where)
    if problem or not finite:
        return problem
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return f"{path or 'the document'}: {item} is not a finite number"
        if isinstance(item, dict):
            stack.extend((child, f"{path}.{key}" if path else key) for key, child in item.items())
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(item))
    return None


# ------------------------------------------------------------------------------ text


def has_visible(text: str) -> bool:
    """At least one character that is neither a control, format (zero-width), unassigned,
    private-use or surrogate code point (category C*) nor a separator (Z*)."""
    return any(unicodedata.category(char)[0] not in "CZ" for char in text)


def clean_text(
    value: Any,
    *,
    field: str,
    visible: bool | None = None,
    strip: bool = True,
    max_length: int = 0,
) -> str:
    """``value`` as stored text: a string, without NUL or unpaired surrogates, trimmed, and
    (``visible``, by default for the fields of ``VISIBLE_FIELDS``) with something to see."""
    if not isinstance(value, str):
        raise InputRefused(field, f"must be text, not {type(value).__name__} {_describe(value)}")
    problem = text_problem(value)
    if problem:
        raise InputRefused(field, problem)
    if strip:
        value = value.strip()
    if visible is None:
        visible = field in VISIBLE_FIELDS
    if visible and value and not has_visible(value):
        raise InputRefused(
            field, "has no visible character (only spaces, control or zero-width characters)"
        )
    if max_length and len(value) > max_length:
        raise InputRefused(field, f"is {len(value)} characters long; the limit is {max_length}")
    return value


def text_refusal(value: Any, *, field: str) -> str | None:
    """What ``clean_text`` would refuse in ``value`` (visible text for ``VISIBLE_FIELDS``), or
    None: for checks that must not change the value."""
    try:
        clean_text(value, field=field)
    except InputRefused as exc:
        return exc.message
    return None


# ------------------------------------------------------------------------------ numbers


def strict_id(value: Any, *, field: str, digits_allowed: bool = False) -> int:
    """An integer id. ``digits_allowed``: the door sends text only (a web form, a query
    string, a URL), so a string of digits is how it writes an integer."""
    if isinstance(value, bool):
        raise InputRefused(field, f"must be an integer id, not the boolean {value}")
    if isinstance(value, int):
        number = value
    elif digits_allowed and isinstance(value, str) and value.isascii() and value.isdigit():
        if len(value) > MAX_INT_DIGITS:
            raise InputRefused(field, "the id is past 64 bits")
        number = int(value)
    else:
        raise InputRefused(
            field, f"must be an integer id, not {type(value).__name__} {_describe(value)}"
        )
    if not -INT_LIMIT <= number < INT_LIMIT:
        raise InputRefused(field, "the id is past 64 bits")
    return number


def finite_number(value: Any, *, field: str, digits_allowed: bool = False) -> float:
    """A finite number (an int or a float; a boolean is not a number)."""
    if isinstance(value, bool):
        raise InputRefused(field, f"must be a number, not the boolean {value}")
    if isinstance(value, int):
        if not -INT_LIMIT <= value < INT_LIMIT:
            raise InputRefused(field, "the number is past 64 bits")
        return float(value)
    if isinstance(value, float):
        number = value
    elif digits_allowed and isinstance(value, str) and len(value) <= 64:
        try:
            number = float(value)
        except ValueError:
            raise InputRefused(field, f"must be a number, not {_describe(value)}") from None
    else:
        raise InputRefused(
            field, f"must be a number, not {type(value).__name__} {_describe(value)}"
        )
    if not math.isfinite(number):
        raise InputRefused(field, f"must be a finite number, not {number}")
    return number


# ------------------------------------------------------------------------------ web forms


def form_encoding_problem(body: bytes) -> str | None:
    """The first field of an ``application/x-www-form-urlencoded`` body whose name or value
    is not UTF-8 (Django would store it with U+FFFD in place of the bad bytes), or None."""
    for pair in body.split(b"&"):
        if not pair:
            continue
        name, _, value = pair.partition(b"=")
        raw_name = unquote_to_bytes(name.replace(b"+", b" "))
        try:
            label = raw_name.decode("utf-8")
        except UnicodeDecodeError:
            return "a field's name is not valid UTF-8"
        try:
            unquote_to_bytes(value.replace(b"+", b" ")).decode("utf-8")
        except UnicodeDecodeError:
            return f"the field '{label[:60]}' is not valid UTF-8"
    return None


def decoded_form_problem(fields: dict[str, list[str]]) -> str | None:
    """A multipart form's text fields, as Django decoded them: U+FFFD is what invalid bytes
    became (the raw body is not kept for a multipart upload), so it is refused there."""
    for name, values in fields.items():
        if "\ufffd" in name:
            return "a field's name is not valid UTF-8"
        if any("\ufffd" in value for value in values):
            return f"the field '{name[:60]}' is not valid UTF-8"
    return None


# ------------------------------------------------------------------------------ Django forms


class PolicyJSONField(forms.JSONField):
    """Django's JSON form field, parsing under the policy (a 400 beside the text area, never
    a RecursionError or Python's digit limit), and showing back exactly what was typed."""

    def to_python(self, value: Any) -> Any:
        if not self.disabled and value in self.empty_values and self._policy_empty is not None:
            return self._policy_empty()  # the model's column takes no NULL: its default
        if self.disabled or value in self.empty_values:
            return super().to_python(value)
        if isinstance(value, list | dict | int | float | forms.fields.JSONString):
            return value
        try:
            parsed = parse_json(str(value), field=self._policy_name)
        except InputRefused as exc:
            raise ValidationError(exc.message, code="invalid") from None
        return forms.fields.JSONString(parsed) if isinstance(parsed, str) else parsed

    def bound_data(self, data: Any, initial: Any) -> Any:
        if self.disabled:
            return initial
        return forms.fields.InvalidJSONInput(data) if data is not None else None

    _policy_name = ""
    _policy_empty: Any = None


def _visible_validator(field_name: str) -> Any:
    def validate(value: Any) -> None:
        if isinstance(value, str) and value and not has_visible(value):
            raise ValidationError(
                "This has no visible character (only spaces, control or zero-width characters).",
                code="invisible",
            )

    validate.field_name = field_name  # type: ignore[attr-defined]
    return validate


def _model_field(form: forms.BaseForm, name: str) -> Any:
    model = getattr(getattr(form, "_meta", None), "model", None)
    if model is None:
        return None
    try:
        return model._meta.get_field(name)
    except FieldDoesNotExist:  # a form field that is not the model's
        return None


def form_apply_policy(form: forms.BaseForm) -> None:
    """Put the policy on a form's fields: JSON fields parse under the limits, the text of a
    title or a name must have something visible. Django's own fields already refuse NUL
    (``ProhibitNullCharactersValidator``) and trim; the encoding is checked before the form
    is read (``marin_site.middleware.FormEncodingMiddleware``)."""
    for name, field in list(form.fields.items()):
        if isinstance(field, forms.JSONField) and not isinstance(field, PolicyJSONField):
            policy = PolicyJSONField(
                required=field.required,
                label=field.label,
                initial=field.initial,
                help_text=field.help_text,
                widget=field.widget,
                disabled=field.disabled,
                encoder=field.encoder,
                decoder=field.decoder,
            )
            policy.validators = list(field.validators)
            policy._policy_name = name
            model_field = _model_field(form, name)
            if model_field is not None and not model_field.null:
                policy._policy_empty = model_field.get_default
            form.fields[name] = policy
        elif isinstance(field, forms.CharField) and name in VISIBLE_FIELDS:
            field.validators.append(_visible_validator(name))


class PolicyFormMixin:
    """A form (``forms.Form`` or ``forms.ModelForm``) under the input policy."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        form_apply_policy(self)  # type: ignore[arg-type]


class PolicyForm(PolicyFormMixin, forms.Form):
    """``forms.Form`` under the input policy."""


class PolicyModelForm(PolicyFormMixin, forms.ModelForm):
    """``forms.ModelForm`` under the input policy."""
