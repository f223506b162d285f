"""Statements as their owners see them: a buyer's invoices, an operator's settlements, lines prefetched."""

from __future__ import annotations

from django.db.models import Prefetch, QuerySet
from django.utils.translation import gettext as _

from core.models import Organisation
from metering.errors import InvoiceNotFoundError, SettlementNotFoundError
from metering.models import Invoice, InvoiceLine, Settlement, SettlementLine


def invoice_list_for(*, buyer: Organisation) -> QuerySet[Invoice]:
    """The buyer's invoices, newest period first, each with its lines (and their clusters) prefetched."""
    return (
        Invoice.objects.filter(buyer=buyer)
        .select_related("buyer", "buyer__billing_profile")
        .prefetch_related(
            Prefetch("lines", queryset=InvoiceLine.objects.select_related("cluster").order_by("seq"))
        )
        .order_by("-period_start", "-id")
    )


def invoice_get_for(*, buyer: Organisation, invoice_id: int) -> Invoice:
    """One of the buyer's invoices. Raises InvoiceNotFoundError when it does not exist *or* belongs to
    another organisation (the two are indistinguishable to the caller)."""
    invoice = invoice_list_for(buyer=buyer).filter(pk=invoice_id).first()
    if invoice is None:
        raise InvoiceNotFoundError(
            _("Invoice %(id)s was not found.") % {"id": invoice_id}, extra={"invoice_id": invoice_id}
        )
    return invoice


def settlement_list_for(*, operator: Organisation) -> QuerySet[Settlement]:
    """The operator's settlements, newest period first, lines (and clusters) prefetched."""
    return (
        Settlement.objects.filter(operator=operator)
        .select_related("operator")
        .prefetch_related(
            Prefetch("lines", queryset=SettlementLine.objects.select_related("cluster").order_by("seq"))
        )
        .order_by("-period_start", "-id")
    )


def settlement_get_for(*, operator: Organisation, settlement_id: int) -> Settlement:
    """One of the operator's settlements; SettlementNotFoundError for a missing or another's one."""
    settlement = settlement_list_for(operator=operator).filter(pk=settlement_id).first()
    if settlement is None:
        raise SettlementNotFoundError(
            _("Settlement %(id)s was not found.") % {"id": settlement_id},
            extra={"settlement_id": settlement_id},
        )
    return settlement
