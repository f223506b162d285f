"""OpenAPI: the shared error shape, documented on every operation by one postprocessing hook."""

from __future__ import annotations

from typing import Any

from drf_spectacular.contrib.django_filters import DjangoFilterExtension
from drf_spectacular.openapi import AutoSchema
from rest_framework import serializers

ERROR_COMPONENT = "Error"

_ERROR_SCHEMA = {
    "type": "object",
    "required": ["code", "message", "extra"],
    "properties": {
        "code": {"type": "string", "description": "Stable snake_case error code.", "example": "invalid"},
        "message": {"type": "string", "description": "Human-readable explanation."},
        "extra": {
            "type": "object",
            "additionalProperties": True,
            "description": "Details: `fields` for field errors, or values named by the code.",
        },
    },
}

# Which errors any operation can answer: auth, permission, throttling, content negotiation.
_COMMON = {
    "400": "Invalid input (`invalid`, `parse_error` or a domain code); nothing was written.",
    "401": "No or invalid credentials (`not_authenticated`, `authentication_failed`).",
    "403": "Not allowed for this organisation or credential (`permission_denied`, `read_only_credential`, ...).",
    "404": "No such object for this caller (`not_found`): other organisations' objects answer 404 too.",
    "405": "Method not allowed.",
    "406": "Not acceptable.",
    "429": "Throttled (`throttled`, see `Retry-After`).",
    "503": "Busy (`database_busy`, see `Retry-After`): a lock or statement timeout; nothing was written, retry.",
}
_WRITES = {
    "409": "Conflicts with the current state (e.g. `identifier_taken`).",
    "413": "Body too large (`payload_too_large`).",
    "415": "Unsupported media type.",
}


class ErrorSerializer(serializers.Serializer):
    """For views that name the error shape explicitly in extend_schema."""

    code = serializers.CharField()
    message = serializers.CharField()
    extra = serializers.DictField()


def postprocess_error_responses(
    result: dict[str, Any], generator: Any, request: Any, public: bool
) -> dict[str, Any]:
    components = result.setdefault("components", {}).setdefault("schemas", {})
    components[ERROR_COMPONENT] = _ERROR_SCHEMA
    ref = {"$ref": f"#/components/schemas/{ERROR_COMPONENT}"}
    for path_item in result.get("paths", {}).values():
        for method, operation in path_item.items():
            if method not in {"get", "post", "put", "patch", "delete"}:
                continue
            responses = operation.setdefault("responses", {})
            wanted = dict(_COMMON)
            if method != "get":
                wanted.update(_WRITES)
            for status_code, description in wanted.items():
                responses.setdefault(
                    status_code,
                    {"description": description, "content": {"application/json": {"schema": ref}}},
                )
    return result


class CardhourAutoSchema(AutoSchema):
    """Names components after the view that nests them (``ClusterListApi.Input`` → ``ClusterListInput``),
    so the one-view-per-operation style with nested Input/Output serializers gives unique names.

    Declares what the server accepts where drf-spectacular leaves it out: a nested list
    (``Item(many=True, allow_empty=False, max_length=…)``) gets ``minItems``/``maxItems``, and a decimal string
    a pattern that needs a digit and has no sign when the field takes nothing below zero (decimal_pattern)."""

    def _map_serializer_field(self, field: Any, direction: Any, bypass_extensions: bool = False) -> Any:
        schema = super()._map_serializer_field(field, direction, bypass_extensions)
        if isinstance(field, serializers.DecimalField) and "pattern" in schema:
            schema["pattern"] = decimal_pattern(field)
        if (
            direction == "request"
            and type(field) is serializers.CharField
            and field.trim_whitespace
            and not field.allow_blank
            and "pattern" not in schema
            and "format" not in schema
        ):
            # The field strips the value (str.strip) before refusing a blank one: a value of whitespace
            # alone ("\t") is a 400 `invalid`, so the schema asks for one character that is not.
            schema["pattern"] = NOT_BLANK_PATTERN
        if isinstance(field, serializers.ListSerializer) and schema.get("type") == "array":
            min_items = getattr(field, "min_length", None) or (0 if field.allow_empty else 1)
            if min_items:
                schema["minItems"] = min_items
            max_items = getattr(field, "max_length", None)  # DRF ≥ 3.15; the stubs lag
            if max_items is not None:
                schema["maxItems"] = max_items
        return schema

    def get_serializer_name(self, serializer: Any, direction: Any) -> str:
        qualname = type(serializer).__qualname__
        if "." not in qualname:
            return str(super().get_serializer_name(serializer, direction))
        parts = [part.removesuffix("Api") for part in qualname.split(".")]
        return "".join(parts)


def one_of_to_any_of(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """Postprocessing hook: every ``oneOf`` without a discriminator becomes ``anyOf``.

    drf-spectacular writes ``oneOf`` for a blank-able URL (a URI, or an empty string), a choice that may be
    blank or null (the enum, a blank enum, a null enum), and the like. ``oneOf`` demands that *exactly one*
    branch match, which is not what the server checks (it accepts a value matching any branch) and which a
    strict client or validator can get wrong where branches overlap. ``anyOf`` says what the server does.
    """

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            if "oneOf" in node and "discriminator" not in node:
                node["anyOf"] = node.pop("oneOf")
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
        return node

    walk(result)
    return result


# Text the server stores cannot hold NUL (PostgreSQL text refuses it): the JSON parser answers
# ``invalid_text`` and form fields "Null characters are not allowed." (core.api.parsers). Say so.
NO_NUL_PATTERN = "^[^\\u0000]*$"


# Text with no NUL and at least one character that ``str.strip`` keeps: what a CharField that trims and
# refuses blank accepts. Python's whitespace (``str.isspace``, what DRF trims) is not a regex's ``\s``
# (\x1c-\x1f and \x85 are Python's, \ufeff is the regex's), so the characters are listed, written out
# rather than computed at import (a pass over every code point: ~60 ms in every process);
# tests/core/test_schema_not_blank.py checks it against ``str.strip`` for every code point.
NOT_BLANK_PATTERN = (
    "^[^\\u0000]*[^\\u0000\\u0009-\\u000d\\u001c-\\u0020\\u0085\\u00a0\\u1680\\u2000-\\u200a"
    "\\u2028-\\u2029\\u202f\\u205f\\u3000][^\\u0000]*$"
)
_FORMATS_WITHOUT_NUL = {"date-time", "date", "time", "binary", "uuid", "decimal"}


def text_without_nul(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """Postprocessing hook: every free-text string (no enum, pattern or a format that already excludes it)
    gets the pattern ``^[^\\u0000]*$``, so the schema declares the NUL refusal the server makes."""

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            if (
                node.get("type") == "string"
                and "enum" not in node
                and "pattern" not in node
                and node.get("format") not in _FORMATS_WITHOUT_NUL
            ):
                node["pattern"] = NO_NUL_PATTERN
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
        return node

    walk(result)
    return result


class CardhourDjangoFilterExtension(DjangoFilterExtension):
    """django-filter parameters as the server reads them (core.api.filters.StrictDjangoFilterBackend): a
    number filter's ``min_value``/``max_value`` as ``minimum``/``maximum``, and no empty values."""

    target_class = "core.api.filters.StrictDjangoFilterBackend"
    priority = 1

    def resolve_filter_field(
        self, auto_schema: Any, model: Any, filterset_class: Any, field_name: str, filter_field: Any
    ) -> list[dict[str, Any]]:
        parameters: list[dict[str, Any]] = super().resolve_filter_field(
            auto_schema, model, filterset_class, field_name, filter_field
        )
        for parameter in parameters:
            schema = parameter.get("schema", {})
            if schema.get("type") in ("integer", "number"):
                for bound, key in (("min_value", "minimum"), ("max_value", "maximum")):
                    if filter_field.extra.get(bound) is not None:
                        schema[key] = filter_field.extra[bound]
            elif schema.get("type") == "string" and "enum" not in schema:
                schema.setdefault("minLength", 1)
        return parameters


def decimal_pattern(field: serializers.DecimalField) -> str:
    """The strings ``field`` accepts, as a pattern. drf-spectacular writes ``^-?\\d{0,N}(?:\\.\\d{0,M})?$``,
    which matches "" and "-" (the server answers "A valid number is required.") and a sign on a field whose
    ``min_value`` is zero or more. At least one digit, before or after the point; a sign only if it can
    be negative."""
    places = field.decimal_places
    whole = None if field.max_digits is None or places is None else field.max_digits - places
    sign = "" if field.min_value is not None and field.min_value >= 0 else "-?"
    digits = r"\d+" if whole is None else rf"\d{{1,{whole}}}" if whole > 0 else "0"
    if places is None:
        return rf"^{sign}(?:{digits}(?:\.\d*)?|\.\d+)$"
    if places == 0:
        return rf"^{sign}{digits}$"
    return rf"^{sign}(?:{digits}(?:\.\d{{0,{places}}})?|\.\d{{1,{places}}})$"
