"""Tax-ready invoices: the unified social credit code check (GB 32100-2015), VAT per line rounded once,
the buyer's tax profile frozen at issue, and the fapiao data export (blue records, red-letter reversals).

The month is test_billing_close's: ``acme`` buys an A800 pack (100 card-hours, 1,000.00 CNY) on 2 March
and uses it; ``beta`` has arrears.
"""

from __future__ import annotations

import csv
import io
import json
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.db import DatabaseError, transaction
from django.test import override_settings
from django.urls import reverse

from metering import fapiao, tax
from metering.models import BillingProfile, Invoice, InvoiceLine, PackRefund
from metering.services import statements
from metering.services.billing import billing_close_period
from tests.metering.test_billing_close import APRIL, CLOSE_MARCH_AT, MARCH, World, sh
from tests.metering.test_statements_frozen import text_of

pytestmark = pytest.mark.django_db

SELLER = {
    "legal_name": "算时科技（示例）有限公司",
    "tax_id": "91350100M000100Y43",
    "address": "上海市浦东新区示例路 1 号",
    "phone": "021-0000 0000",
    "bank": "示例银行上海分行",
    "bank_account": "6222 0000 0000 0000",
}

# Real codes, as published on the companies' business licences and the national enterprise credit
# information system: Huawei Technologies Co., Ltd.; Shenzhen Tencent Computer Systems Co., Ltd.;
# Alibaba (China) Co., Ltd.; and the worked example of GB 32100-2015 itself.
VALID_USCC = ["914403001922038216", "91440300708461136T", "91330100716105852F", "91350100M000100Y43"]


# --- The unified social credit code -----------------------------------------------------------------


@pytest.mark.parametrize("code", VALID_USCC)
def test_real_unified_social_credit_codes_pass(code: str) -> None:
    assert tax.uscc_problem(code) is None
    assert tax.uscc_check_character(code[:17]) == code[17]


@pytest.mark.parametrize(
    ("code", "problem"),
    [
        # Huawei's with the last character changed: the check character gives 6.
        ("914403001922038217", "The check character is wrong (the first 17 characters give 6)."),
        # Tencent's with two characters of the organisation code swapped: its own check fails first.
        ("91440300780461136T", "Characters 9–17 (the organisation code) fail their own check character."),
        ("91440300708461136", "A unified social credit code has 18 characters; this one has 17."),
        (
            "9144030070846113OT",
            "A unified social credit code uses only 0–9 and the letters A–Y except I, O, S, V and Z; found O.",
        ),
        ("91A40300708461136T", "Characters 3–8 (the administrative division code) must be digits."),
        (
            "91440300708461136t",
            "A unified social credit code uses only 0–9 and the letters A–Y except I, O, S, V and Z; found t.",
        ),
    ],
)
def test_wrong_codes_are_refused_with_the_reason(code: str, problem: str) -> None:
    assert tax.uscc_problem(code) == problem


def test_the_billing_profile_validates_its_code(world: World) -> None:
    profile = BillingProfile.objects.get(organisation=world.acme)
    profile.unified_social_credit_code = "914403001922038217"
    with pytest.raises(ValidationError) as caught:
        profile.full_clean()
    assert caught.value.error_dict["unified_social_credit_code"][0].code == "uscc_invalid"
    profile.unified_social_credit_code = tax.uscc_normalise(" 9144 0300 7084 6113 6t ")
    assert profile.unified_social_credit_code == "91440300708461136T"
    profile.full_clean()


# --- VAT on lines -----------------------------------------------------------------------------------


def test_the_vat_split_rounds_the_net_once_half_to_even_and_the_tax_is_the_rest() -> None:
    six = Decimal("0.06")
    assert tax.vat_split(gross=Decimal("1000.00"), rate=six) == (Decimal("943.40"), Decimal("56.60"))
    assert tax.vat_split(gross=Decimal("100.00"), rate=six) == (Decimal("94.34"), Decimal("5.66"))
    assert tax.vat_split(gross=Decimal("-23.45"), rate=six) == (Decimal("-22.12"), Decimal("-1.33"))
    # Ties, at a rate that makes them: 0.05 / 2 = 0.025 → 0.02 and 0.15 / 2 = 0.075 → 0.08 (to even).
    assert tax.vat_split(gross=Decimal("0.05"), rate=Decimal("1")) == (Decimal("0.02"), Decimal("0.03"))
    assert tax.vat_split(gross=Decimal("0.15"), rate=Decimal("1")) == (Decimal("0.08"), Decimal("0.07"))
    assert tax.vat_rate(kind="pack_purchase") == tax.vat_rate(kind="compute_service") == six


def _close_march_with_a_refund(world: World) -> Invoice:
    world.march_usage()
    PackRefund.objects.create(
        order=world.pack.order,
        pack=world.pack,
        stripe_refund_id="re_1",
        amount=Decimal("23.45"),
        card_hours_debited=0,
        refunded_at=sh(2026, 3, 30),
    )
    with override_settings(CARDHOUR_SELLER=SELLER):
        billing_close_period(period_start=MARCH, now=CLOSE_MARCH_AT)
    return Invoice.objects.get(buyer=world.acme, period_start=MARCH)


@pytest.fixture
def world(db: None) -> World:
    world = World()
    BillingProfile.objects.create(
        organisation=world.acme,
        legal_name="上海智算示例有限公司",
        address="上海市徐汇区示例路 2 号",
        billing_email="ap@acme.example",
        unified_social_credit_code="91440300708461136T",
        invoice_title="上海智算示例有限公司",
        fapiao_email="fapiao@acme.example",
    )
    return world


def test_every_line_carries_its_rate_and_split_and_the_totals_are_sums(world: World) -> None:
    invoice = _close_march_with_a_refund(world)
    lines = list(invoice.lines.order_by("seq"))
    assert [(line.kind, line.product_kind, line.vat_rate) for line in lines] == [
        ("pack_purchase", "pack_purchase", Decimal("0.0600")),
        ("usage", "compute_service", Decimal("0.0600")),
        ("usage", "compute_service", Decimal("0.0600")),
        ("usage", "compute_service", Decimal("0.0600")),
        ("refund", "pack_purchase", Decimal("0.0600")),
    ]
    assert (lines[0].amount, lines[0].net_amount, lines[0].tax_amount) == (
        Decimal("1000.00"),
        Decimal("943.40"),
        Decimal("56.60"),
    )
    assert (lines[-1].amount, lines[-1].net_amount, lines[-1].tax_amount) == (
        Decimal("-23.45"),
        Decimal("-22.12"),
        Decimal("-1.33"),
    )
    for line in lines:
        assert line.net_amount + line.tax_amount == line.amount
        assert line.net_amount == tax.vat_split(gross=line.amount, rate=Decimal("0.06"))[0]
    # What was paid (packs less refunds), split: sums of those lines, never re-rounded.
    assert (invoice.total_paid, invoice.net_amount, invoice.tax_amount) == (
        Decimal("976.55"),
        Decimal("921.28"),
        Decimal("55.27"),
    )


@override_settings(CARDHOUR_VAT_RATES={"pack_purchase": "0.13", "compute_service": "0.06"})
def test_the_rate_is_a_setting_per_product_kind(world: World) -> None:
    invoice = _close_march_with_a_refund(world)
    purchase = invoice.lines.get(kind="pack_purchase")
    assert (purchase.vat_rate, purchase.net_amount, purchase.tax_amount) == (
        Decimal("0.1300"),
        Decimal("884.96"),
        Decimal("115.04"),
    )
    assert set(invoice.lines.filter(kind="usage").values_list("vat_rate", flat=True)) == {Decimal("0.0600")}


# --- Frozen tax data --------------------------------------------------------------------------------


def test_the_tax_profile_is_frozen_and_the_pdf_does_not_change_when_it_does(world: World) -> None:
    invoice = _close_march_with_a_refund(world)
    before = statements.invoice_document(invoice=invoice)
    records_before = fapiao.invoice_fapiao_records(invoice=invoice)
    text = text_of(before.content)
    # Labels in English and Chinese (metering.rendering): a frozen statement serves every reader.
    assert (
        "USCC 统一社会信用代码: 91440300708461136T" in text
        and "Invoice title 发票抬头: 上海智算示例有限公司" in text
    )
    assert "943.40" in text and "56.60" in text and "6%" in text

    BillingProfile.objects.filter(organisation=world.acme).update(
        unified_social_credit_code="914403001922038216",
        invoice_title="Another title",
        fapiao_email="other@acme.example",
    )
    invoice.refresh_from_db()
    after = statements.invoice_document(invoice=invoice)
    assert (after.content, after.sha256) == (before.content, before.sha256)
    assert fapiao.invoice_fapiao_records(invoice=invoice) == records_before
    assert invoice.parties["buyer"]["unified_social_credit_code"] == "91440300708461136T"


@pytest.mark.postgres
def test_the_database_refuses_to_change_the_tax_columns_of_an_issued_line(world: World) -> None:
    invoice = _close_march_with_a_refund(world)
    line = invoice.lines.get(kind="pack_purchase")
    for change in ({"tax_amount": Decimal("0.00")}, {"net_amount": Decimal("1000.00")}, {"vat_rate": 0}):
        with pytest.raises(DatabaseError, match="issued statement"), transaction.atomic():
            InvoiceLine.objects.filter(pk=line.pk).update(**change)
    with pytest.raises(DatabaseError, match="issued statement"), transaction.atomic():
        Invoice.objects.filter(pk=invoice.pk).update(tax_amount=0)
    line.refresh_from_db()
    assert (line.vat_rate, line.net_amount, line.tax_amount) == (
        Decimal("0.0600"),
        Decimal("943.40"),
        Decimal("56.60"),
    )


def test_an_invoice_issued_before_vat_still_renders_and_exports(world: World) -> None:
    invoice = _close_march_with_a_refund(world)
    legacy = Invoice.objects.create(
        buyer=world.acme,
        period_start=MARCH.replace(month=2),
        period_end=MARCH,
        number="INV-202602-legacy",
        packs_amount=Decimal("10.00"),
        total_paid=Decimal("10.00"),
        issued_at=invoice.issued_at,
    )
    InvoiceLine.objects.create(
        invoice=legacy, seq=1, kind="pack_purchase", description="Pack", amount=Decimal("10.00")
    )
    document = statements.invoice_document(invoice=legacy)
    assert "Card-seconds" in text_of(document.content) and "VAT" not in text_of(document.content)
    legacy.refresh_from_db()
    [record] = fapiao.invoice_fapiao_records(invoice=legacy)
    assert (record["vat_rate"], record["net_amount"], record["gross_amount"]) == ("", "", "10.00")
    assert record["note"] == "Issued before invoices stated VAT: apply the rate."


# --- Fapiao data ------------------------------------------------------------------------------------


def test_the_fapiao_export_has_a_blue_record_per_pack_and_a_red_reversal_per_refund(world: World) -> None:
    march = _close_march_with_a_refund(world)
    # A second refund, recorded in April, is reversed on April's invoice against March's blue record.
    PackRefund.objects.create(
        order=world.pack.order,
        pack=world.pack,
        stripe_refund_id="re_2",
        amount=Decimal("100.00"),
        card_hours_debited=10_000_000,
        refunded_at=sh(2026, 4, 10),
    )
    with override_settings(
        CARDHOUR_SELLER=SELLER, CARDHOUR_FAPIAO_TAX_CODES={"pack_purchase": "3040201990000000000"}
    ):
        billing_close_period(period_start=APRIL, now=sh(2026, 5, 1, 0, 30))
        april = Invoice.objects.get(buyer=world.acme, period_start=APRIL)
        blue, red_march = fapiao.invoice_fapiao_records(invoice=march)
        [red_april] = fapiao.invoice_fapiao_records(invoice=april)

    order = world.pack.order
    parties = {
        "seller_legal_name": "算时科技（示例）有限公司",
        "seller_tax_id": "91350100M000100Y43",
        "seller_address": "上海市浦东新区示例路 1 号",
        "seller_phone": "021-0000 0000",
        "seller_bank": "示例银行上海分行",
        "seller_bank_account": "6222 0000 0000 0000",
        "buyer_invoice_title": "上海智算示例有限公司",
        "buyer_unified_social_credit_code": "91440300708461136T",
        "buyer_address": "上海市徐汇区示例路 2 号",
        "buyer_fapiao_email": "fapiao@acme.example",
    }
    assert blue == {
        "record_id": "INV-202603-acme/1",
        "record_type": "blue",
        "invoice_number": "INV-202603-acme",
        "line_seq": "1",
        "issued_at": "2026-04-01T00:30:00+08:00",
        **parties,
        "product_kind": "pack_purchase",
        "tax_classification_code": "3040201990000000000",
        "item_name": f"Prepaid compute: {order.product.name} (nvidia-a800-sxm4-80gb)",
        "unit": "card-hour",
        "quantity": "100",
        "vat_rate": "0.0600",
        "net_amount": "943.40",
        "tax_amount": "56.60",
        "gross_amount": "1000.00",
        "currency": "CNY",
        "order_id": str(order.pk),
        "payment_reference": order.stripe_payment_intent_id,
        "original_record_id": "",
        "original_invoice_number": "",
        "original_line_seq": "",
        "reason": "",
        "note": "",
    }
    assert (red_march["record_type"], red_march["record_id"], red_march["original_record_id"]) == (
        "red",
        "INV-202603-acme/5",
        "INV-202603-acme/1",
    )
    assert (red_march["gross_amount"], red_march["net_amount"], red_march["tax_amount"]) == (
        "-23.45",
        "-22.12",
        "-1.33",
    )
    assert red_march["reason"] == f"Reversal: Refund re_1, order {order.pk}"
    assert red_april == {
        **red_april,
        "record_type": "red",
        "record_id": "INV-202604-acme/1",
        "invoice_number": "INV-202604-acme",
        "original_record_id": "INV-202603-acme/1",
        "original_invoice_number": "INV-202603-acme",
        "original_line_seq": "1",
        "quantity": "-10.000000",
        "gross_amount": "-100.00",
        "net_amount": "-94.34",
        "tax_amount": "-5.66",
    }

    rows = list(csv.reader(io.StringIO(fapiao.fapiao_csv(invoices=[march]).decode("utf-8-sig"))))
    assert rows[0] == list(fapiao.FIELDS)
    assert [row[1] for row in rows[1:]] == ["blue", "red"]
    assert rows[1][fapiao.FIELDS.index("buyer_unified_social_credit_code")] == "91440300708461136T"


def test_the_buyer_downloads_the_fapiao_data_from_the_invoice_page_and_the_api(
    world: World,
    client,
    token_client,  # type: ignore[no-untyped-def]
) -> None:
    from tests.factories import MembershipFactory, UserFactory

    invoice = _close_march_with_a_refund(world)
    user = UserFactory(username="alice")
    MembershipFactory(user=user, organisation=world.acme, role="owner")
    client.force_login(user)

    page = client.get(reverse("invoice-detail", args=[invoice.pk])).content.decode()
    assert "data for a fapiao issuing system" in page and "not connected to any issuing system" in page
    assert reverse("invoice-fapiao-csv", args=[invoice.pk]) in page
    response = client.get(reverse("invoice-fapiao-json", args=[invoice.pk]))
    assert response.status_code == 200 and response["Content-Type"].startswith("application/json")
    document = json.loads(response.content)
    assert (document["layout"], document["invoice_number"], len(document["records"])) == (
        "cardhour-fapiao/1",
        "INV-202603-acme",
        2,
    )
    assert document["notice"].startswith("Data for a fapiao issuing system.")
    csv_response = client.get(reverse("invoice-fapiao-csv", args=[invoice.pk]))
    assert csv_response["Content-Disposition"] == 'attachment; filename="INV-202603-acme-fapiao.csv"'

    api = token_client(world.acme)
    body = api.get(f"/api/v1/invoices/{invoice.pk}/fapiao").json()
    assert body == document
    api_csv = api.get(f"/api/v1/invoices/{invoice.pk}/fapiao.csv")
    assert api_csv.status_code == 200 and api_csv.content == csv_response.content
    # Another buyer's invoice answers 404 like a missing one.
    other = token_client(world.beta)
    assert other.get(f"/api/v1/invoices/{invoice.pk}/fapiao").status_code == 404
