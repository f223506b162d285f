"""Statements over REST: a buyer's invoices and an operator's settlements, as JSON, CSV and PDF.

Scoping: every statement is looked up inside the caller's organisation (metering.selectors.billing), so
another organisation's statement answers 404 exactly like a missing one. Invoices need a buyer
organisation (403 ``not_a_buyer`` otherwise), settlements an operator (403 ``not_an_operator``).

Downloads are separate operations on their own paths (``/invoices/<id>.csv``, ``.pdf``): each has one
representation, so the views ignore the Accept header (a client asking a CSV URL for JSON still gets the
file) and errors on them are JSON like everywhere else in the API.
"""

from __future__ import annotations

from typing import Any

import django_filters
from django.db.models import QuerySet
from django.urls import path
from django.utils.translation import gettext as _
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import generics, serializers
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.context import actor_from_request
from core.api.permissions import IsOperator, IsOrganisationMember
from metering import fapiao, rendering
from metering.errors import NotABuyerError
from metering.models import Invoice, InvoiceLine, Settlement, SettlementLine
from metering.selectors import billing as selectors
from metering.services import statements

TAG = "billing"


class IsBuyer(IsOrganisationMember):
    def has_permission(self, request: Request, view: Any) -> bool:
        if not super().has_permission(request, view):
            return False
        if not actor_from_request(request).organisation.is_buyer:
            raise NotABuyerError(_("Only buyer organisations have invoices."))
        return True


# --- Downloads --------------------------------------------------------------------------------------


class _FileRenderer(BaseRenderer):
    """Passes the bytes a download view produced through unchanged."""

    charset: str | None = None

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> Any:
        return data


class CsvRenderer(_FileRenderer):
    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"


class PdfRenderer(_FileRenderer):
    media_type = "application/pdf"
    format = "pdf"


class _OneRepresentation(BaseContentNegotiation):
    """A download has one representation: pick the view's renderer whatever the Accept header says."""

    def select_parser(self, request: Request, parsers: Any) -> Any:
        return parsers[0] if parsers else None

    def select_renderer(self, request: Request, renderers: Any, format_suffix: Any = None) -> Any:
        return renderers[0], renderers[0].media_type


class _DownloadApi(APIView):
    """Base of the CSV / PDF views: the file on success, the usual JSON error body otherwise."""

    content_negotiation_class = _OneRepresentation
    extension = ""

    def file_response(self, content: bytes, *, filename: str) -> Response:
        response = Response(content)
        response["Content-Disposition"] = f'attachment; filename="{filename}.{self.extension}"'
        return response

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        response = super().finalize_response(request, response, *args, **kwargs)
        if isinstance(response, Response) and response.status_code >= 400:
            response.accepted_renderer = JSONRenderer()
            response.accepted_media_type = JSONRenderer.media_type
            response.renderer_context = self.get_renderer_context()  # type: ignore[attr-defined]
        return response


def _download_schema(operation_id: str, media_type: str, description: str) -> Any:
    return extend_schema(
        operation_id=operation_id,
        responses={
            (200, media_type): OpenApiResponse(
                response=OpenApiTypes.BINARY,
                description=description,
            )
        },
        tags=[TAG],
    )


# --- Invoices ---------------------------------------------------------------------------------------


class InvoiceLineOutput(serializers.ModelSerializer):
    cluster = serializers.CharField(source="cluster.cpi", allow_null=True, default=None)

    class Meta:
        model = InvoiceLine
        fields = [
            "seq",
            "kind",
            "description",
            "cluster",
            "band",
            "order",
            "pack",
            "card_seconds",
            "card_hours_drawn",
            "amount",
            "product_kind",
            "vat_rate",
            "net_amount",
            "tax_amount",
        ]


class InvoiceOutput(serializers.ModelSerializer):
    buyer = serializers.CharField(source="buyer.slug")

    class Meta:
        model = Invoice
        fields = [
            "id",
            "number",
            "buyer",
            "period_start",
            "period_end",
            "currency",
            "packs_amount",
            "refunds_amount",
            "total_paid",
            "usage_value",
            "arrears_amount",
            "arrears_brought_forward",
            "arrears_settled",
            "amount_due",
            "net_amount",
            "tax_amount",
            "issued_at",
        ]


class StatementFilter(django_filters.FilterSet):
    period_start = django_filters.DateFilter(help_text="First day of the month of the statement.")
    period_from = django_filters.DateFilter(field_name="period_start", lookup_expr="gte")
    period_to = django_filters.DateFilter(field_name="period_start", lookup_expr="lte")


class InvoiceFilter(StatementFilter):
    class Meta:
        model = Invoice
        fields = ["period_start"]


class InvoiceListApi(generics.ListAPIView):
    """The caller's invoices (buyers only), newest period first."""

    permission_classes = [IsBuyer]
    serializer_class = InvoiceOutput
    filterset_class = InvoiceFilter
    queryset = Invoice.objects.none()  # for the schema; requests use get_queryset

    def get_queryset(self) -> QuerySet[Invoice]:
        return selectors.invoice_list_for(buyer=actor_from_request(self.request).organisation)

    @extend_schema(operation_id="invoices_list", tags=[TAG])
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)


class InvoiceDetailApi(APIView):
    """One of the caller's invoices with its lines; another organisation's invoice answers 404."""

    permission_classes = [IsBuyer]

    class Output(InvoiceOutput):
        lines = InvoiceLineOutput(many=True)

        class Meta(InvoiceOutput.Meta):
            fields = [*InvoiceOutput.Meta.fields, "lines"]

    @extend_schema(operation_id="invoices_get", responses={200: Output}, tags=[TAG])
    def get(self, request: Request, invoice_id: int) -> Response:
        invoice = selectors.invoice_get_for(
            buyer=actor_from_request(request).organisation, invoice_id=invoice_id
        )
        return Response(self.Output(invoice).data)


class InvoiceCsvApi(_DownloadApi):
    """Download one of the caller's invoices as CSV (attachment named after the invoice number)."""

    permission_classes = [IsBuyer]
    renderer_classes = [CsvRenderer]
    extension = "csv"

    @_download_schema(
        "invoices_csv", "text/csv", "The invoice as CSV (UTF-8 with BOM): header, lines, totals."
    )
    def get(self, request: Request, invoice_id: int) -> Response:
        invoice = selectors.invoice_get_for(
            buyer=actor_from_request(request).organisation, invoice_id=invoice_id
        )
        return self.file_response(rendering.invoice_csv(invoice=invoice), filename=invoice.number)


class InvoicePdfApi(_DownloadApi):
    """Download one of the caller's invoices as a PDF (attachment named after the invoice number)."""

    permission_classes = [IsBuyer]
    renderer_classes = [PdfRenderer]
    extension = "pdf"

    @_download_schema("invoices_pdf", "application/pdf", "The invoice as a PDF.")
    def get(self, request: Request, invoice_id: int) -> Response:
        invoice = selectors.invoice_get_for(
            buyer=actor_from_request(request).organisation, invoice_id=invoice_id
        )
        document = statements.invoice_document(invoice=invoice)
        response = self.file_response(document.content, filename=invoice.number)
        response["ETag"] = f'"{document.sha256}"'
        return response


class InvoiceFapiaoApi(APIView):
    """The fapiao data of one of the caller's invoices (layout ``cardhour-fapiao/1``): a blue record per
    pack bought, a red-letter reversal per refund naming the record it reverses. Data for a fapiao issuing
    system — Cardhour issues no fapiao and is connected to no issuing system."""

    permission_classes = [IsBuyer]

    class Output(serializers.Serializer):
        layout = serializers.CharField()
        notice = serializers.CharField()
        invoice_number = serializers.CharField()
        records = serializers.ListField(
            child=serializers.DictField(child=serializers.CharField(allow_blank=True)),
            help_text="One object per record; the fields of metering.fapiao.FIELDS, all strings.",
        )

    @extend_schema(operation_id="invoices_fapiao", responses={200: Output}, tags=[TAG])
    def get(self, request: Request, invoice_id: int) -> Response:
        invoice = selectors.invoice_get_for(
            buyer=actor_from_request(request).organisation, invoice_id=invoice_id
        )
        invoice = statements.invoice_frozen(invoice=invoice)
        return Response(fapiao.fapiao_document(invoice=invoice))


class InvoiceFapiaoCsvApi(_DownloadApi):
    """The fapiao data of one of the caller's invoices as CSV (one row per record, UTF-8 with BOM)."""

    permission_classes = [IsBuyer]
    renderer_classes = [CsvRenderer]
    extension = "csv"

    @_download_schema(
        "invoices_fapiao_csv", "text/csv", "Fapiao records (layout cardhour-fapiao/1) as CSV, UTF-8 with BOM."
    )
    def get(self, request: Request, invoice_id: int) -> Response:
        invoice = selectors.invoice_get_for(
            buyer=actor_from_request(request).organisation, invoice_id=invoice_id
        )
        invoice = statements.invoice_frozen(invoice=invoice)
        return self.file_response(fapiao.fapiao_csv(invoices=[invoice]), filename=f"{invoice.number}-fapiao")


# --- Settlements ------------------------------------------------------------------------------------


class SettlementLineOutput(serializers.ModelSerializer):
    cluster = serializers.CharField(source="cluster.cpi")
    sla_credit_id = serializers.IntegerField(
        allow_null=True, help_text="The SLA credit note of an sla_credit / sla_credit_reversal line."
    )

    class Meta:
        model = SettlementLine
        fields = [
            "seq",
            "kind",
            "cluster",
            "band",
            "sla_credit_id",
            "prior_period",
            "card_seconds",
            "gross",
            "commission",
            "payable",
        ]


class SettlementOutput(serializers.ModelSerializer):
    operator = serializers.CharField(source="operator.slug")

    class Meta:
        model = Settlement
        fields = [
            "id",
            "number",
            "operator",
            "period_start",
            "period_end",
            "currency",
            "gross",
            "commission",
            "payable",
            "issued_at",
        ]


class SettlementFilter(StatementFilter):
    class Meta:
        model = Settlement
        fields = ["period_start"]


class SettlementListApi(generics.ListAPIView):
    """The caller's settlements (operators only), newest period first."""

    permission_classes = [IsOperator]
    serializer_class = SettlementOutput
    filterset_class = SettlementFilter
    queryset = Settlement.objects.none()

    def get_queryset(self) -> QuerySet[Settlement]:
        return selectors.settlement_list_for(operator=actor_from_request(self.request).organisation)

    @extend_schema(operation_id="settlements_list", tags=[TAG])
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)


class SettlementDetailApi(APIView):
    """One of the caller's settlements with its lines; another organisation's answers 404."""

    permission_classes = [IsOperator]

    class Output(SettlementOutput):
        lines = SettlementLineOutput(many=True)

        class Meta(SettlementOutput.Meta):
            fields = [*SettlementOutput.Meta.fields, "lines"]

    @extend_schema(operation_id="settlements_get", responses={200: Output}, tags=[TAG])
    def get(self, request: Request, settlement_id: int) -> Response:
        settlement = selectors.settlement_get_for(
            operator=actor_from_request(request).organisation, settlement_id=settlement_id
        )
        return Response(self.Output(settlement).data)


class SettlementCsvApi(_DownloadApi):
    """Download one of the caller's settlements as CSV (attachment named after its number)."""

    permission_classes = [IsOperator]
    renderer_classes = [CsvRenderer]
    extension = "csv"

    @_download_schema("settlements_csv", "text/csv", "The settlement as CSV (UTF-8 with BOM).")
    def get(self, request: Request, settlement_id: int) -> Response:
        settlement = selectors.settlement_get_for(
            operator=actor_from_request(request).organisation, settlement_id=settlement_id
        )
        return self.file_response(rendering.settlement_csv(settlement=settlement), filename=settlement.number)


class SettlementPdfApi(_DownloadApi):
    """Download one of the caller's settlements as a PDF (attachment named after its number)."""

    permission_classes = [IsOperator]
    renderer_classes = [PdfRenderer]
    extension = "pdf"

    @_download_schema("settlements_pdf", "application/pdf", "The settlement as a PDF.")
    def get(self, request: Request, settlement_id: int) -> Response:
        settlement = selectors.settlement_get_for(
            operator=actor_from_request(request).organisation, settlement_id=settlement_id
        )
        document = statements.settlement_document(settlement=settlement)
        response = self.file_response(document.content, filename=settlement.number)
        response["ETag"] = f'"{document.sha256}"'
        return response


urlpatterns = [
    path("invoices", InvoiceListApi.as_view(), name="invoice-list"),
    path("invoices/<int:invoice_id>", InvoiceDetailApi.as_view(), name="invoice-detail"),
    path("invoices/<int:invoice_id>.csv", InvoiceCsvApi.as_view(), name="invoice-csv"),
    path("invoices/<int:invoice_id>.pdf", InvoicePdfApi.as_view(), name="invoice-pdf"),
    path("invoices/<int:invoice_id>/fapiao", InvoiceFapiaoApi.as_view(), name="invoice-fapiao"),
    path("invoices/<int:invoice_id>/fapiao.csv", InvoiceFapiaoCsvApi.as_view(), name="invoice-fapiao-csv"),
    path("settlements", SettlementListApi.as_view(), name="settlement-list"),
    path("settlements/<int:settlement_id>", SettlementDetailApi.as_view(), name="settlement-detail"),
    path("settlements/<int:settlement_id>.csv", SettlementCsvApi.as_view(), name="settlement-csv"),
    path("settlements/<int:settlement_id>.pdf", SettlementPdfApi.as_view(), name="settlement-pdf"),
]
