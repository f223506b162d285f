"""OpenAPI: the shared error shape, documented on every operation by one postprocessing hook."""

from __future__ import annotations

from typing import Any

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
}
_WRITES = {
    "409": "Conflicts with the current state (e.g. `identifier_taken`).",
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
    so the one-view-per-operation style with nested Input/Output serializers gives unique names."""

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
