"""One total: a standard-pack buyer's month on /usage/, in its CSVs and on its invoice agrees to the fen.

The buyer holds one standard-card pack at an awkward price (1,234.56 CNY for 100 standard card-hours), runs
A800 and H800 work on two clusters across the Guangdong bands (valley, flat, peak) in March 2026 at awkward
operator rates, and uses more than the pack holds, so the end of the month is arrears at the operators'
list prices. Every per-line amount then needs rounding, which is where pages used to differ by a fen.
"""

from __future__ import annotations

import csv
import io
from datetime import date, datetime
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from django.test import Client

from core.money import FEN, lines_total
from core.types import Actor
from federation.models import Cluster
from metering.models import Invoice, RatedSegment, Tariff
from metering.selectors.usage_dashboard import UsagePeriod, usage_dashboard_for
from metering.services.billing import billing_close_period
from metering.services.rating import usage_rate_pending
from metering.services.tariffs import price_card_set, tariff_presets_install
from metering.services.usage import usage_record_create_batch
from metering.types import UsageRecordInput
from tests.factories import BuyerFactory, MembershipFactory, OperatorFactory, UserFactory, make_cluster
from tests.metering.factories import make_paid_pack

SHANGHAI = ZoneInfo("Asia/Shanghai")
A800, H800 = "nvidia-a800-sxm4-80gb", "nvidia-h800-sxm5-80gb"


def sh(day: int, hour: int, minute: int = 0, month: int = 3) -> datetime:
    return datetime(2026, month, day, hour, minute, tzinfo=SHANGHAI)


def csv_rows(content: bytes) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(content.decode())))


@pytest.mark.django_db
def test_usage_csvs_and_invoice_agree_to_the_fen_for_a_standard_pack_buyer() -> None:
    tariff_presets_install()
    operator = OperatorFactory(slug="cucc", name="China Unicom")
    buyer = BuyerFactory(slug="acme", name="Acme AI")
    actor = Actor(organisation=operator, system_label="scenario")
    a800: Cluster = make_cluster(operator=operator, name="zw-ai01", accelerator=A800)
    h800: Cluster = make_cluster(operator=operator, name="zw-ai02", accelerator=H800)
    gd = Tariff.objects.get(code="cn-gd")
    for cluster, rate in ((a800, "10.3333"), (h800, "23.4567")):
        price_card_set(
            cluster=cluster, rate_per_card_hour=Decimal(rate), tariff=gd, effective_from=None, actor=actor
        )
    make_paid_pack(buyer=buyer, accelerator=None, card_hours=100, price="1234.56", paid_at=sh(20, 9, month=2))

    records = []
    for day in range(2, 12):  # 06:37–11:13: valley → flat → peak (10:00–12:00)
        records.append(UsageRecordInput(f"a-{day}", a800.cpi, "acme", 3, sh(day, 6, 37), sh(day, 11, 13), 1))
    for day in range(3, 9, 2):  # 13:17–15:41: flat → peak (14:00)
        records.append(UsageRecordInput(f"h-{day}", h800.cpi, "acme", 1, sh(day, 13, 17), sh(day, 15, 41), 1))
    now = sh(1, 3, month=4)
    assert usage_record_create_batch(operator=operator, records=records, now=now).created == len(records)
    assert usage_rate_pending(now=now) == len(records)

    segments = RatedSegment.objects.filter(usage_record__buyer=buyer)
    assert segments.filter(pack__isnull=True).exists()  # the pack ran out: some arrears
    assert segments.filter(pack__isnull=False).exists()
    assert set(segments.values_list("band", flat=True)) == {"valley", "flat", "peak"}
    assert set(segments.filter(pack__isnull=False).values_list("pack_class", flat=True)) == {"std"}

    # /usage/ for March, through the page, and its two CSVs.
    user = UserFactory(username="alice")
    MembershipFactory(user=user, organisation=buyer, role="owner")
    client = Client()
    client.force_login(user)
    march = {"from": "2026-03-01", "to": "2026-03-31"}
    page = client.get("/usage/", march)
    assert page.status_code == 200
    dashboard = page.context["dashboard"]
    direct = usage_dashboard_for(
        buyer=buyer, period=UsagePeriod(start_date=date(2026, 3, 1), end_date=date(2026, 3, 31))
    )
    assert (dashboard.lines, dashboard.spend) == (direct.lines, direct.spend)
    lines_csv = csv_rows(client.get("/usage/clusters.csv", march).content)
    days_csv = csv_rows(client.get("/usage.csv", march).content)

    # The month closes; the invoice's usage and arrears lines are the same lines.
    billing_close_period(period_start=date(2026, 3, 1), now=sh(1, 4, month=4))
    invoice = Invoice.objects.get(buyer=buyer, period_start=date(2026, 3, 1))
    invoice_lines = sorted(
        (line.cluster.cpi, line.band, line.kind == "arrears", line.card_seconds, line.amount)
        for line in invoice.lines.filter(kind__in=("usage", "arrears"))
    )
    csv_lines = sorted(
        (
            row["cluster"],
            row["band"],
            row["covered_by"] == "none",
            int(row["card_seconds"]),
            Decimal(row["spend_cny"]),
        )
        for row in lines_csv
    )
    assert csv_lines == invoice_lines

    # Totals: the page, the CSV and the invoice, to the fen.
    assert dashboard.spend_from_packs == invoice.usage_value
    assert dashboard.amount_due == invoice.arrears_amount == invoice.amount_due > 0
    assert dashboard.spend == invoice.usage_value + invoice.arrears_amount
    assert sum((Decimal(row["spend_cny"]) for row in lines_csv), Decimal("0.00")) == dashboard.spend
    assert sum(c.spend for c in dashboard.clusters) == dashboard.spend
    # The day-by-band CSV keeps the exact figures: its sum, exact, is the lines' exact sum.
    exact = sum((Decimal(row["spend_cny_exact"]) for row in days_csv), Decimal(0))
    assert exact == sum((Decimal(line.value_micros) / 1_000_000 for line in dashboard.lines), Decimal(0))
    # Rounding the exact total once would be a different rule: the lines' sum is the figure everywhere.
    assert dashboard.spend == lines_total(line.value_micros for line in dashboard.lines)
    # The operators' list price is shown too, labelled, and is not what the buyer pays.
    assert dashboard.list_price == sum(
        (Decimal(row["operator_list_price_cny"]) for row in lines_csv), Decimal("0.00")
    )
    assert dashboard.list_price != dashboard.spend

    html = page.content.decode()
    assert f'data-spend="{dashboard.spend}"' in html
    assert f'data-amount-due="{dashboard.amount_due}"' in html
    assert "At operators&#x27; list prices" in html or "At operators' list prices" in html
    assert dashboard.spend == dashboard.spend.quantize(FEN)
    # The figures. Checked by hand: H800 peak arrears = 1 card × 101 min × 3 days = 18,180 card-seconds ×
    # 23.4567 CNY/h × 1.7 = 201.3758 → 201.38; the covered lines add up to the whole pack's price, since
    # the pack was used up (1,234.56); 1,234.56 + 351.17 = 1,585.73.
    a, h = a800.cpi, h800.cpi
    assert invoice_lines == [
        (a, "flat", False, 203724, Decimal("544.94")),
        (a, "flat", True, 12276, Decimal("35.24")),
        (a, "peak", False, 118260, Decimal("537.76")),
        (a, "peak", True, 13140, Decimal("64.12")),
        (a, "valley", False, 149400, Decimal("151.86")),
        (h, "flat", True, 7740, Decimal("50.43")),
        (h, "peak", True, 18180, Decimal("201.38")),
    ]
    assert (dashboard.spend, dashboard.spend_from_packs, dashboard.amount_due, dashboard.list_price) == (
        Decimal("1585.73"),
        Decimal("1234.56"),
        Decimal("351.17"),
        Decimal("1675.95"),
    )
    assert "¥1,585.73" in html and "¥351.17" in html and "¥1,675.95" in html
