"""A month of usage, end to end, with time pinned: usage across peak/valley edges, local midnights, a
daylight-saving change and the month end → rating → month-end close → invoice and settlement, checked to
the fen against an independent calculation (minute-by-minute wall-clock bands in Fractions, no code shared
with the rating engine). Then a late record lands on the next statement and the closed one never changes.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from fractions import Fraction
from zoneinfo import ZoneInfo

import pytest
from django.db.models import Sum

from core.models import Organisation
from core.types import Actor
from federation.models import Accelerator, Cluster
from metering.models import Invoice, LedgerAccount, LedgerEntry, RatedSegment, Settlement, Tariff
from metering.services.billing import billing_close_period
from metering.services.rating import usage_rate_pending
from metering.services.tariffs import price_card_set, tariff_create, tariff_presets_install
from metering.services.usage import usage_record_create_batch
from metering.tariffs import TariffSpec, WindowSpec
from metering.types import UsageRecordInput
from tests.factories import BuyerFactory, OperatorFactory, make_cluster
from tests.metering.factories import make_paid_pack

SHANGHAI = ZoneInfo("Asia/Shanghai")
NEW_YORK = ZoneInfo("America/New_York")
A800, H800 = "nvidia-a800-sxm4-80gb", "nvidia-h800-sxm5-80gb"
WEEKDAYS, WEEKEND = 0b0011111, 0b1100000

# An operator-defined tariff in a zone that observes daylight saving (US Eastern: 2 a.m. on 8 March 2026
# becomes 3 a.m.): valley 23:00–07:00 every day, peak 14:00–19:00 on weekdays, flat otherwise.
US_EAST = TariffSpec(
    time_zone="America/New_York",
    multipliers={"peak": Decimal("1.6"), "flat": Decimal("1"), "valley": Decimal("0.5")},
    windows=(
        WindowSpec("valley", 23 * 60, 7 * 60),
        WindowSpec("flat", 7 * 60, 14 * 60),
        WindowSpec("peak", 14 * 60, 19 * 60, weekdays=WEEKDAYS),
        WindowSpec("flat", 14 * 60, 19 * 60, weekdays=WEEKEND),
        WindowSpec("flat", 19 * 60, 23 * 60),
    ),
)


def band_guangdong(local: datetime) -> tuple[str, Fraction]:
    """The Guangdong preset in March, written out independently of metering.tariffs."""
    minute = local.hour * 60 + local.minute
    if minute < 8 * 60:
        return "valley", Fraction(38, 100)
    if 10 * 60 <= minute < 12 * 60 or 14 * 60 <= minute < 19 * 60:
        return "peak", Fraction(17, 10)
    return "flat", Fraction(1)


def band_us_east(local: datetime) -> tuple[str, Fraction]:
    minute = local.hour * 60 + local.minute
    if minute >= 23 * 60 or minute < 7 * 60:
        return "valley", Fraction(1, 2)
    if 14 * 60 <= minute < 19 * 60 and local.weekday() < 5:
        return "peak", Fraction(8, 5)
    return "flat", Fraction(1)


def fen(value: Fraction) -> Decimal:
    return (Decimal(value.numerator) / Decimal(value.denominator)).quantize(Decimal("0.01"), ROUND_HALF_EVEN)


def sh(day: int, hour: int, minute: int = 0, month: int = 3) -> datetime:
    return datetime(2026, month, day, hour, minute, tzinfo=SHANGHAI)


def ny(day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 3, day, hour, minute, tzinfo=NEW_YORK)


class Expected:
    """The independent calculation: per (cluster, band), card-seconds, gross, pack draw and its value."""

    def __init__(self) -> None:
        self.card_seconds: dict[tuple[str, str], int] = defaultdict(int)
        self.gross: dict[tuple[str, str], Fraction] = defaultdict(Fraction)
        self.value: dict[tuple[str, str], Fraction] = defaultdict(Fraction)

    def add(
        self,
        *,
        cpi: str,
        cards: int,
        start: datetime,
        end: datetime,
        zone: ZoneInfo,
        band_of,
        rate: Fraction,
        factor: Fraction,
        unit_value: Fraction,
        until: datetime,
    ) -> None:
        instant = start.astimezone(UTC)
        while instant < min(end, until):
            band, multiplier = band_of(instant.astimezone(zone))
            key = (cpi, band)
            self.card_seconds[key] += cards * 60
            self.gross[key] += rate * cards * Fraction(60, 3600) * multiplier
            self.value[key] += unit_value * cards * Fraction(60, 3600) * multiplier * factor
            instant += timedelta(minutes=1)


@pytest.mark.django_db
def test_a_month_of_usage_is_invoiced_and_settled_to_the_fen() -> None:
    tariff_presets_install()
    operator = OperatorFactory(slug="cucc", name="China Unicom")
    buyer = BuyerFactory(slug="acme", name="Acme AI")
    actor = Actor(organisation=operator, system_label="scenario")
    gd = make_cluster(operator=operator, name="zw-ai01", accelerator=A800)
    us = make_cluster(operator=operator, name="zw-ai02", accelerator=H800)
    us_tariff = tariff_create(
        owner=operator,
        code="us-east",
        name="US East",
        time_zone="America/New_York",
        source="test",
        spec=US_EAST,
        effective_from=None,
        actor=actor,
    )
    price_card_set(
        cluster=gd,
        rate_per_card_hour=Decimal("10.0000"),
        tariff=Tariff.objects.get(code="cn-gd"),
        effective_from=None,
        actor=actor,
    )
    price_card_set(
        cluster=us, rate_per_card_hour=Decimal("23.4567"), tariff=us_tariff, effective_from=None, actor=actor
    )
    # 18,000 CNY for 2,000 A800 card-hours (9 CNY each); 33,000 CNY for 1,500 standard card-hours (22 each).
    a800_pack = make_paid_pack(
        buyer=buyer, accelerator=A800, card_hours=2000, price="18000.00", paid_at=sh(20, 9, month=2)
    )
    std_pack = make_paid_pack(
        buyer=buyer, accelerator=None, card_hours=1500, price="33000.00", paid_at=sh(20, 9, month=2)
    )

    records: list[UsageRecordInput] = []
    expected = Expected()
    march_end = sh(1, 0, month=4)
    for day in range(1, 32):  # 06:30–11:15 in Guangdong: valley → flat → peak, every day of March
        records.append(UsageRecordInput(f"gd-{day}", gd.cpi, "acme", 8, sh(day, 6, 30), sh(day, 11, 15), 1))
    records.append(UsageRecordInput("gd-month-end", gd.cpi, "acme", 16, sh(31, 22), sh(1, 2, month=4), 1))
    for day in range(1, 31, 3):  # 12:00–21:00 New York time: flat → peak (weekdays) → flat
        records.append(UsageRecordInput(f"us-{day}", us.cpi, "acme", 4, ny(day, 12), ny(day, 21), 1))
    records.append(UsageRecordInput("us-dst", us.cpi, "acme", 4, ny(7, 22), ny(8, 5), 1))  # 6 real hours
    records.append(UsageRecordInput("us-midnight", us.cpi, "acme", 2, ny(13, 23, 17), ny(14, 0, 43), 1))

    # The standard-card factor of the H800: its dense FP16 TFLOPS from the catalog / 400, to 4 places.
    tflops = Accelerator.objects.get(slug=H800).dense_fp16_tflops
    factor = Fraction(round(Fraction(tflops) / 400 * 10000), 10000)
    for r in records:
        cluster = gd if r.cluster == gd.cpi else us
        expected.add(
            cpi=cluster.cpi,
            cards=r.cards,
            start=r.start_at,
            end=r.end_at,
            zone=SHANGHAI if cluster == gd else NEW_YORK,
            band_of=band_guangdong if cluster == gd else band_us_east,
            rate=Fraction(10) if cluster == gd else Fraction(234567, 10000),
            factor=Fraction(1) if cluster == gd else factor,
            unit_value=Fraction(9) if cluster == gd else Fraction(22),
            until=march_end,
        )

    ingest_now = sh(1, 3, month=4)
    result = usage_record_create_batch(operator=operator, records=records, now=ingest_now)
    assert result.created == len(records)
    assert usage_rate_pending(now=ingest_now) == len(records)
    assert usage_record_create_batch(operator=operator, records=records, now=ingest_now).duplicates == len(
        records
    )
    assert usage_rate_pending(now=ingest_now) == 0

    billing_close_period(period_start=date(2026, 3, 1), now=sh(1, 4, month=4))
    billing_close_period(period_start=date(2026, 3, 1), now=sh(1, 5, month=4))  # a second run: nothing new

    invoice = Invoice.objects.get(buyer=buyer)
    settlement = Settlement.objects.get(operator=operator)
    usage_lines = {(line.cluster.cpi, line.band): line for line in invoice.lines.filter(kind="usage")}
    assert set(usage_lines) == set(expected.card_seconds)
    for key, line in usage_lines.items():
        assert line.card_seconds == expected.card_seconds[key], key
        assert line.amount == fen(expected.value[key]), key
    settlement_lines = {(line.cluster.cpi, line.band): line for line in settlement.lines.all()}
    assert set(settlement_lines) == set(expected.gross)
    for key, line in settlement_lines.items():
        assert line.card_seconds == expected.card_seconds[key]
        assert line.gross == fen(expected.gross[key]), key
        assert line.commission == fen(expected.gross[key] / 10), key
        assert line.payable == line.gross - line.commission
    assert settlement.gross == sum(fen(g) for g in expected.gross.values())
    assert settlement.commission == sum(fen(g / 10) for g in expected.gross.values())
    assert invoice.packs_amount == Decimal("51000.00") and invoice.amount_due == 0
    assert invoice.usage_value == sum(fen(v) for v in expected.value.values())

    # The DST record: 22:00 on 7 March to 05:00 on 8 March New York time is six real hours.
    dst = RatedSegment.objects.filter(usage_record__idempotency_key="us-dst")
    assert dst.aggregate(s=Sum("card_seconds"))["s"] == 4 * 6 * 3600
    # The record across the month end: its April part waits for April's invoice.
    april_part = RatedSegment.objects.get(usage_record__idempotency_key="gd-month-end", start_at=march_end)
    assert april_part.invoice_id is None and april_part.settlement_id is None

    # The ledger agrees with the statements and balances in every unit.
    per_unit = LedgerEntry.objects.values("unit").annotate(t=Sum("amount"))
    assert all(row["t"] == 0 for row in per_unit)
    earned = -LedgerAccount.objects.get(key=f"operator_earnings:{operator.pk}").balance
    # Everything rated so far: March, plus the April valley hours of the month-end record (16 cards × 2 h
    # × 0.38 × 10 CNY).
    total_gross = sum(expected.gross.values(), Fraction(0)) + Fraction(1216, 10)
    assert abs(Fraction(earned, 10**6) - total_gross * Fraction(9, 10)) < Fraction(1, 10**4)
    assert LedgerAccount.objects.get(pack=a800_pack).balance > 0
    assert LedgerAccount.objects.get(pack=std_pack).balance > 0

    # A late record for 15 March, reported on 10 April: on April's invoice as prior-period usage; March's
    # invoice and settlement never change.
    frozen = (invoice.usage_value, list(invoice.lines.values_list("amount", flat=True)), settlement.payable)
    late = UsageRecordInput("gd-late", gd.cpi, "acme", 2, sh(15, 12), sh(15, 13), 1)  # flat hour
    usage_record_create_batch(operator=operator, records=[late], now=sh(10, 0, month=4))
    usage_rate_pending(now=sh(10, 0, month=4))
    billing_close_period(period_start=date(2026, 4, 1), now=sh(1, 1, month=5))
    invoice.refresh_from_db()
    settlement.refresh_from_db()
    assert (
        invoice.usage_value,
        list(invoice.lines.values_list("amount", flat=True)),
        settlement.payable,
    ) == frozen
    april = Invoice.objects.get(buyer=buyer, period_start=date(2026, 4, 1))
    prior = april.lines.get(kind="prior_period")
    assert (prior.card_seconds, prior.amount) == (2 * 3600, Decimal("18.00"))
    april_settlement = Settlement.objects.get(operator=operator, period_start=date(2026, 4, 1))
    assert april_settlement.lines.filter(prior_period=True).get().gross == Decimal("20.00")
    assert Cluster.objects.count() == 2 and Organisation.objects.filter(is_buyer=True).count() == 1
