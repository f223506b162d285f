"""Arrears are settled from the next pack credited, before any of it is usable: exact ledger postings, a
pack smaller than the arrears, a standard pack at the chip's factor, a replayed pack credit, and the
invoice that shows what was due and what settled it.

Time pinned to March 2026 (Asia/Shanghai). ``beta`` uses 2 A800 cards for an hour of the Guangdong flat
band (multiplier 1) at 7.7777 CNY per card-hour with no pack: 2 A800 card-hours owed and 15.5554 CNY
(15,555,400 micro-yuan) owed. The A800's standard-card factor is 312 / 400 = 0.78.
"""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal
from fractions import Fraction
from zoneinfo import ZoneInfo

import pytest
from django.db.models import Sum

from core.money import MICROS
from metering.models import (
    ArrearsSettlement,
    BuyerExhaustion,
    Invoice,
    LedgerAccount,
    LedgerEntry,
    LedgerTransfer,
    Pack,
    TransferKind,
)
from metering.services.billing import billing_close_period
from metering.services.packs import pack_issue
from tests.factories import BuyerFactory, OperatorFactory, make_cluster
from tests.metering.factories import make_paid_pack
from tests.metering.localstripe import (  # noqa: F401  # fixtures
    localstripe_fixture,
    stripe_on_localstripe_fixture,
    stripe_webhooks_fixture,
)
from tests.metering.test_billing_close import price_card_for, report_and_rate

pytestmark = pytest.mark.django_db

SH = ZoneInfo("Asia/Shanghai")
A800 = "nvidia-a800-sxm4-80gb"
OWED_CARD_HOURS = 2 * MICROS
OWED_MONEY = 15_555_400  # 2 card-hours × 7.7777 CNY, in micro-yuan


def sh(*args: int) -> datetime:
    return datetime(*args, tzinfo=SH)


@pytest.fixture
def beta(db: None):
    operator = OperatorFactory(slug="cucc", name="China Unicom")
    cluster = make_cluster(operator=operator, islands=[("isl-01", 64)])
    price_card_for(cluster)
    buyer = BuyerFactory(slug="beta", name="Beta Labs")
    report_and_rate(
        operator, ("r1", "beta", 2, sh(2026, 3, 20, 20), sh(2026, 3, 20, 21)), now=sh(2026, 3, 21)
    )
    assert balance(f"arrears:{buyer.pk}:{A800}") == -OWED_CARD_HOURS
    assert balance(f"buyer_money:{buyer.pk}") == OWED_MONEY
    assert BuyerExhaustion.objects.filter(buyer=buyer, cleared_at__isnull=True).count() == 1
    return buyer


def balance(key: str) -> int:
    account = LedgerAccount.objects.filter(key=key).first()
    return account.balance if account else 0


def entries(transfer: LedgerTransfer) -> dict[str, int]:
    return {e.account.key: e.amount for e in transfer.entries.select_related("account")}


def assert_every_transfer_balances() -> None:
    for row in LedgerEntry.objects.values("transfer_id", "unit").annotate(total=Sum("amount")):
        assert row["total"] == 0, row


def test_a_chip_pack_pays_the_arrears_of_its_chip_before_it_is_usable(beta) -> None:
    pack = make_paid_pack(
        buyer=beta, accelerator=A800, card_hours=10, price="100.00", paid_at=sh(2026, 3, 25)
    )

    settlement = ArrearsSettlement.objects.get()
    assert (settlement.pack, settlement.arrears_class, settlement.factor) == (pack, A800, None)
    assert settlement.arrears_card_hours == settlement.pack_draw == 2 * MICROS
    assert settlement.prepaid_value == 20 * MICROS  # 2 of 10 card-hours of a 100.00 pack
    assert settlement.money_cleared == OWED_MONEY
    transfer = LedgerTransfer.objects.get(kind=TransferKind.ARREARS_SETTLEMENT)
    assert transfer == settlement.transfer
    assert transfer.idempotency_key == f"arrears_settlement:{pack.order_id}:{A800}"
    assert entries(transfer) == {
        f"pack:{pack.pk}": -2 * MICROS,
        f"arrears:{beta.pk}:{A800}": 2 * MICROS,
        f"buyer_money:{beta.pk}": 20 * MICROS - OWED_MONEY,
        "platform_spread": OWED_MONEY - 20 * MICROS,
    }
    assert balance(f"pack:{pack.pk}") == 8 * MICROS
    assert balance(f"arrears:{beta.pk}:{A800}") == 0
    # −100 paid in, +15.5554 owed, +4.4446 settled: what is left is the prepaid value of 8 card-hours.
    assert balance(f"buyer_money:{beta.pk}") == -80 * MICROS
    assert_every_transfer_balances()
    pack.refresh_from_db()
    assert pack.status == Pack.Status.ACTIVE
    assert not BuyerExhaustion.objects.filter(buyer=beta, cleared_at__isnull=True).exists()


def test_a_pack_credited_again_settles_nothing_again(beta) -> None:
    pack = make_paid_pack(
        buyer=beta, accelerator=A800, card_hours=10, price="100.00", paid_at=sh(2026, 3, 25)
    )
    again, created = pack_issue(order=pack.order, paid_at=sh(2026, 3, 26), posted_by="replay")
    assert (again, created) == (pack, False)
    assert ArrearsSettlement.objects.count() == 1
    assert LedgerTransfer.objects.filter(kind=TransferKind.ARREARS_SETTLEMENT).count() == 1
    assert balance(f"pack:{pack.pk}") == 8 * MICROS


def test_a_standard_pack_smaller_than_the_arrears_pays_what_it_can_at_the_chips_factor(beta) -> None:
    small = make_paid_pack(buyer=beta, card_hours=1, price="11.00", paid_at=sh(2026, 3, 25))

    first = ArrearsSettlement.objects.get()
    # 1 standard card-hour pays 1 / 0.78 A800 card-hours, floored to the micro-card-hour.
    cleared = 1 * MICROS * 10_000 // 7_800
    assert cleared == 1_282_051
    assert (first.arrears_card_hours, first.factor) == (cleared, Decimal("0.7800"))
    assert first.pack_draw == 1_000_000  # round(1,282,051 × 0.78) = round(999,999.78)
    assert first.prepaid_value == 11 * MICROS  # the whole pack
    money = Fraction(OWED_MONEY * cleared, OWED_CARD_HOURS)
    assert first.money_cleared == round(money) == 9_971_408
    assert entries(first.transfer) == {
        f"pack:{small.pk}": -1_000_000,
        "issuance:std": 1_000_000,
        f"arrears:{beta.pk}:{A800}": cleared,
        f"issuance:{A800}": -cleared,
        f"buyer_money:{beta.pk}": 11 * MICROS - 9_971_408,
        "platform_spread": 9_971_408 - 11 * MICROS,
    }
    small.refresh_from_db()
    assert small.status == Pack.Status.EXHAUSTED and balance(f"pack:{small.pk}") == 0
    assert balance(f"arrears:{beta.pk}:{A800}") == -(OWED_CARD_HOURS - cleared) == -717_949
    # Nothing of the pack is usable: the buyer stays flagged for the broker.
    assert BuyerExhaustion.objects.filter(buyer=beta, cleared_at__isnull=True).count() == 1

    # The next pack pays the rest, and the money owed is cleared to the micro-yuan.
    big = make_paid_pack(buyer=beta, accelerator=A800, card_hours=10, price="100.00", paid_at=sh(2026, 3, 26))
    second = ArrearsSettlement.objects.get(pack=big)
    assert second.arrears_card_hours == second.pack_draw == 717_949
    assert second.money_cleared == OWED_MONEY - 9_971_408 == 5_583_992
    assert balance(f"arrears:{beta.pk}:{A800}") == 0
    assert balance(f"pack:{big.pk}") == 10 * MICROS - 717_949
    assert balance(f"buyer_money:{beta.pk}") == -(100 * MICROS - second.prepaid_value)
    assert not BuyerExhaustion.objects.filter(buyer=beta, cleared_at__isnull=True).exists()
    assert_every_transfer_balances()


def test_a_pack_of_another_chip_pays_nothing(beta) -> None:
    other = make_paid_pack(
        buyer=beta, accelerator="huawei-ascend-910b3", card_hours=10, price="80.00", paid_at=sh(2026, 3, 25)
    )
    assert not ArrearsSettlement.objects.exists()
    assert balance(f"pack:{other.pk}") == 10 * MICROS
    assert balance(f"arrears:{beta.pk}:{A800}") == -OWED_CARD_HOURS


def test_the_invoice_shows_the_amount_due_and_what_settled_it(beta) -> None:
    make_paid_pack(buyer=beta, accelerator=A800, card_hours=10, price="100.00", paid_at=sh(2026, 3, 25))
    billing_close_period(period_start=date(2026, 3, 1), now=sh(2026, 4, 1, 0, 30))

    invoice = Invoice.objects.get(buyer=beta)
    lines = [(line.kind, line.amount, line.card_hours_drawn) for line in invoice.lines.order_by("seq")]
    assert lines == [
        ("pack_purchase", Decimal("100.00"), Decimal("0")),
        ("arrears", Decimal("15.56"), Decimal("2.000000")),
        ("arrears_paid", Decimal("-15.56"), Decimal("2.000000")),
    ]
    paid_line = invoice.lines.get(kind="arrears_paid")
    assert paid_line.arrears_settlement == ArrearsSettlement.objects.get()
    assert paid_line.description.startswith(f"Arrears paid: 2.000000 {A800} card-hours, from pack ")
    assert (
        invoice.arrears_brought_forward,
        invoice.arrears_amount,
        invoice.arrears_settled,
        invoice.amount_due,
    ) == (Decimal("0.00"), Decimal("15.56"), Decimal("-15.56"), Decimal("0.00"))
    assert ArrearsSettlement.objects.get().invoice == invoice

    # April: nothing new; March's invoice left nothing due, so nothing is carried.
    billing_close_period(period_start=date(2026, 4, 1), now=sh(2026, 5, 1, 0, 30))
    assert not Invoice.objects.filter(buyer=beta, period_start=date(2026, 4, 1)).exists()


def test_arrears_of_a_closed_month_are_carried_and_settled_on_the_next_invoice(beta) -> None:
    billing_close_period(period_start=date(2026, 3, 1), now=sh(2026, 4, 1, 0, 30))
    march = Invoice.objects.get(buyer=beta)
    assert march.amount_due == Decimal("15.56")

    make_paid_pack(buyer=beta, accelerator=A800, card_hours=10, price="100.00", paid_at=sh(2026, 4, 2))
    billing_close_period(period_start=date(2026, 4, 1), now=sh(2026, 5, 1, 0, 30))
    april = Invoice.objects.get(buyer=beta, period_start=date(2026, 4, 1))
    assert [(line.kind, line.amount) for line in april.lines.order_by("seq")] == [
        ("pack_purchase", Decimal("100.00")),
        ("arrears_paid", Decimal("-15.56")),
    ]
    assert (april.arrears_brought_forward, april.arrears_amount, april.arrears_settled, april.amount_due) == (
        Decimal("15.56"),
        Decimal("0.00"),
        Decimal("-15.56"),
        Decimal("0.00"),
    )


# --- Through Stripe's webhook (localstripe) ---------------------------------------------------------


@pytest.mark.usefixtures("stripe_on_localstripe")
def test_a_replayed_webhook_settles_the_arrears_once(localstripe, stripe_webhooks) -> None:
    from tests.metering.conftest import local
    from tests.metering.factories import make_pack_product
    from tests.metering.localstripe import deliver, order_pack, pay, post_webhook, sign, synthetic_event

    operator = OperatorFactory(slug="cucc", name="China Unicom")
    cluster = make_cluster(operator=operator, islands=[("isl-01", 64)])
    price_card_for(cluster, rate="10.0000")
    buyer = BuyerFactory(slug="gamma", name="Gamma")
    report_and_rate(
        operator, ("g1", "gamma", 2, local(3, 20), local(3, 21)), now=local(2, 12), cpi=cluster.cpi
    )
    owed_card_hours = -balance(f"arrears:{buyer.pk}:{A800}")
    owed_money = balance(f"buyer_money:{buyer.pk}")
    assert (owed_card_hours, owed_money) == (2 * MICROS, 20 * MICROS)  # 2 card-hours at 10 CNY, flat

    product = make_pack_product(code="a800-10", accelerator=A800, card_hours=10, price="150.00")
    order = order_pack(buyer=buyer, product=product)
    pay(order)
    delivery = stripe_webhooks.wait_for(
        type="payment_intent.succeeded", payment_intent_id=order.stripe_payment_intent_id
    )
    # The same delivery three times, then the same PaymentIntent under another event id.
    assert [deliver(delivery).status_code for _ in range(3)] == [200, 200, 200]
    again = synthetic_event(
        "payment_intent.succeeded",
        localstripe.get(f"/v1/payment_intents/{order.stripe_payment_intent_id}"),
        event_id="evt_test_second_success",
    )
    assert post_webhook(again, sign(again)).status_code == 200

    pack = Pack.objects.get(order=order)
    settlement = ArrearsSettlement.objects.get()
    assert (settlement.pack, settlement.arrears_card_hours, settlement.pack_draw) == (
        pack,
        2 * MICROS,
        2 * MICROS,
    )
    assert (settlement.prepaid_value, settlement.money_cleared) == (30 * MICROS, 20 * MICROS)
    assert LedgerTransfer.objects.filter(kind=TransferKind.ARREARS_SETTLEMENT).count() == 1
    assert entries(settlement.transfer) == {
        f"pack:{pack.pk}": -2 * MICROS,
        f"arrears:{buyer.pk}:{A800}": 2 * MICROS,
        f"buyer_money:{buyer.pk}": 10 * MICROS,
        "platform_spread": -10 * MICROS,
    }
    assert balance(f"pack:{pack.pk}") == 8 * MICROS
    assert balance(f"arrears:{buyer.pk}:{A800}") == 0
    assert balance(f"buyer_money:{buyer.pk}") == -120 * MICROS  # the prepaid value of 8 of 10 card-hours
    assert_every_transfer_balances()


def test_a_settlement_that_pays_every_owed_line_leaves_nothing_due_whatever_the_lines_rounding(db) -> None:
    # At ¥1.0050 per card-hour, an hour in each band is owed as peak 1.7085 → 1.71, flat 1.0050 → 1.00
    # (half to even) and valley 0.3819 → 0.38: the lines say 3.09 while the ledger clears exactly 3.0954,
    # which on its own rounds to 3.10. The arrears-paid line absorbs the difference: nothing is left due.
    operator = OperatorFactory(slug="cucc", name="China Unicom")
    cluster = make_cluster(operator=operator, islands=[("isl-01", 64)])
    price_card_for(cluster, rate="1.0050")
    buyer = BuyerFactory(slug="gamma", name="Gamma Labs")
    report_and_rate(
        operator,
        ("peak", "gamma", 1, sh(2026, 3, 20, 10), sh(2026, 3, 20, 11)),
        ("flat", "gamma", 1, sh(2026, 3, 20, 8), sh(2026, 3, 20, 9)),
        ("valley", "gamma", 1, sh(2026, 3, 20, 2), sh(2026, 3, 20, 3)),
        now=sh(2026, 3, 21),
    )
    assert balance(f"buyer_money:{buyer.pk}") == 3_095_400
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=10, price="100.00", paid_at=sh(2026, 3, 25))
    assert ArrearsSettlement.objects.get().money_cleared == 3_095_400

    billing_close_period(period_start=date(2026, 3, 1), now=sh(2026, 4, 1, 0, 30))
    invoice = Invoice.objects.get(buyer=buyer)
    assert [(line.kind, line.band, line.amount) for line in invoice.lines.order_by("seq")] == [
        ("pack_purchase", "", Decimal("100.00")),
        ("arrears", "peak", Decimal("1.71")),
        ("arrears", "flat", Decimal("1.00")),
        ("arrears", "valley", Decimal("0.38")),
        ("arrears_paid", "", Decimal("-3.09")),
    ]
    assert (invoice.arrears_amount, invoice.arrears_settled, invoice.amount_due) == (
        Decimal("3.09"),
        Decimal("-3.09"),
        Decimal("0.00"),
    )
    paid = invoice.lines.get(kind="arrears_paid")
    assert paid.net_amount + paid.tax_amount == paid.amount
