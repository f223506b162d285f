"""Operator earnings and settlements: figures exact against usage rated by the real rating service and equal
to what the settlement then states; settlement pages and their CSV/PDF downloads (the API's bytes).

Time is pinned: "now" is 20 March 2026, noon in Shanghai. Cluster A is on Guangdong's tariff (valley 0.38,
flat 1, peak 1.7) at 7.7777 CNY per card-hour, cluster B on the flat preset at 10; commission is 10%.
February is settled; March is open, and has a late record for February that the March settlement takes.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, datetime
from decimal import ROUND_HALF_EVEN, Decimal
from fractions import Fraction
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from reportlab import rl_config
from rest_framework.test import APIClient

from core.models import Organisation
from federation.models import Cluster
from metering.models import PriceCard, Settlement, Tariff
from metering.services.billing import billing_close_period
from metering.services.rating import usage_rate_pending
from metering.services.usage import usage_record_create_batch
from metering.types import UsageRecordInput
from tests.factories import make_cluster

pytestmark = pytest.mark.django_db

SH = ZoneInfo("Asia/Shanghai")
NOW = datetime(2026, 3, 20, 12, 0, tzinfo=SH)
RATE_A, RATE_B = Fraction("7.7777"), Fraction(10)
MULTIPLIER = {"valley": Fraction("0.38"), "flat": Fraction(1), "peak": Fraction("1.7")}


def sh(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=SH)


def fen(value: Fraction) -> Decimal:
    return (Decimal(value.numerator) / Decimal(value.denominator)).quantize(Decimal("0.01"), ROUND_HALF_EVEN)


def expected_line(cpi: str, band: str, prior: bool, card_seconds: int, rate: Fraction) -> tuple[Any, ...]:
    """(cpi, band, prior, card-seconds, gross, commission, payable), computed independently."""
    gross = rate * card_seconds * MULTIPLIER[band] / 3600
    g, c = fen(gross), fen(gross / 10)
    return (cpi, band, prior, card_seconds, g, c, g - c)


def line_tuple(line: Any) -> tuple[Any, ...]:
    cpi = line.cpi if hasattr(line, "cpi") else line.cluster.cpi
    prior = line.prior_period
    return (cpi, line.band, prior, line.card_seconds, line.gross, line.commission, line.payable)


def price_card(cluster: Cluster, *, rate: str, tariff_code: str) -> PriceCard:
    """A card in force since 2025 (the service refuses a start in the past, so it is written here)."""
    tariff = Tariff.objects.get(code=tariff_code, owner__isnull=True)
    return PriceCard.objects.create(
        cluster=cluster,
        version=1,
        rate_per_card_hour=Decimal(rate),
        tariff_version=tariff.versions.get(version=1),
        effective_from=sh(2025, 1, 1),
    )


def report_and_rate(operator: Organisation, records: list[UsageRecordInput], *, at: datetime) -> None:
    result = usage_record_create_batch(operator=operator, records=records, now=at)
    assert result.created == len(records)
    assert usage_rate_pending(now=at) == len(records)


class World:
    def __init__(self, operator: Organisation, other: Organisation, buyer: Organisation) -> None:
        self.operator = operator
        self.a = make_cluster(operator=operator, hub="yrd", name="sh-gd01", islands=[("isl-01", 16)])
        self.b = make_cluster(operator=operator, hub="yrd", name="sh-fl01", islands=[("isl-01", 16)])
        price_card(self.a, rate="7.7777", tariff_code="cn-gd")
        price_card(self.b, rate="10.0000", tariff_code="flat")
        self.other_cluster = make_cluster(operator=other, hub="nx", name="zw-x01", islands=[("isl-01", 8)])
        price_card(self.other_cluster, rate="9.0000", tariff_code="flat")
        # February: 2 cards on A, 10:00–11:00 peak; then February is closed and settled.
        report_and_rate(
            operator,
            [UsageRecordInput("f1", self.a.cpi, buyer.slug, 2, sh(2026, 2, 10, 10), sh(2026, 2, 10, 11))],
            at=sh(2026, 2, 28, 12),
        )
        report_and_rate(
            other,
            [UsageRecordInput("o1", self.other_cluster.cpi, buyer.slug, 8, sh(2026, 2, 11), sh(2026, 2, 12))],
            at=sh(2026, 2, 28, 12),
        )
        billing_close_period(period_start=date(2026, 2, 1), now=sh(2026, 3, 1, 0, 30))
        self.february = Settlement.objects.get(operator=operator, period_start=date(2026, 2, 1))
        self.other_settlement = Settlement.objects.get(operator=other)
        # March so far, and a February record reported late (after February was settled).
        report_and_rate(
            operator,
            [
                # 3 cards 07:30–08:20:34 on A: 30 min valley, 20 min 34 s flat.
                UsageRecordInput(
                    "m1", self.a.cpi, buyer.slug, 3, sh(2026, 3, 10, 7, 30), sh(2026, 3, 10, 8, 20, 34)
                ),
                # 4 cards 10:00–12:00 on B (flat tariff).
                UsageRecordInput("m2", self.b.cpi, buyer.slug, 4, sh(2026, 3, 15, 10), sh(2026, 3, 15, 12)),
                # Late: 1 card 20:00–21:00 on 20 February on A (flat).
                UsageRecordInput("f2", self.a.cpi, buyer.slug, 1, sh(2026, 2, 20, 20), sh(2026, 2, 20, 21)),
            ],
            at=sh(2026, 3, 20, 11),
        )
        report_and_rate(
            other,
            [UsageRecordInput("o2", self.other_cluster.cpi, buyer.slug, 8, sh(2026, 3, 11), sh(2026, 3, 12))],
            at=sh(2026, 3, 20, 11),
        )


@pytest.fixture
def world(
    east_operator: Organisation,
    west_operator: Organisation,
    buyer: Organisation,
    presets: None,
    monkeypatch: Any,
) -> World:
    built = World(east_operator, west_operator, buyer)
    monkeypatch.setattr(timezone, "now", lambda: NOW)
    return built


def march_expected(world: World) -> list[tuple[Any, ...]]:
    return [
        expected_line(world.b.cpi, "flat", False, 4 * 7200, RATE_B),
        expected_line(world.a.cpi, "flat", False, 3 * 1234, RATE_A),
        expected_line(world.a.cpi, "valley", False, 3 * 1800, RATE_A),
        expected_line(world.a.cpi, "flat", True, 1 * 3600, RATE_A),
    ]


def test_earnings_are_exact_and_equal_the_settlement_that_follows(
    operator_client: Client, world: World
) -> None:
    response = operator_client.get(reverse("operator-earnings"))
    assert response.status_code == 200
    current = response.context["current"]
    assert current.period_start == date(2026, 3, 1) and current.is_open
    shown = sorted(line_tuple(line) for line in current.lines)
    assert shown == sorted(march_expected(world))

    # By cluster and by band: sums of the lines, as the statement adds them up.
    by_cluster = {
        row.key: (row.card_seconds, row.gross, row.commission, row.payable) for row in current.by_cluster
    }
    a_lines = [e for e in march_expected(world) if e[0] == world.a.cpi]
    assert by_cluster[world.a.cpi] == (
        sum(e[3] for e in a_lines),
        sum(e[4] for e in a_lines),
        sum(e[5] for e in a_lines),
        sum(e[6] for e in a_lines),
    )
    by_band = {row.key: row.payable for row in current.by_band}
    flat_lines = [e for e in march_expected(world) if e[1] == "flat"]
    assert by_band == {"flat": sum(e[6] for e in flat_lines), "valley": march_expected(world)[2][6]}
    total = current.total
    assert total.payable == sum(e[6] for e in march_expected(world))
    html = response.content.decode()
    assert f"¥{total.payable:,}" in html and f"¥{total.gross:,}" in html
    assert "late, earlier month" in html

    # The chart: March 10 (valley and flat on A) and March 15 (flat on B); nothing of the other operator.
    days = {d.day: d for d, _ in response.context["days"]}
    assert set(days) == {date(2026, 3, 10), date(2026, 3, 15)}
    assert days[date(2026, 3, 15)].payable_by_band == {"flat": Decimal("72.00")}
    assert days[date(2026, 3, 10)].card_hours == Decimal(3 * 3034) / 3600
    assert response.context["series"] == ["valley", "flat"]
    assert 'class="chart stacked-bars"' in html

    # The month closes: the settlement states exactly the figures the page showed.
    billing_close_period(period_start=date(2026, 3, 1), now=sh(2026, 4, 1, 0, 30))
    march = Settlement.objects.get(operator=world.operator, period_start=date(2026, 3, 1))
    assert sorted(line_tuple(line) for line in march.lines.all()) == shown
    assert (march.gross, march.commission, march.payable) == (total.gross, total.commission, total.payable)


def test_a_settled_month_is_read_from_its_settlement(operator_client: Client, world: World) -> None:
    response = operator_client.get(reverse("operator-earnings"), {"period": "2026-02"})
    selected = response.context["selected"]
    assert selected.settlement == world.february
    assert [line_tuple(line) for line in selected.lines] == [
        expected_line(world.a.cpi, "peak", False, 2 * 3600, RATE_A)
    ]
    assert (world.february.gross, world.february.payable) == (Decimal("26.44"), Decimal("23.80"))
    html = response.content.decode()
    assert world.february.number in html
    assert reverse("operator-settlement-pdf", args=[world.february.pk]) in html
    # The settlements list holds only this operator's.
    assert [s.pk for s in response.context["settlements"]] == [world.february.pk]
    assert world.other_settlement.number not in html


def test_an_unknown_or_bad_period_shows_the_current_month(operator_client: Client, world: World) -> None:
    for value in ("2025-01", "nonsense", "2026-13"):
        response = operator_client.get(reverse("operator-earnings"), {"period": value})
        assert response.status_code == 200
        assert response.context["selected"].period_start == date(2026, 3, 1)


def test_an_operator_with_no_usage_sees_zero(login: Callable[..., Client], presets: None) -> None:
    from tests.factories import MembershipFactory, OperatorFactory, UserFactory

    user = UserFactory(username="nina")
    MembershipFactory(user=user, organisation=OperatorFactory(slug="newco"))
    response = login(user).get(reverse("operator-earnings"))
    assert response.status_code == 200
    assert response.context["current"].total.payable == Decimal("0.00")
    assert "No settlement issued yet" in response.content.decode()


def test_settlement_detail_shows_its_lines(operator_client: Client, world: World) -> None:
    response = operator_client.get(reverse("operator-settlement-detail", args=[world.february.pk]))
    assert response.status_code == 200
    html = response.content.decode()
    assert world.february.number in html
    assert "¥23.80" in html and "¥26.44" in html and "¥2.64" in html
    assert world.a.cpi in html and "7200" in html


def test_downloads_are_the_apis_bytes(
    operator_client: Client, world: World, token_client: Callable[[Organisation], APIClient], monkeypatch: Any
) -> None:
    monkeypatch.setattr(rl_config, "invariant", 1)  # no creation time or random id: comparable PDFs
    api = token_client(world.operator)
    pk = world.february.pk
    for kind, suffix in (("csv", ".csv"), ("pdf", ".pdf")):
        portal = operator_client.get(reverse(f"operator-settlement-{kind}", args=[pk]))
        rest = api.get(f"/api/v1/settlements/{pk}{suffix}")
        assert portal.status_code == rest.status_code == 200
        assert portal.content == rest.content, kind
        assert portal["Content-Type"] == rest["Content-Type"]
        assert portal["Content-Disposition"] == rest["Content-Disposition"]
        assert portal["Content-Disposition"] == f'attachment; filename="STL-202602-ctyun.{kind}"'


def test_another_operators_settlement_is_404(operator_client: Client, world: World) -> None:
    pk = world.other_settlement.pk
    for name in ("operator-settlement-detail", "operator-settlement-csv", "operator-settlement-pdf"):
        assert operator_client.get(reverse(name, args=[pk])).status_code == 404, name
        assert operator_client.get(reverse(name, args=[987_654])).status_code == 404, name


def test_anonymous_and_buyers_are_kept_out(buyer_client: Client, world: World) -> None:
    urls = [
        reverse("operator-earnings"),
        reverse("operator-settlement-detail", args=[world.february.pk]),
        reverse("operator-settlement-csv", args=[world.february.pk]),
        reverse("operator-settlement-pdf", args=[world.february.pk]),
    ]
    for url in urls:
        response = Client().get(url)
        assert response.status_code == 302 and response["Location"].startswith(reverse("login")), url
        assert buyer_client.get(url).status_code == 403, url


def test_earnings_query_count_does_not_grow_with_settlements(
    operator_client: Client, world: World, django_assert_max_num_queries: Any
) -> None:
    for n in range(60):
        year, month = divmod(2020 * 12 + n, 12)
        Settlement.objects.create(
            operator=world.operator,
            period_start=date(year, month + 1, 1),
            period_end=date(year + (month + 1) // 12, (month + 1) % 12 + 1, 1),
            number=f"STL-old-{n}",
            gross=Decimal("10.00"),
            commission=Decimal("1.00"),
            payable=Decimal("9.00"),
            issued_at=sh(2026, 1, 1),
        )
    with django_assert_max_num_queries(14):
        response = operator_client.get(reverse("operator-earnings"))
    assert response.status_code == 200
    assert len(response.context["settlements"].object_list) == 50
