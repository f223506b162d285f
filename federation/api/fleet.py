"""Bulk onboarding over REST: ``POST /api/v1/fleet-imports`` with a fleet inventory CSV.

Thin: the rules live in federation.fleet_import. The operator is always the caller's organisation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.urls import path
from django.utils.translation import gettext as _
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import parsers, serializers, status
from rest_framework.exceptions import ParseError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.context import actor_from_request
from core.api.permissions import IsOperator
from core.api.schema import ErrorSerializer
from core.errors import InvalidInputError
from federation.fleet_import import (
    DEFAULT_NODES_PER_ISLAND,
    MAX_BYTES_PER_ROW,
    MAX_NODES_PER_ISLAND,
    MAX_PREFIX_LENGTH,
    fleet_import,
)
from federation.identifiers import HUB_CODES
from federation.models import Fabric

TAG = "clusters"


def max_upload_bytes() -> int:
    return (settings.CARDHOUR_FLEET_IMPORT_MAX_ROWS + 1) * MAX_BYTES_PER_ROW


def _too_large(limit: int) -> str:
    return _("The inventory is larger than %(limit)d bytes.") % {"limit": limit}


class CsvParser(parsers.BaseParser):
    """A ``text/csv`` body, handed on as an uploaded file named ``file`` so both forms are one path."""

    media_type = "text/csv"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> dict[str, Any]:
        limit = max_upload_bytes()
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise ParseError(_too_large(limit))
        return {"file": ContentFile(raw, name="inventory.csv")}


class FleetImportOptions(serializers.Serializer):
    hub = serializers.ChoiceField(
        choices=HUB_CODES, required=False, help_text="Hub of rows without a hub column value."
    )
    site = serializers.CharField(
        max_length=100,
        required=False,
        allow_blank=True,
        help_text="Site of rows without a site column value.",
    )
    cluster_prefix = serializers.RegexField(
        r"^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$",
        max_length=MAX_PREFIX_LENGTH,
        required=False,
        allow_blank=True,
        default="",
        help_text="Prefix of derived cluster names.",
    )
    nodes_per_island = serializers.IntegerField(
        min_value=1,
        max_value=MAX_NODES_PER_ISLAND,
        default=DEFAULT_NODES_PER_ISLAND,
        help_text="Nodes of one model per island, in file order (32: one IB/RoCE leaf-spine pod).",
    )
    fabric = serializers.ChoiceField(
        choices=Fabric.choices,
        required=False,
        help_text="Fabric of every island without a fabric column value (default: from the chip; "
        "several nodes of NVLink chips are joined by InfiniBand, of HCCS chips by RoCE).",
    )
    allow_unknown_models = serializers.BooleanField(
        default=False, help_text="Add models missing from the catalog as unknown-spec entries, no figures."
    )
    dry_run = serializers.BooleanField(default=False, help_text="Validate and report; write nothing (200).")


class FleetImportUpload(FleetImportOptions):
    file = serializers.FileField(help_text="The inventory CSV (UTF-8), one row per node.")


class FleetImportModelTotalOutput(serializers.Serializer):
    accelerator = serializers.CharField()
    nodes = serializers.IntegerField()
    cards = serializers.IntegerField()
    islands = serializers.IntegerField()
    clusters = serializers.IntegerField()


class FleetImportClusterOutput(serializers.Serializer):
    cpi = serializers.CharField()
    hub = serializers.CharField()
    site = serializers.CharField()
    accelerator = serializers.CharField()
    outcome = serializers.ChoiceField(choices=["created", "unchanged"])
    nodes = serializers.IntegerField()
    cards = serializers.IntegerField()
    islands = serializers.IntegerField()


class FleetImportIssueOutput(serializers.Serializer):
    line = serializers.IntegerField(allow_null=True, help_text="1-based line in the file; the header is 1.")
    code = serializers.CharField()
    message = serializers.CharField()
    field = serializers.CharField(allow_null=True)


class FleetImportOutput(serializers.Serializer):
    operator = serializers.CharField()
    dry_run = serializers.BooleanField()
    rows = serializers.IntegerField()
    nodes = serializers.IntegerField()
    cards = serializers.IntegerField()
    skipped_nodes = serializers.IntegerField(help_text="Rows with 0 cards, skipped with a warning.")
    clusters_created = serializers.IntegerField()
    clusters_unchanged = serializers.IntegerField()
    islands_created = serializers.IntegerField()
    islands_unchanged = serializers.IntegerField()
    models = FleetImportModelTotalOutput(many=True)
    clusters = FleetImportClusterOutput(many=True)
    accelerators_created = serializers.ListField(child=serializers.CharField())
    warnings = FleetImportIssueOutput(many=True)
    warning_count = serializers.IntegerField()


_INVALID_EXAMPLE = OpenApiExample(
    "Bad rows",
    value={
        "code": "fleet_import_invalid",
        "message": "The fleet inventory has 2 error(s); nothing was imported.",
        "extra": {
            "errors": [
                {
                    "line": 3,
                    "code": "unknown_model",
                    "message": "Model 'X9' is not in the catalog.",
                    "field": "model",
                },
                {"line": 7, "code": "bad_card_count", "message": "Card count 'eight' ...", "field": "cards"},
            ],
            "error_count": 2,
            "truncated": False,
        },
    },
    response_only=True,
    status_codes=["400"],
)


class FleetImportApi(APIView):
    """Import a fleet inventory CSV into the caller's clusters and islands, all or nothing.

    Send the CSV as multipart form data (`file`, options as form fields or query parameters) or as a
    `text/csv` body (options as query parameters). Columns are found by header: model (`gpu_model`,
    `model`, `accelerator`), cards (`gpu_capacity_num`, `gpu`, `cards`, `gpus`), node (`node_name`, `sn`,
    `node`, `hostname`); optional `hub`, `site`, `cluster`, `island`, `fabric` override the options per
    row. Every bad row is reported by its line number (header = line 1) with a stable code and nothing is
    written. Re-importing the same file reports its clusters `unchanged`; a cluster that exists but
    differs is `cluster_differs`. Nodes with 0 cards are skipped with a warning.
    """

    permission_classes = [IsOperator]
    parser_classes = [parsers.MultiPartParser, CsvParser]

    @extend_schema(
        operation_id="fleet_imports_create",
        request={"multipart/form-data": FleetImportUpload, "text/csv": OpenApiTypes.STR},
        parameters=[
            OpenApiParameter("hub", str, enum=list(HUB_CODES), description="See the `hub` form field."),
            OpenApiParameter("site", str, description="See the `site` form field."),
            OpenApiParameter("cluster_prefix", str, description="See the `cluster_prefix` form field."),
            OpenApiParameter("nodes_per_island", int, description="See the `nodes_per_island` form field."),
            OpenApiParameter(
                "fabric", str, enum=list(Fabric.values), description="See the `fabric` form field."
            ),
            OpenApiParameter("allow_unknown_models", bool, description="See the form field."),
            OpenApiParameter("dry_run", bool, description="See the `dry_run` form field."),
        ],
        responses={
            201: OpenApiResponse(FleetImportOutput, description="Imported (clusters created or unchanged)."),
            200: OpenApiResponse(
                FleetImportOutput, description="Dry run: what would be imported; nothing written."
            ),
            400: OpenApiResponse(
                ErrorSerializer,
                description="`fleet_import_invalid` with `extra.errors` [{line, code, message, field}] "
                "(first 1000), `error_count`, `truncated`; or `invalid` options; or `parse_error`. "
                "Nothing was written.",
                examples=[_INVALID_EXAMPLE],
            ),
            409: OpenApiResponse(
                ErrorSerializer,
                description="`identifier_taken` or `fleet_import_conflict`: a concurrent write won; retry.",
            ),
        },
        tags=[TAG],
    )
    def post(self, request: Request) -> Response:
        actor = actor_from_request(request)
        # Options may come as query parameters or form fields (a form field wins); one value per name.
        values: dict[str, Any] = dict(request.query_params.items())
        if isinstance(request.data, Mapping):
            values.update(request.data.items())
        data = FleetImportUpload(data=values)
        data.is_valid(raise_exception=True)
        options = dict(data.validated_data)
        upload = options.pop("file")
        if upload.size > max_upload_bytes():
            raise InvalidInputError(
                _too_large(max_upload_bytes()),
                extra={"fields": {"file": [_("Too large.")]}},
            )
        result = fleet_import(
            actor=actor,
            operator=actor.organisation,
            content=upload.read(),
            source_name=(upload.name or "upload")[:100],
            **options,
        )
        return Response(
            FleetImportOutput(asdict(result)).data,
            status=status.HTTP_200_OK if result.dry_run else status.HTTP_201_CREATED,
        )


urlpatterns = [
    path("fleet-imports", FleetImportApi.as_view(), name="fleet-import"),
]
