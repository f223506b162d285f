"""Month-end close: exactly once, resumable after a crash, late usage on the next statement, totals exact to
the fen against an independent calculation, CSV and PDF.

A month of usage with time pinned: March 2026 in Asia/Shanghai, on a Guangdong time-of-use cluster
(valley 0.38, flat 1, peak 1.7) at 7.7777 CNY per A800 card-hour, 10% commission. ``acme`` holds a pack
(100 card-hours for 1,000 CNY: 10 CNY of prepaid value per card-hour drawn); ``beta`` has none (arrears).
"""

from __future__ import annotations

import csv
import io
from datetime import date, datetime
from decimal import ROUND_HALF_EVEN, Decimal
from fractions import Fraction
from zoneinfo import ZoneInfo

import pytest
from django.db.models import Count

from core.models import Organisation
from federation.models import Cluster
from metering import rendering
from metering.errors import BillingPeriodInvalidError, BillingPeriodOpenError
from metering.models import (
    BillingCloseRun,
    Invoice,
    InvoiceLine,
    PackOrder,
    PackRefund,
    PriceCard,
    RatedSegment,
    Settlement,
    Tariff,
)
from metering.services import billing, statements
from metering.services.billing import billing_close_period, billing_close_previous_month
from metering.services.rating import usage_rate_pending
from metering.services.usage import usage_record_create_batch
from metering.types import UsageRecordInput
from tests.factories import BuyerFactory, OperatorFactory, make_cluster
from tests.metering.factories import make_paid_pack

pytestmark = pytest.mark.django_db

SH = ZoneInfo("Asia/Shanghai")
A800 = "nvidia-a800-sxm4-80gb"
CPI = "cpi:cucc:nx:zw-ai01"
RATE = Fraction("7.7777")
COMMISSION = Fraction("0.10")
PACK_VALUE_PER_CARD_HOUR = Fraction(1000, 100)
MULTIPLIER = {"valley": Fraction("0.38"), "flat": Fraction(1), "peak": Fraction("1.7")}
MARCH = date(2026, 3, 1)
APRIL = date(2026, 4, 1)


def sh(*args: int) -> datetime:
    return datetime(*args, tzinfo=SH)


def fen(value: Fraction) -> Decimal:
    """The independent rounding: exact rational → Decimal, half to even at the fen."""
    return (Decimal(value.numerator) / Decimal(value.denominator)).quantize(Decimal("0.01"), ROUND_HALF_EVEN)


# --- World ------------------------------------------------------------------------------------------


def price_card_for(cluster: Cluster, *, rate: str = "7.7777", tariff_code: str = "cn-gd") -> PriceCard:
    """A price card in force since 2025 (the service refuses a start in the past, so it is written here)."""
    tariff = Tariff.objects.get(code=tariff_code, owner__isnull=True)
    return PriceCard.objects.create(
        cluster=cluster,
        version=1,
        rate_per_card_hour=Decimal(rate),
        tariff_version=tariff.versions.order_by("version").first(),
        effective_from=sh(2025, 1, 1),
    )


def report_and_rate(
    operator: Organisation,
    *records: tuple[str, str, int, datetime, datetime],
    now: datetime,
    cpi: str = CPI,
) -> None:
    """Report usage records (key, buyer slug, cards, start, end) at ``now`` and rate them at ``now``."""
    usage_record_create_batch(
        operator=operator,
        records=[
            UsageRecordInput(
                idempotency_key=key, cluster=cpi, buyer=buyer, cards=cards, start_at=start, end_at=end
            )
            for key, buyer, cards, start, end in records
        ],
        now=now,
    )
    usage_rate_pending(now=now)


class World:
    def __init__(self) -> None:
        self.operator = OperatorFactory(slug="cucc", name="China Unicom")
        self.cluster = make_cluster(operator=self.operator, islands=[("isl-01", 64)])
        price_card_for(self.cluster)
        self.acme = BuyerFactory(slug="acme", name="Acme AI 智算")
        self.beta = BuyerFactory(slug="beta", name="Beta Labs")
        self.pack = make_paid_pack(
            buyer=self.acme, accelerator=A800, card_hours=100, price="1000.00", paid_at=sh(2026, 3, 2, 9)
        )

    def march_usage(self) -> None:
        report_and_rate(
            self.operator,
            # 3 cards 07:30–08:20:34: 30 min valley, 20 min 34 s flat.
            ("r1", "acme", 3, sh(2026, 3, 10, 7, 30), sh(2026, 3, 10, 8, 20, 34)),
            # 5 cards 10:00–11:00:17: peak.
            ("r2", "acme", 5, sh(2026, 3, 15, 10), sh(2026, 3, 15, 11, 0, 17)),
            # beta, no pack: 2 cards 20:00–21:00 flat, in arrears.
            ("r3", "beta", 2, sh(2026, 3, 20, 20), sh(2026, 3, 20, 21)),
            now=sh(2026, 3, 31, 12),
        )


@pytest.fixture
def world(db: None) -> World:
    return World()


CLOSE_MARCH_AT = sh(2026, 4, 1, 0, 30)

# Card-seconds per (buyer, band) in March, independently of the rating engine.
MARCH_CARD_SECONDS = {
    ("acme", "valley"): 3 * 1800,
    ("acme", "flat"): 3 * 1234,
    ("acme", "peak"): 5 * 3617,
    ("beta", "flat"): 2 * 3600,
}


def exact_gross(card_seconds: int, band: str) -> Fraction:
    return RATE * card_seconds * MULTIPLIER[band] / 3600


def exact_value(card_seconds: int, band: str) -> Fraction:
    return PACK_VALUE_PER_CARD_HOUR * card_seconds * MULTIPLIER[band] / 3600


def statement_snapshot(period_start: date | None = None) -> list[tuple]:
    """Every statement, line and total (of one period, or all), to compare before and after."""
    invoices = Invoice.objects.order_by("number")
    lines = InvoiceLine.objects.order_by("invoice__number", "seq")
    settlements = Settlement.objects.order_by("number")
    if period_start is not None:
        invoices = invoices.filter(period_start=period_start)
        lines = lines.filter(invoice__period_start=period_start)
        settlements = settlements.filter(period_start=period_start)
    return [
        *invoices.values_list(
            "pk",
            "number",
            "packs_amount",
            "usage_value",
            "arrears_amount",
            "amount_due",
            "total_paid",
            "issued_at",
        ),
        *lines.values_list("pk", "invoice__number", "seq", "kind", "amount", "card_seconds"),
        *settlements.values_list("pk", "number", "gross", "commission", "payable"),
    ]


# --- Tests ------------------------------------------------------------------------------------------


def test_close_totals_are_exact_to_the_fen(world: World) -> None:
    world.march_usage()
    run = billing_close_period(period_start=MARCH, now=CLOSE_MARCH_AT)

    assert (run.invoices_issued, run.settlements_issued) == (2, 1)
    assert run.finished_at is not None

    acme = Invoice.objects.get(buyer=world.acme, period_start=MARCH)
    assert acme.number == "INV-202603-acme"
    assert acme.period_end == APRIL
    lines = list(acme.lines.order_by("seq"))
    assert [(line.kind, line.band) for line in lines] == [
        ("pack_purchase", ""),
        ("usage", "peak"),
        ("usage", "flat"),
        ("usage", "valley"),
    ]
    assert lines[0].amount == Decimal("1000.00")
    assert lines[0].order_id == world.pack.order_id
    for line in lines[1:]:
        card_seconds = MARCH_CARD_SECONDS[("acme", line.band)]
        assert line.card_seconds == card_seconds
        assert line.amount == fen(exact_value(card_seconds, line.band)), line.band
        assert line.cluster_id == world.cluster.pk
    assert acme.packs_amount == Decimal("1000.00")
    assert acme.usage_value == sum(line.amount for line in lines[1:])
    assert acme.usage_value == fen(exact_value(5 * 3617, "peak")) + fen(exact_value(3 * 1234, "flat")) + fen(
        exact_value(3 * 1800, "valley")
    )
    assert (acme.arrears_amount, acme.amount_due, acme.total_paid) == (
        Decimal("0"),
        Decimal("0"),
        Decimal("1000.00"),
    )

    beta = Invoice.objects.get(buyer=world.beta, period_start=MARCH)
    [arrears] = beta.lines.all()
    assert (arrears.kind, arrears.band, arrears.card_seconds) == ("arrears", "flat", 7200)
    assert arrears.amount == fen(exact_gross(7200, "flat")) == Decimal("15.56")
    assert beta.amount_due == beta.arrears_amount == Decimal("15.56")
    assert beta.packs_amount == beta.total_paid == Decimal("0")

    settlement = Settlement.objects.get(operator=world.operator, period_start=MARCH)
    assert settlement.number == "STL-202603-cucc"
    by_band: dict[str, int] = {}
    for (_buyer, band), seconds in MARCH_CARD_SECONDS.items():
        by_band[band] = by_band.get(band, 0) + seconds
    s_lines = {line.band: line for line in settlement.lines.all()}
    assert set(s_lines) == set(by_band)
    for band, seconds in by_band.items():
        line = s_lines[band]
        gross = exact_gross(seconds, band)
        assert line.card_seconds == seconds
        assert line.gross == fen(gross), band
        assert line.commission == fen(gross * COMMISSION), band
        assert line.payable == line.gross - line.commission
        assert not line.prior_period
    assert settlement.gross == sum(line.gross for line in s_lines.values())
    assert settlement.commission == sum(line.commission for line in s_lines.values())
    assert settlement.payable == settlement.gross - settlement.commission

    # Every segment is on exactly one invoice and one settlement.
    assert not RatedSegment.objects.filter(invoice__isnull=True).exists()
    assert not RatedSegment.objects.filter(settlement__isnull=True).exists()


def test_second_run_changes_nothing(world: World) -> None:
    world.march_usage()
    first = billing_close_period(period_start=MARCH, now=CLOSE_MARCH_AT)
    before = statement_snapshot()

    second = billing_close_period(period_start=MARCH, now=sh(2026, 4, 1, 1))
    again = billing_close_previous_month(now=sh(2026, 4, 1, 2))

    assert first.pk == second.pk == again.pk
    assert BillingCloseRun.objects.count() == 1
    assert statement_snapshot() == before
    assert Invoice.objects.count() == 2 and Settlement.objects.count() == 1


def test_crash_half_way_then_rerun_completes_without_duplicates(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.march_usage()
    real = billing._invoice_lines
    calls = {"n": 0}

    def crash_on_second(**kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("worker killed")
        return real(**kwargs)

    monkeypatch.setattr(billing, "_invoice_lines", crash_on_second)
    with pytest.raises(RuntimeError):
        billing_close_period(period_start=MARCH, now=CLOSE_MARCH_AT)

    run = BillingCloseRun.objects.get(period_start=MARCH)
    assert run.finished_at is None
    assert list(Invoice.objects.values_list("number", flat=True)) == ["INV-202603-acme"]
    assert not RatedSegment.objects.filter(usage_record__buyer=world.beta, invoice__isnull=False).exists()
    acme_before = list(Invoice.objects.filter(buyer=world.acme).values_list("pk", "issued_at", "usage_value"))
    acme_lines_before = list(InvoiceLine.objects.values_list("pk", "seq", "amount"))

    monkeypatch.setattr(billing, "_invoice_lines", real)
    rerun = billing_close_period(period_start=MARCH, now=sh(2026, 4, 1, 0, 45))

    assert rerun.pk == run.pk and rerun.finished_at is not None
    assert (rerun.invoices_issued, rerun.settlements_issued) == (2, 1)
    assert sorted(Invoice.objects.values_list("number", flat=True)) == ["INV-202603-acme", "INV-202603-beta"]
    # acme's invoice, issued before the crash, is untouched.
    assert (
        list(Invoice.objects.filter(buyer=world.acme).values_list("pk", "issued_at", "usage_value"))
        == acme_before
    )
    assert list(InvoiceLine.objects.filter(invoice__buyer=world.acme).values_list("pk", "seq", "amount")) == (
        acme_lines_before
    )
    assert not RatedSegment.objects.filter(invoice__isnull=True).exists()
    assert not RatedSegment.objects.filter(settlement__isnull=True).exists()
    dupes = (
        InvoiceLine.objects.filter(kind="pack_purchase")
        .values("order")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
    )
    assert not dupes.exists()


def test_late_record_lands_on_next_statement_as_prior_period(world: World) -> None:
    world.march_usage()
    billing_close_period(period_start=MARCH, now=CLOSE_MARCH_AT)
    march_before = statement_snapshot(MARCH)

    # Reported on 2 April for the evening of 31 March (inside the 35-day late window).
    report_and_rate(
        world.operator,
        ("late", "acme", 1, sh(2026, 3, 31, 22), sh(2026, 3, 31, 23)),
        now=sh(2026, 4, 2, 10),
    )
    # A second run of the March close does not reopen it.
    billing_close_period(period_start=MARCH, now=sh(2026, 4, 2, 11))
    assert statement_snapshot() == march_before
    assert RatedSegment.objects.filter(invoice__isnull=True).count() == 1

    billing_close_period(period_start=APRIL, now=sh(2026, 5, 1, 0, 30))

    assert statement_snapshot(MARCH) == march_before
    april = Invoice.objects.get(buyer=world.acme, period_start=APRIL)
    [line] = april.lines.all()
    assert line.kind == "prior_period"
    assert line.band == "flat" and line.card_seconds == 3600
    assert line.amount == fen(exact_value(3600, "flat")) == Decimal("10.00")
    assert line.description.startswith("Late, from before 2026-04")
    assert april.usage_value == Decimal("10.00") and april.amount_due == Decimal("0")
    settlement = Settlement.objects.get(operator=world.operator, period_start=APRIL)
    [s_line] = settlement.lines.all()
    assert s_line.prior_period and s_line.card_seconds == 3600
    assert s_line.gross == fen(exact_gross(3600, "flat")) == Decimal("7.78")
    # beta had nothing new in April: no invoice.
    assert not Invoice.objects.filter(buyer=world.beta, period_start=APRIL).exists()


def test_late_arrears_are_owed_on_the_next_invoice(world: World) -> None:
    world.march_usage()
    billing_close_period(period_start=MARCH, now=CLOSE_MARCH_AT)
    report_and_rate(
        world.operator, ("late-b", "beta", 1, sh(2026, 3, 31, 20), sh(2026, 3, 31, 21)), now=sh(2026, 4, 3)
    )
    billing_close_period(period_start=APRIL, now=sh(2026, 5, 1, 0, 30))
    april = Invoice.objects.get(buyer=world.beta, period_start=APRIL)
    [line] = april.lines.all()
    assert line.kind == "prior_period" and "(owed)" in line.description
    assert april.arrears_amount == fen(exact_gross(3600, "flat")) == Decimal("7.78")
    # Nothing paid March's arrears (no pack was bought): what March left due is carried forward.
    march = Invoice.objects.get(buyer=world.beta, period_start=MARCH)
    assert april.arrears_brought_forward == march.amount_due == Decimal("15.56")
    assert april.amount_due == Decimal("15.56") + Decimal("7.78") == Decimal("23.34")


def test_orders_and_refunds_are_stated_once_even_when_reported_late(world: World) -> None:
    pack = make_paid_pack(
        buyer=world.beta, accelerator=A800, card_hours=10, price="123.45", paid_at=sh(2026, 4, 3)
    )
    billing_close_period(period_start=MARCH, now=CLOSE_MARCH_AT)
    # The refund happened on 31 March but Stripe's event arrives after March was closed.
    PackRefund.objects.create(
        order=pack.order,
        pack=pack,
        stripe_refund_id="re_123",
        amount=Decimal("23.45"),
        card_hours_debited=0,
        refunded_at=sh(2026, 3, 31, 23),
    )
    billing_close_period(period_start=APRIL, now=sh(2026, 5, 1, 0, 30))
    billing_close_period(period_start=date(2026, 5, 1), now=sh(2026, 6, 1, 0, 30))

    april = Invoice.objects.get(buyer=world.beta, period_start=APRIL)
    assert [(line.kind, line.amount) for line in april.lines.order_by("seq")] == [
        ("pack_purchase", Decimal("123.45")),
        ("refund", Decimal("-23.45")),
    ]
    assert (april.packs_amount, april.refunds_amount, april.total_paid) == (
        Decimal("123.45"),
        Decimal("-23.45"),
        Decimal("100.00"),
    )
    assert InvoiceLine.objects.filter(kind="refund").count() == 1
    assert InvoiceLine.objects.filter(kind="pack_purchase", order=pack.order).count() == 1
    # March: only acme's pack was paid in March.
    assert list(Invoice.objects.filter(period_start=MARCH).values_list("number", flat=True)) == [
        "INV-202603-acme"
    ]
    assert not Invoice.objects.filter(period_start=date(2026, 5, 1)).exists()


def test_period_rules(world: World) -> None:
    with pytest.raises(BillingPeriodInvalidError):
        billing_close_period(period_start=date(2026, 3, 2), now=CLOSE_MARCH_AT)
    with pytest.raises(BillingPeriodOpenError):
        billing_close_period(period_start=MARCH, now=sh(2026, 3, 31, 23, 59))
    assert not BillingCloseRun.objects.exists()


def test_previous_month_is_taken_in_the_billing_zone(world: World) -> None:
    # 16:30 UTC on 31 March is 00:30 on 1 April in Shanghai: the close is March's.
    run = billing_close_previous_month(now=datetime(2026, 3, 31, 16, 30, tzinfo=ZoneInfo("UTC")))
    assert run.period_start == MARCH
    assert billing.billing_previous_period_start(now=sh(2026, 1, 1, 0, 30)) == date(2025, 12, 1)


def test_long_slug_numbers_fit_and_stay_unique(db: None) -> None:
    first = BuyerFactory(slug="a" * 32)
    second = BuyerFactory(slug="a" * 31 + "b")
    numbers = {billing.invoice_number(buyer=org, period_start=MARCH) for org in (first, second)}
    assert len(numbers) == 2
    assert all(len(number) <= 40 and number.startswith("INV-202603-") for number in numbers)
    assert billing.invoice_number(buyer=BuyerFactory(slug="short"), period_start=MARCH) == "INV-202603-short"


def test_csv_and_pdf(world: World) -> None:
    world.march_usage()
    billing_close_period(period_start=MARCH, now=CLOSE_MARCH_AT)
    invoice = Invoice.objects.get(buyer=world.acme, period_start=MARCH)
    settlement = Settlement.objects.get(period_start=MARCH)

    raw = rendering.invoice_csv(invoice=invoice)
    assert raw.startswith(b"\xef\xbb\xbf")
    rows = list(csv.reader(io.StringIO(raw.decode("utf-8-sig"))))
    assert rows[0][:3] == ["invoice", "seq", "kind"]
    assert [row[2] for row in rows[1:5]] == ["pack_purchase", "usage", "usage", "usage"]
    totals = {row[2]: Decimal(row[8]) for row in rows if row[2].startswith("total:")}
    assert totals["total:usage_value"] == invoice.usage_value
    assert totals["total:packs_amount"] == sum(Decimal(row[8]) for row in rows[1:2])
    assert totals["total:usage_value"] == sum(Decimal(row[8]) for row in rows[2:5])

    s_rows = list(
        csv.reader(io.StringIO(rendering.settlement_csv(settlement=settlement).decode("utf-8-sig")))
    )
    assert s_rows[-1][2] == "total"
    assert Decimal(s_rows[-1][8]) == settlement.payable == sum(Decimal(row[8]) for row in s_rows[1:-1])

    for pdf, number in (
        (statements.invoice_document(invoice=invoice).content, invoice.number),
        (statements.settlement_document(settlement=settlement).content, settlement.number),
    ):
        assert pdf.startswith(b"%PDF-")
        assert number.encode() in pdf
        assert pdf.rstrip().endswith(b"%%EOF")


def test_pack_orders_unpaid_are_not_invoiced(world: World) -> None:
    PackOrder.objects.create(
        buyer=world.beta,
        product=world.pack.order.product,
        card_hours=100,
        amount=Decimal("1000.00"),
        validity_days=365,
        idempotency_key="pending",
    )
    billing_close_period(period_start=MARCH, now=CLOSE_MARCH_AT)
    assert list(Invoice.objects.values_list("number", flat=True)) == ["INV-202603-acme"]
