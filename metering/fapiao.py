"""Fapiao data: what a fapiao (发票) issuing system needs for an invoice's payments, as CSV and JSON.

**This is data for an issuing system, not a connection to one.** Cardhour does not issue fapiao and talks
to no tax-authority platform (no 全电发票 / 数电票 API, no tax-control device). The platform's finance team
feeds these records to whatever issuing system it uses, which issues the fapiao and owns its numbering.

Which lines make a record. A fapiao is issued for money received, and the money is received when a pack
is paid (Stripe); usage drawn from packs is not charged again and arrears settled from a pack are paid by
that pack's money. So each *pack purchase* line is one **blue** record (蓝字发票) and each *refund* line one
**red** record (红字发票, a reversal) that names the blue record of the purchase it reverses — the
original invoice number and line, wherever that purchase was stated. Usage, arrears and settlement lines
make none.

Layout ``cardhour-fapiao/1`` (documented in the README, "Fapiao data"): one record per line above, with

``record_id`` (``<invoice number>/<line seq>``, stable), ``record_type`` (``blue`` / ``red``),
``invoice_number``, ``line_seq``, ``issued_at`` (ISO 8601 with offset), ``seller_*`` (legal name, tax id,
address, phone, bank, account — as frozen on the invoice), ``buyer_invoice_title`` (the buyer's 发票抬头, else
its legal name), ``buyer_unified_social_credit_code``, ``buyer_address``, ``buyer_fapiao_email``,
``product_kind``, ``tax_classification_code`` (``CARDHOUR_FAPIAO_TAX_CODES``; blank until set),
``item_name``, ``unit`` (``card-hour``), ``quantity`` (card-hours; negative on red), ``vat_rate``
(fraction), ``net_amount``, ``tax_amount``, ``gross_amount`` (CNY, two places; negative on red; net +
tax = gross), ``currency``, ``order_id``, ``payment_reference`` (the Stripe PaymentIntent),
``original_record_id`` / ``original_invoice_number`` / ``original_line_seq`` (red only: the blue record
reversed), ``reason`` (red only), ``note``.

The parties come from the invoice's frozen ``parties`` (metering.services.statements), so a record never
changes after issue even if the buyer edits its tax profile. Lines issued before invoices carried VAT
export blank rate, net and tax and say so in ``note``: the issuing system must apply the rate.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.utils import timezone

from metering.models import Invoice, InvoiceLine
from metering.rendering import csv_bytes

LAYOUT = "cardhour-fapiao/1"
NOTICE = (
    "Data for a fapiao issuing system. Cardhour does not issue fapiao and is not connected to any "
    "issuing system or tax-authority platform; the platform's finance team issues them from these records."
)
FIELDS = (
    "record_id",
    "record_type",
    "invoice_number",
    "line_seq",
    "issued_at",
    "seller_legal_name",
    "seller_tax_id",
    "seller_address",
    "seller_phone",
    "seller_bank",
    "seller_bank_account",
    "buyer_invoice_title",
    "buyer_unified_social_credit_code",
    "buyer_address",
    "buyer_fapiao_email",
    "product_kind",
    "tax_classification_code",
    "item_name",
    "unit",
    "quantity",
    "vat_rate",
    "net_amount",
    "tax_amount",
    "gross_amount",
    "currency",
    "order_id",
    "payment_reference",
    "original_record_id",
    "original_invoice_number",
    "original_line_seq",
    "reason",
    "note",
)


def _record_id(invoice_number: str, seq: int) -> str:
    return f"{invoice_number}/{seq}"


def _decimal(value: Decimal | None) -> str:
    return "" if value is None else str(value)


def _parties(invoice: Invoice) -> dict[str, str]:
    parties = invoice.parties or {}
    seller = parties.get("seller", {})
    buyer = parties.get("buyer", {})
    return {
        "seller_legal_name": seller.get("legal_name") or seller.get("name", ""),
        "seller_tax_id": seller.get("tax_id", ""),
        "seller_address": seller.get("address", ""),
        "seller_phone": seller.get("phone", ""),
        "seller_bank": seller.get("bank", ""),
        "seller_bank_account": seller.get("bank_account", ""),
        "buyer_invoice_title": buyer.get("invoice_title") or buyer.get("legal_name") or buyer.get("name", ""),
        "buyer_unified_social_credit_code": buyer.get("unified_social_credit_code", ""),
        "buyer_address": buyer.get("address", ""),
        "buyer_fapiao_email": buyer.get("fapiao_email") or buyer.get("billing_email", ""),
    }


def _originals(lines: Iterable[InvoiceLine]) -> dict[int, InvoiceLine]:
    """The pack-purchase line of each order a refund line reverses, on whichever invoice stated it."""
    order_ids = {line.order_id for line in lines if line.kind == InvoiceLine.Kind.REFUND and line.order_id}
    found = InvoiceLine.objects.filter(kind=InvoiceLine.Kind.PACK_PURCHASE, order_id__in=order_ids)
    return {line.order_id: line for line in found.select_related("invoice") if line.order_id}


def invoice_fapiao_records(*, invoice: Invoice) -> list[dict[str, str]]:
    """The fapiao records of a frozen invoice (see the module docstring), as strings, in line order."""
    lines = list(
        invoice.lines.filter(kind__in=[InvoiceLine.Kind.PACK_PURCHASE, InvoiceLine.Kind.REFUND])
        .select_related("order", "order__product", "order__accelerator")
        .order_by("seq")
    )
    originals = _originals(lines)
    parties = _parties(invoice)
    codes = getattr(settings, "CARDHOUR_FAPIAO_TAX_CODES", {}) or {}
    issued_at = timezone.localtime(invoice.issued_at).isoformat()
    records: list[dict[str, str]] = []
    for line in lines:
        order = line.order
        kind = line.product_kind or "pack_purchase"
        record = dict.fromkeys(FIELDS, "")
        record.update(parties)
        chip = order.accelerator.slug if order and order.accelerator else "standard cards"
        record.update(
            record_id=_record_id(invoice.number, line.seq),
            invoice_number=invoice.number,
            line_seq=str(line.seq),
            issued_at=issued_at,
            product_kind=kind,
            tax_classification_code=str(codes.get(kind, "") or ""),
            item_name=f"Prepaid compute: {order.product.name} ({chip})" if order else line.description,
            unit="card-hour",
            vat_rate=_decimal(line.vat_rate),
            net_amount=_decimal(line.net_amount),
            tax_amount=_decimal(line.tax_amount),
            gross_amount=str(line.amount),
            currency=invoice.currency,
            order_id=str(line.order_id or ""),
            payment_reference=order.stripe_payment_intent_id if order else "",
            note="" if line.vat_rate is not None else "Issued before invoices stated VAT: apply the rate.",
        )
        if line.kind == InvoiceLine.Kind.PACK_PURCHASE:
            record.update(record_type="blue", quantity=str(order.card_hours) if order else "")
        else:
            original = originals.get(line.order_id or 0)
            record.update(
                record_type="red",
                quantity=str(-line.card_hours_drawn),
                reason=f"Reversal: {line.description}",
            )
            if original is not None:
                record.update(
                    original_record_id=_record_id(original.invoice.number, original.seq),
                    original_invoice_number=original.invoice.number,
                    original_line_seq=str(original.seq),
                )
        records.append(record)
    return records


def fapiao_csv(*, invoices: Iterable[Invoice]) -> bytes:
    """The records of ``invoices`` as one CSV (UTF-8 with BOM, like every statement CSV): a header of
    :data:`FIELDS`, then one row per record."""
    rows: list[list[Any]] = [list(FIELDS)]
    for invoice in invoices:
        rows += [[record[field] for field in FIELDS] for record in invoice_fapiao_records(invoice=invoice)]
    return csv_bytes(rows)


def fapiao_document(*, invoice: Invoice) -> dict[str, Any]:
    """The records of one invoice as ``{"layout", "notice", "invoice_number", "records": [...]}``."""
    return {
        "layout": LAYOUT,
        "notice": NOTICE,
        "invoice_number": invoice.number,
        "records": invoice_fapiao_records(invoice=invoice),
    }


def fapiao_json(*, invoice: Invoice) -> bytes:
    """:func:`fapiao_document` as UTF-8 JSON (Chinese kept as characters, not escapes)."""
    return json.dumps(fapiao_document(invoice=invoice), ensure_ascii=False, indent=2).encode()
