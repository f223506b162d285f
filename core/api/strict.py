"""JSON bodies typed as the schema says.

DRF's fields come from form handling and coerce: a string field takes ``0`` and stores ``"0"``, a boolean
takes ``"true"``, ``"1"`` or ``1``, an integer takes ``"12"`` or ``12.0``, a decimal a JSON number. The API
parses JSON only (core.api.parsers), where every value already has a type, and the schema promises one
type per field, so a value of another type is a 400 ``invalid`` naming the field, nested as DRF nests field
errors (``{"islands": {"0": {"name": [...]}}}``), instead of being converted: a client that sends ``"cards": "8"`` learns it
now rather than from a client generated from the schema later.

Only request bodies are checked: the parser marks the decoded top-level object (``JsonBody``), and
``Serializer.to_internal_value`` checks the whole tree once at the root before DRF validates it. Query
strings (all text) and multipart uploads go through DRF unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rest_framework import serializers


class JsonBody(dict[str, Any]):
    """The top-level object of a JSON request body (core.api.parsers.JSONParser)."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# (field class, test, what the field takes): the first matching class wins, so subclasses come first.
_RULES: list[tuple[type[serializers.Field], Callable[[Any], bool], str]] = [
    (serializers.BooleanField, lambda v: isinstance(v, bool), "true or false"),
    (serializers.IntegerField, _is_int, "an integer"),
    (serializers.FloatField, _is_number, "a number"),
    (serializers.DecimalField, lambda v: isinstance(v, str), 'a decimal number in a string (e.g. "12.50")'),
    (serializers.DateTimeField, lambda v: isinstance(v, str), "a date-time string"),
    (serializers.DateField, lambda v: isinstance(v, str), "a date string"),
    (serializers.TimeField, lambda v: isinstance(v, str), "a time string"),
    (serializers.DurationField, lambda v: isinstance(v, str), "a duration string"),
    (serializers.CharField, lambda v: isinstance(v, str), "a string"),
    (serializers.ListField, lambda v: isinstance(v, list), "a list"),
    (serializers.ListSerializer, lambda v: isinstance(v, list), "a list"),
]


def _choice_rule(field: serializers.ChoiceField) -> tuple[Callable[[Any], bool], str]:
    kinds = {type(key) for key in field.choices}
    if kinds <= {str}:
        return (lambda v: isinstance(v, str)), "a string"
    return (lambda v: type(v) in kinds), "one of the listed values"


Errors = dict[str, Any]  # field name or list index -> [message] or nested Errors


def json_type_errors(field: serializers.Field, value: Any, key: str, errors: Errors) -> None:
    """Collect, under ``errors[key]``, a message for every value in ``value`` whose JSON type ``field``
    does not take (nested like the value)."""
    if value is None or field.read_only:
        return  # null is DRF's to judge (allow_null); read-only input is ignored
    if isinstance(field, serializers.ChoiceField) and not isinstance(field, serializers.MultipleChoiceField):
        test, what = _choice_rule(field)
        if not test(value):
            errors[key] = [f"Must be {what}, not {_json_kind(value)}."]
        return
    for cls, test, what in _RULES:
        if isinstance(field, cls):
            if not test(value):
                errors[key] = [f"Must be {what}, not {_json_kind(value)}."]
                return
            break
    inner: Errors = {}
    if isinstance(field, (serializers.ListSerializer, serializers.ListField)):
        child = field.child
        if child is not None:
            for index, item in enumerate(value):
                json_type_errors(child, item, str(index), inner)
    elif isinstance(field, serializers.Serializer) and isinstance(value, dict):
        _object_errors(field, value, inner)
    if inner:
        errors[key] = inner


def _object_errors(serializer: serializers.Serializer, data: dict[str, Any], errors: Errors) -> None:
    for name, field in serializer.fields.items():
        if name in data and not field.read_only:
            json_type_errors(field, data[name], name, errors)


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


_original_to_internal_value = serializers.Serializer.to_internal_value


def _typed_to_internal_value(self: serializers.Serializer, data: Any) -> Any:
    if isinstance(data, JsonBody):
        errors: Errors = {}
        _object_errors(self, data, errors)
        if errors:
            raise serializers.ValidationError(errors)
    return _original_to_internal_value(self, data)


def strict_json_install() -> None:
    """Check JSON bodies' types at the root serializer (called once, from CoreConfig.ready)."""
    serializers.Serializer.to_internal_value = _typed_to_internal_value  # type: ignore[method-assign,assignment]
