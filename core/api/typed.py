"""Request bodies declared once, as typed Python (a ``TypedDict`` validated by pydantic): the same declaration
checks the body, shapes the 400 answer and generates the OpenAPI schema.

Why not a DRF serializer: its fields run Python per value (a 1,000-record usage batch costs ~25 ms to
validate, as much as storing it), where pydantic-core validates the same batch in about a millisecond. The
answer keeps the API's shape and wording: ``400 invalid`` with ``extra.fields`` nested as DRF nests them
(``{"records": {"0": {"cards": [...]}}}``), DRF's own sentences where DRF has one (so they come translated by
its catalogue) and core.api.strict's for a value of the wrong JSON type.

A declaration is strict about JSON types the way core.api.strict makes serializers strict: integers are JSON
integers (``"8"``, ``8.0`` and ``true`` are refused), strings are strings, and a date-time is a string with
a UTC offset (``AwareDateTime``: a naive time, or a number of seconds, is refused). Unknown keys are ignored,
as DRF ignores them.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Generic, TypeVar

from django.utils.translation import gettext as _
from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.plumbing import ResolvedComponent
from pydantic import AfterValidator, AwareDatetime, BeforeValidator, TypeAdapter, ValidationError
from pydantic_core import PydanticCustomError
from rest_framework import exceptions

T = TypeVar("T")

# DRF's description of the date-time formats it takes (rest_framework.fields.DateTimeField with ISO 8601).
_DATETIME_FORMAT = "YYYY-MM-DDThh:mm[:ss[.uuuuuu]][+HH:MM|-HH:MM|Z]"


def _datetime_text(value: Any) -> Any:
    # Lax pydantic would read a number as seconds since the epoch; a JSON date-time is a string.
    if type(value) is not str:
        raise PydanticCustomError("datetime_type", "Must be a date-time string.")
    return value


def _in_utc(value: datetime) -> datetime:
    # The same instant on datetime.UTC: pydantic's own tzinfo makes every later comparison and subtraction
    # several times slower (a usage batch does a dozen per record), and the database stores UTC anyway.
    try:
        return value.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00:00+03:00 has no UTC instant in datetime's range
        raise PydanticCustomError("datetime_range", "Date-time out of range.") from None


AwareDateTime = Annotated[AwareDatetime, BeforeValidator(_datetime_text), AfterValidator(_in_utc)]
"""An ISO 8601 date-time string that carries its UTC offset (a naive time is ambiguous across the platform's
time zones, so it is refused instead of guessed); validated to the same instant in UTC."""


def _json_kind(value: Any) -> str:
    """What a JSON value is, in words (core.api.strict says the same in English only)."""
    if isinstance(value, bool):
        return _("a boolean")
    if isinstance(value, int | float):
        return _("a number")
    if isinstance(value, str):
        return _("a string")
    if isinstance(value, list):
        return _("a list")
    if isinstance(value, dict):
        return _("an object")
    return type(value).__name__


def _message(error: Any) -> str:
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    # DRF's sentences (the same msgids, so DRF's catalogue translates them) or core.api.strict's.
    if kind == "missing":
        return _("This field is required.")
    if kind in {"int_type", "int_parsing", "int_from_float"}:
        return _("Must be %(what)s, not %(kind)s.") % {"what": _("an integer"), "kind": _json_kind(value)}
    if kind == "datetime_type":
        return _("Must be %(what)s, not %(kind)s.") % {
            "what": _("a date-time string"),
            "kind": _json_kind(value),
        }
    if kind == "string_type":
        return _("Must be %(what)s, not %(kind)s.") % {"what": _("a string"), "kind": _json_kind(value)}
    if kind == "list_type":
        return _('Expected a list of items but got type "%(input_type)s".') % {
            "input_type": type(value).__name__
        }
    if kind in {"dict_type", "model_type", "model_attributes_type"}:
        return _("Invalid data. Expected a dictionary, but got %(datatype)s.") % {
            "datatype": type(value).__name__
        }
    if kind == "greater_than_equal":
        return _("Ensure this value is greater than or equal to %(limit_value)s.") % {
            "limit_value": ctx.get("ge")
        }
    if kind == "less_than_equal":
        return _("Ensure this value is less than or equal to %(limit_value)s.") % {
            "limit_value": ctx.get("le")
        }
    if kind == "string_too_short":
        return _("This field may not be blank.")
    if kind == "string_too_long":
        return _("Ensure this field has no more than %(max_length)s characters.") % {
            "max_length": ctx.get("max_length")
        }
    if kind == "too_short":
        return _("This list may not be empty.")
    if kind == "too_long":
        return _("Ensure this field has no more than %(max_length)s elements.") % {
            "max_length": ctx.get("max_length")
        }
    if kind == "datetime_range":
        return _("Datetime value out of range.")
    if kind == "timezone_aware":
        return _("Include a UTC offset (e.g. 2026-11-21T10:00:00+08:00 or ...Z).")
    if kind.startswith(("datetime_", "date_", "time_")):
        return _("Datetime has wrong format. Use one of these formats instead: %(format)s.") % {
            "format": _DATETIME_FORMAT
        }
    return str(error["msg"])


def field_errors(exc: ValidationError) -> dict[str, Any]:
    """pydantic's errors as DRF nests field errors: ``{"records": {"0": {"cards": ["..."]}}}``; an error of
    the body itself under ``non_field_errors``."""
    fields: dict[str, Any] = {}
    for error in exc.errors(include_url=False):
        node = fields
        path = [str(part) for part in error["loc"]] or ["non_field_errors"]
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if isinstance(child, list):  # a message about the container and one about its items
                child = node[part] = {"non_field_errors": child}
            node = child
        leaf = path[-1]
        existing = node.get(leaf)
        if isinstance(existing, dict):
            existing.setdefault("non_field_errors", []).append(_message(error))
        else:
            node.setdefault(leaf, []).append(_message(error))
    return fields


class TypedBody(Generic[T]):
    """One request body's declaration: ``validate`` answers the typed value or raises DRF's ValidationError
    (the exception handler answers ``400 invalid``); ``@extend_schema(request=body)`` documents it."""

    def __init__(self, declaration: type[T], *, name: str) -> None:
        self.declaration = declaration
        self.name = name
        self.adapter: TypeAdapter[T] = TypeAdapter(declaration)

    def validate(self, data: Any) -> T:
        try:
            return self.adapter.validate_python(data)
        except ValidationError as exc:
            raise exceptions.ValidationError(field_errors(exc)) from None

    def json_schema(self, *, suffix: str = "") -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """The body's JSON schema and its nested components, named ``<class name><suffix>`` and referred to
        under ``#/components/schemas/``."""
        schema = self.adapter.json_schema(
            ref_template="#/components/schemas/{model}" + suffix, mode="validation"
        )
        components = {f"{name}{suffix}": _untitled(sub) for name, sub in schema.pop("$defs", {}).items()}
        return _untitled(schema), components


def _untitled(schema: Any) -> Any:
    """Drop pydantic's generated ``title``s (the class or field name again), which the other components lack."""
    if isinstance(schema, dict):
        return {
            key: _untitled(value)
            for key, value in schema.items()
            if not (key == "title" and isinstance(value, str))
        }
    if isinstance(schema, list):
        return [_untitled(value) for value in schema]
    return schema


class TypedBodyExtension(OpenApiSerializerExtension):
    """drf-spectacular: a TypedBody is a component named after it, its nested declarations components too
    (with drf-spectacular's ``Request`` suffix on the request side, as serializers get)."""

    target_class = TypedBody
    match_subclasses = True

    def get_name(self, auto_schema: Any, direction: Any) -> str:
        return str(self.target.name)

    def map_serializer(self, auto_schema: Any, direction: Any) -> Any:
        suffix = "Request" if direction == "request" else ""
        schema, components = self.target.json_schema(suffix=suffix)
        for name, sub_schema in components.items():
            auto_schema.registry.register_on_missing(
                ResolvedComponent(name=name, type=ResolvedComponent.SCHEMA, object=name, schema=sub_schema)
            )
        return schema
