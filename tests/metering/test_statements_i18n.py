"""Statement PDFs carry their labels in English and Simplified Chinese, whatever language issues them."""

from __future__ import annotations

import re

import pytest
from django.utils import translation

from metering import rendering
from metering.models import Invoice, Settlement
from tests.metering.test_billing_close import MARCH, World
from tests.metering.test_statements_frozen import text_of, world  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db


def _texts(world: World) -> dict[str, tuple[str, str]]:  # noqa: F811
    invoice = Invoice.objects.get(buyer=world.acme, period_start=MARCH)
    settlement = Settlement.objects.get(period_start=MARCH)
    out: dict[str, tuple[str, str]] = {}
    for language in ("en", "zh-hans"):
        with translation.override(language):
            out[language] = (
                text_of(rendering.invoice_pdf(invoice=invoice, parties=invoice.parties)),
                text_of(rendering.settlement_pdf(settlement=settlement, parties=settlement.parties)),
            )
    return out


def test_statement_labels_are_in_both_languages_and_do_not_follow_the_active_one(world: World) -> None:  # noqa: F811
    texts = _texts(world)
    assert texts["en"] == texts["zh-hans"]
    # Narrow columns wrap a label onto two lines: compare with whitespace folded.
    invoice, settlement = (re.sub(r"\s+", " ", text) for text in texts["en"])
    for label in (
        "Invoice 月度账单",
        "Billed to 付款方:",
        "Period 账期:",
        "Issued 开具时间:",
        "Amount due 应付金额",
    ):
        assert label in invoice, label
    assert "Description 说明" in invoice
    assert (
        "Packs are paid through Stripe when bought" in invoice and "卡时包在购买时通过 Stripe 支付" in invoice
    )
    for label in (
        "Settlement 结算单",
        "Payable to 收款方:",
        "Band 时段",
        "Commission 平台佣金",
        "Total 合计",
    ):
        assert label in settlement, label
    assert "gross − platform commission" in settlement and "应付 = 总收入 − 平台佣金" in settlement
    # Band names in the lines, never the stored value.
    assert "critical_peak" not in settlement and "deep_valley" not in settlement


def test_statement_csv_stays_english_and_machine_readable(world: World) -> None:  # noqa: F811
    invoice = Invoice.objects.get(buyer=world.acme, period_start=MARCH)
    with translation.override("zh-hans"):
        text = rendering.invoice_csv(invoice=invoice).decode("utf-8-sig")
    assert text.splitlines()[0].startswith("invoice,seq,kind,description,cluster,band,card_seconds")
    assert "Amount due" in text and "应付金额" not in text
