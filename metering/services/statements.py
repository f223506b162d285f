"""Issued statements never change: freeze what they show, render their PDF once, serve those bytes.

``invoice_freeze`` / ``settlement_freeze`` run at the end of issuing (metering.services.billing), in the
issuing transaction: they copy the parties as they are at that moment — the platform's seller entity from
settings (``CARDHOUR_SELLER``) and the buyer's organisation and billing profile, or the operator's
organisation — into the statement's ``parties``, render the PDF from the statement's own lines, totals and
those parties, store it as a StatementDocument with its SHA-256, and set ``frozen_at``. From then on the
statement, its lines and its document are read-only (PostgreSQL triggers, migration 0007), and every
download serves the stored bytes with the hash as ETag.

Statements issued before this existed have no document: the first download freezes them the same way
(with the parties as they are then, noted in the snapshot as ``frozen_late``) and every later download gets
those bytes. Rendering them at migration time would have meant running today's PDF code inside a migration,
which must not depend on code that changes.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core.models import Organisation
from metering import rendering
from metering.models import BillingProfile, Invoice, Settlement, StatementDocument

logger = logging.getLogger(__name__)

SELLER_FIELDS = ("legal_name", "tax_id", "address", "phone", "bank", "bank_account")


@dataclass(frozen=True)
class StoredDocument:
    """The bytes of a statement's PDF as stored at issue, with their SHA-256."""

    content: bytes
    sha256: str
    media_type: str
    filename: str


def seller_party() -> dict[str, str]:
    """The platform's seller entity from settings (legal name, tax id, address, phone, bank, account)."""
    configured = getattr(settings, "CARDHOUR_SELLER", {}) or {}
    party = {field: str(configured.get(field, "") or "") for field in SELLER_FIELDS}
    party["name"] = party["legal_name"] or rendering.PLATFORM_NAME
    return party


def _organisation_party(organisation: Organisation, *, with_billing_profile: bool) -> dict[str, str]:
    party = {"name": organisation.name, "slug": organisation.slug}
    if with_billing_profile:
        profile = BillingProfile.objects.filter(organisation=organisation).first()
        if profile is not None:
            party.update(
                legal_name=profile.legal_name,
                tax_id=profile.tax_id,
                address=profile.address,
                billing_email=profile.billing_email,
                unified_social_credit_code=profile.unified_social_credit_code,
                invoice_title=profile.invoice_title,
                fapiao_email=profile.fapiao_email,
            )
    return party


def _store(*, content: bytes, now: datetime, **statement: Any) -> StatementDocument:
    return StatementDocument.objects.create(
        content=content,
        sha256=hashlib.sha256(content).hexdigest(),
        size=len(content),
        rendered_at=now,
        **statement,
    )


@transaction.atomic
def invoice_freeze(*, invoice: Invoice, now: datetime | None = None, late: bool = False) -> StatementDocument:
    """Freeze the invoice's parties, render its PDF once and store it; return the stored document.

    Idempotent: an invoice already frozen returns its document unchanged. Locks the invoice row so two
    first downloads of a statement issued before documents existed cannot both render it."""
    now = now or timezone.now()
    locked = Invoice.objects.select_for_update().select_related("buyer").get(pk=invoice.pk)
    if locked.frozen_at is not None:
        return StatementDocument.objects.get(invoice=locked)
    parties: dict[str, Any] = {
        "seller": seller_party(),
        "buyer": _organisation_party(locked.buyer, with_billing_profile=True),
    }
    if late:
        parties["frozen_late"] = now.isoformat()
    content = rendering.invoice_pdf(invoice=locked, parties=parties)
    document = _store(content=content, now=now, invoice=locked)
    Invoice.objects.filter(pk=locked.pk).update(parties=parties, frozen_at=now)
    invoice.parties, invoice.frozen_at = parties, now
    logger.info("invoice %s frozen: %d bytes, sha256 %s", locked.number, document.size, document.sha256)
    return document


@transaction.atomic
def settlement_freeze(
    *, settlement: Settlement, now: datetime | None = None, late: bool = False
) -> StatementDocument:
    """As invoice_freeze, for an operator's settlement."""
    now = now or timezone.now()
    locked = Settlement.objects.select_for_update().select_related("operator").get(pk=settlement.pk)
    if locked.frozen_at is not None:
        return StatementDocument.objects.get(settlement=locked)
    parties: dict[str, Any] = {
        "seller": seller_party(),
        "operator": _organisation_party(locked.operator, with_billing_profile=False),
    }
    if late:
        parties["frozen_late"] = now.isoformat()
    content = rendering.settlement_pdf(settlement=locked, parties=parties)
    document = _store(content=content, now=now, settlement=locked)
    Settlement.objects.filter(pk=locked.pk).update(parties=parties, frozen_at=now)
    settlement.parties, settlement.frozen_at = parties, now
    logger.info("settlement %s frozen: %d bytes, sha256 %s", locked.number, document.size, document.sha256)
    return document


def invoice_frozen(*, invoice: Invoice) -> Invoice:
    """The invoice with its parties frozen (freezing it now, as a first download would, if it was issued
    before statements were frozen): what the fapiao export reads, so its records never change."""
    if invoice.frozen_at is None:
        invoice_freeze(invoice=invoice, late=True)
        invoice.refresh_from_db()
    return invoice


def _stored(document: StatementDocument, *, number: str) -> StoredDocument:
    return StoredDocument(
        content=bytes(document.content),
        sha256=document.sha256,
        media_type=document.media_type,
        filename=f"{number}.pdf",
    )


def invoice_document(*, invoice: Invoice) -> StoredDocument:
    """The invoice's PDF exactly as stored at issue (frozen now if it was issued before documents were
    stored)."""
    document = StatementDocument.objects.filter(invoice=invoice).first()
    if document is None:
        document = invoice_freeze(invoice=invoice, late=True)
    return _stored(document, number=invoice.number)


def settlement_document(*, settlement: Settlement) -> StoredDocument:
    """The settlement's PDF exactly as stored at issue (frozen now if issued before documents existed)."""
    document = StatementDocument.objects.filter(settlement=settlement).first()
    if document is None:
        document = settlement_freeze(settlement=settlement, late=True)
    return _stored(document, number=settlement.number)
