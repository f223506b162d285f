"""The compute-identifier grammar in the OpenAPI schema (federation.identifiers): body fields that take
an identifier or a segment, and a postprocessing hook for the path and query parameters that do."""

from __future__ import annotations

from typing import Any

from django.utils.translation import gettext as _
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from federation import identifiers

_CLUSTER_CPI = {
    "type": "string",
    "pattern": identifiers.CLUSTER_CPI_REGEX,
    "maxLength": identifiers.MAX_LENGTH,
}
_SEGMENT = {"type": "string", "pattern": identifiers.SEGMENT_REGEX, "maxLength": 32}


@extend_schema_field(_CLUSTER_CPI)
class ClusterIdentifierField(serializers.CharField):
    """A cluster's CPI (``cpi:<operator>:<hub>:<cluster>``). The service parses it and answers
    ``invalid_identifier`` with its reason; the schema carries the grammar."""


@extend_schema_field(_SEGMENT)
class SegmentField(serializers.CharField):
    """One identifier segment (an island's name): 1–32 of a–z, 0–9 and inner hyphens."""


def segment_grammar(value: str) -> None:
    """Validator: ``value`` is one identifier segment (federation.identifiers)."""
    try:
        identifiers.validate_segment(value, what="name")
    except identifiers.IdentifierError as exc:
        raise serializers.ValidationError(exc.detail, code="invalid_segment") from None


def cluster_cpi_grammar(value: str) -> None:
    """Validator: ``value`` is a cluster's CPI (four segments)."""
    try:
        parsed = identifiers.parse(value)
    except identifiers.IdentifierError as exc:
        raise serializers.ValidationError(exc.detail, code="invalid_identifier") from None
    if parsed.level != identifiers.Level.CLUSTER:
        raise serializers.ValidationError(
            _("must name a cluster: cpi:<operator>:<hub>:<cluster>"), code="invalid_identifier"
        )


@extend_schema_field({"type": "string", "enum": list(identifiers.HUB_CODES)})
class HubCodeField(serializers.CharField):
    """A hub's code: one of the national hubs, or ``ext``. The services answer an unknown one with their
    own code (``unknown_hub``, ``job_invalid``); the schema lists the hubs."""


# Path parameters by name, and query parameters by (path, name), that take the grammar.
_PATH_PARAMETERS = {
    "cpi": _CLUSTER_CPI,
    "identifier": {"type": "string", "pattern": identifiers.CPI_REGEX, "maxLength": identifiers.MAX_LENGTH},
    "name": _SEGMENT,
}
_QUERY_PARAMETERS = {("/api/v1/operator/leases", "cluster"): _CLUSTER_CPI}


def declare_identifier_grammar(
    result: dict[str, Any], generator: Any, request: Any, public: bool
) -> dict[str, Any]:
    """Postprocessing hook: the identifier grammar on the parameters that take identifiers or segments."""
    for path, item in result.get("paths", {}).items():
        for operation in item.values():
            if not isinstance(operation, dict):
                continue
            for parameter in operation.get("parameters", []):
                name, location = parameter.get("name"), parameter.get("in")
                declared = None
                if location == "path":
                    declared = _PATH_PARAMETERS.get(name)
                elif location == "query":
                    declared = _QUERY_PARAMETERS.get((path, name))
                if declared is not None:
                    parameter["schema"] = {**parameter.get("schema", {}), **declared}
    return result
