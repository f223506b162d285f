"""Issued statements never change: parties frozen at issue, the PDF rendered once and served byte for byte,
a CJK font embedded, and the database itself refusing edits of an issued statement (PostgreSQL)."""

from __future__ import annotations

import hashlib
import io
import re

import pytest
from django.db import DatabaseError, connection, transaction
from django.test import override_settings
from pypdf import PdfReader
from rest_framework.test import APIClient

from metering import rendering
from metering.models import (
    BillingProfile,
    Invoice,
    InvoiceLine,
    Settlement,
    SettlementLine,
    StatementDocument,
)
from metering.services import statements
from metering.services.billing import billing_close_period
from tests.metering.test_billing_close import CLOSE_MARCH_AT, MARCH, World

pytestmark = pytest.mark.django_db

SELLER = {
    "legal_name": "算时科技（示例）有限公司",
    "tax_id": "",
    "address": "上海市浦东新区示例路 1 号",
    "phone": "",
    "bank": "",
    "bank_account": "",
}


@pytest.fixture
def world(db: None) -> World:
    world = World()
    BillingProfile.objects.create(
        organisation=world.acme,
        legal_name="上海智算示例有限公司",
        tax_id="91310000MA1FL0000X",
        address="上海",
    )
    world.march_usage()
    with override_settings(CARDHOUR_SELLER=SELLER):
        billing_close_period(period_start=MARCH, now=CLOSE_MARCH_AT)
    return world


def text_of(pdf: bytes) -> str:
    return "\n".join(page.extract_text() for page in PdfReader(io.BytesIO(pdf)).pages)


def embedded_fonts(pdf: bytes) -> list[tuple[str, bool]]:
    """(base font, has an embedded TrueType program) of every font the pages' text is set in. (ReportLab
    lists Helvetica in every page's resources and selects it once, in an empty text block, before any
    drawing; a font that shows no glyph is skipped.)"""
    found = []
    for page in PdfReader(io.BytesIO(pdf)).pages:
        content = page.get_contents().get_data().decode("latin-1")
        showing = {
            m.group(1)
            for m in re.finditer(r"(/\S+) [\d.]+ Tf(.*?)(?=/\S+ [\d.]+ Tf|\Z)", content, re.DOTALL)
            if re.search(r"\bT[jJ]\b|'", m.group(2))
        }
        for name, font in page["/Resources"]["/Font"].items():
            if name not in showing:
                continue
            font = font.get_object()
            descendants = font.get("/DescendantFonts")
            descriptor = (descendants[0].get_object() if descendants else font).get("/FontDescriptor")
            found.append(
                (str(font["/BaseFont"]), descriptor is not None and "/FontFile2" in descriptor.get_object())
            )
    return found


def test_an_issued_invoice_freezes_its_parties_and_stores_its_pdf_once(world: World) -> None:
    invoice = Invoice.objects.get(buyer=world.acme, period_start=MARCH)
    document = StatementDocument.objects.get(invoice=invoice)

    assert invoice.frozen_at == invoice.issued_at
    assert invoice.parties["seller"]["legal_name"] == SELLER["legal_name"]
    assert invoice.parties["buyer"] == {
        "name": "Acme AI 智算",
        "slug": "acme",
        "legal_name": "上海智算示例有限公司",
        "tax_id": "91310000MA1FL0000X",
        "address": "上海",
        "billing_email": "",
        "unified_social_credit_code": "",
        "invoice_title": "",
        "fapiao_email": "",
    }
    content = bytes(document.content)
    assert document.sha256 == hashlib.sha256(content).hexdigest() and document.size == len(content)
    text = text_of(content)
    for expected in (
        "Acme AI 智算",
        "上海智算示例有限公司",
        "91310000MA1FL0000X",
        SELLER["legal_name"],
        invoice.number,
    ):
        assert expected in text
    assert "Asia/Shanghai" in text and "(UTC+08:00)" in text


def test_every_glyph_is_in_one_embedded_truetype_font(world: World) -> None:
    invoice = Invoice.objects.get(buyer=world.acme, period_start=MARCH)
    settlement = Settlement.objects.get(period_start=MARCH)
    for pdf in (
        statements.invoice_document(invoice=invoice).content,
        statements.settlement_document(settlement=settlement).content,
    ):
        fonts = embedded_fonts(pdf)
        assert fonts and all(embedded for _, embedded in fonts), fonts
        assert not any("STSong" in name or "Helvetica" in name for name, _ in fonts), fonts
    # The settlement's minus sign is a real glyph of the embedded font, not a missing-glyph box.
    assert "gross − platform commission" in text_of(
        statements.settlement_document(settlement=settlement).content
    )


def test_renaming_the_buyer_or_changing_its_tax_profile_does_not_change_an_issued_invoice(
    world: World, client: object
) -> None:
    invoice = Invoice.objects.get(buyer=world.acme, period_start=MARCH)
    before = statements.invoice_document(invoice=invoice)

    world.acme.name = "Renamed Corp"
    world.acme.save()
    BillingProfile.objects.filter(organisation=world.acme).update(legal_name="Other Ltd", tax_id="X")

    after = statements.invoice_document(invoice=invoice)
    assert after.content == before.content and after.sha256 == before.sha256
    assert "Renamed Corp" not in text_of(after.content) and "Acme AI 智算" in text_of(after.content)
    invoice.refresh_from_db()
    assert invoice.parties["buyer"]["name"] == "Acme AI 智算"


def test_downloads_serve_the_stored_bytes_with_their_hash(world: World, token_client) -> None:  # type: ignore[no-untyped-def]
    invoice = Invoice.objects.get(buyer=world.acme, period_start=MARCH)
    stored = StatementDocument.objects.get(invoice=invoice)
    client: APIClient = token_client(world.acme)

    response = client.get(f"/api/v1/invoices/{invoice.pk}.pdf")

    assert response.status_code == 200
    body = b"".join(response.streaming_content) if response.streaming else response.content
    assert body == bytes(stored.content)
    assert response["ETag"] == f'"{stored.sha256}"'


def test_a_statement_issued_before_documents_existed_is_frozen_on_first_download_then_kept(
    world: World,
) -> None:
    # As if issued by the code before frozen statements: no document, no parties, not frozen.
    settlement = Settlement.objects.get(period_start=MARCH)
    legacy = Settlement.objects.create(
        operator=settlement.operator,
        period_start=settlement.period_start.replace(month=2),
        period_end=settlement.period_start,
        number="STL-202602-legacy",
        issued_at=settlement.issued_at,
    )
    assert legacy.frozen_at is None

    first = statements.settlement_document(settlement=legacy)
    legacy.operator.name = "Changed later"
    legacy.operator.save()
    second = statements.settlement_document(settlement=legacy)

    assert first == second
    legacy.refresh_from_db()
    assert legacy.frozen_at is not None and "frozen_late" in legacy.parties
    assert StatementDocument.objects.filter(settlement=legacy).count() == 1


def test_the_pdf_renderer_refuses_a_font_it_cannot_embed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    not_a_font = tmp_path / "x.ttf"
    not_a_font.write_bytes(b"not a font")
    rendering._font.cache_clear()
    try:
        with (
            override_settings(CARDHOUR_PDF_FONT=str(not_a_font)),
            pytest.raises(Exception, match="cannot be embedded"),
        ):
            rendering._font()
    finally:
        rendering._font.cache_clear()


def sql(statement: str, *params: object) -> None:
    """Straight to the database, past the ORM's own PROTECT checks: the triggers must refuse it."""
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


@pytest.mark.postgres
def test_the_database_refuses_to_change_an_issued_statement(world: World) -> None:
    invoice = Invoice.objects.get(buyer=world.acme, period_start=MARCH)
    settlement = Settlement.objects.get(period_start=MARCH)
    attempts = [
        lambda: Invoice.objects.filter(pk=invoice.pk).update(amount_due=0),
        lambda: sql("DELETE FROM metering_invoice WHERE id = %s", invoice.pk),
        lambda: InvoiceLine.objects.filter(invoice=invoice).update(amount=0),
        lambda: sql("DELETE FROM metering_invoiceline WHERE invoice_id = %s", invoice.pk),
        lambda: Settlement.objects.filter(pk=settlement.pk).update(parties={}),
        lambda: SettlementLine.objects.filter(settlement=settlement).update(card_seconds=1),
        lambda: StatementDocument.objects.filter(invoice=invoice).update(content=b"forged"),
        lambda: sql("DELETE FROM metering_statementdocument WHERE invoice_id = %s", invoice.pk),
    ]
    for attempt in attempts:
        with pytest.raises(DatabaseError, match="issued statement"), transaction.atomic():
            attempt()
    assert bytes(StatementDocument.objects.get(invoice=invoice).content).startswith(b"%PDF-")
