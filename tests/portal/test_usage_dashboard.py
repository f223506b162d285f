"""The buyer's usage and spend dashboard (/usage/) and its CSVs: exact figures from usage rated by the real
rating service, local-day bucketing, spend per cluster, the run-out forecast, isolation and permissions."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from core.models import Organisation
from federation.models import Cluster
from metering.models import LedgerAccount, Pack
from metering.selectors.usage_dashboard import (
    Outcome,
    UsagePeriod,
    usage_by_day_band,
    usage_dashboard_for,
    usage_forecast_for,
)
from metering.services.rating import usage_rate_pending
from metering.services.usage import usage_record_create_batch
from metering.types import UsageRecordInput
from tests.broker.factories import make_job, make_lease
from tests.metering.conftest import SHANGHAI, local
from tests.metering.factories import make_paid_pack

pytestmark = pytest.mark.django_db

A800 = "nvidia-a800-sxm4-80gb"
URL = "/usage/"


def report(cluster: Cluster, *records: tuple[str, int, datetime, datetime], buyer: str = "acme") -> list[int]:
    """Usage of ``cluster`` reported by its operator, priced with its first price card."""
    result = usage_record_create_batch(
        operator=cluster.operator,
        records=[
            UsageRecordInput(
                idempotency_key=key,
                cluster=cluster.cpi,
                buyer=buyer,
                cards=cards,
                start_at=start,
                end_at=end,
                price_card_version=1,
            )
            for key, cards, start, end in records
        ],
    )
    assert result.created == len(records)
    return [o.record_id for o in result.outcomes]


def day(days_ago: int) -> str:
    return (local(days_ago, 12)).date().isoformat()


@pytest.fixture
def used(buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster) -> Pack:
    """Acme's A800 pack (100 card-hours at 10 CNY) drawn by five rated pieces of usage:

    east (Guangdong tariff, 12 CNY): 4 cards 23:30–00:30 across local midnight three days ago (a flat half
    hour, then a valley half hour the next day), 2 cards in a peak hour two days ago;
    west (Ningxia tariff, 9 CNY): 8 cards in a flat hour two days ago, 1 card for a valley half hour
    yesterday.
    """
    pack = make_paid_pack(
        buyer=buyer, accelerator=A800, card_hours=100, price="1000.00", paid_at=local(20, 0)
    )
    report(
        east_cluster,
        ("midnight", 4, local(3, 23, 30), local(2, 0, 30)),
        ("peak", 2, local(2, 17), local(2, 18)),
    )
    report(
        west_cluster,
        ("flat", 8, local(2, 13), local(2, 14)),
        ("valley", 1, local(1, 23), local(1, 23, 30)),
    )
    assert usage_rate_pending() == 4
    return pack


def rows_of(response: object) -> list[list[str]]:
    return list(csv.reader(io.StringIO(response.content.decode())))  # type: ignore[attr-defined]


# --- Figures -------------------------------------------------------------------------------------------


def test_card_hours_per_band_per_day_are_exact(used: Pack, buyer: Organisation) -> None:
    rows = usage_by_day_band(buyer=buyer, period=UsagePeriod.default())
    assert [
        (r.day.isoformat(), r.band, r.pack_class, r.card_seconds, r.gross, r.pack_draw, r.arrears)
        for r in rows
    ] == [
        (day(3), "flat", A800, 7200, Decimal("24.000000"), Decimal("2.000000"), Decimal("0.000000")),
        (day(2), "valley", A800, 7200, Decimal("9.120000"), Decimal("0.760000"), Decimal("0.000000")),
        (day(2), "flat", A800, 28800, Decimal("72.000000"), Decimal("8.000000"), Decimal("0.000000")),
        (day(2), "peak", A800, 7200, Decimal("40.800000"), Decimal("3.400000"), Decimal("0.000000")),
        (day(1), "valley", A800, 1800, Decimal("2.250000"), Decimal("0.250000"), Decimal("0.000000")),
    ]


def test_a_segment_across_local_midnight_lands_on_two_days(
    buyer: Organisation, east_cluster: Cluster
) -> None:
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=10, price="100.00", paid_at=local(20, 0))
    report(east_cluster, ("m", 4, local(3, 23, 30), local(2, 0, 30)))
    usage_rate_pending()
    dashboard = usage_dashboard_for(buyer=buyer, period=UsagePeriod.default())
    by_day = {bar.day.isoformat(): bar.card_hours_by_band for bar in dashboard.days}
    assert by_day[day(3)] == {"flat": Decimal("2.000000")}
    assert by_day[day(2)] == {"valley": Decimal("2.000000")}
    assert len(dashboard.days) == 30 and dashboard.days[-1].day == local(0, 12).date()


def test_the_page_shows_the_totals_and_the_pack_balance_the_ledger_holds(
    used: Pack, buyer_client: Client
) -> None:
    response = buyer_client.get(URL)
    assert response.status_code == 200
    page = response.content.decode()
    dashboard = response.context["dashboard"]
    assert dashboard.card_hours == Decimal("14.500000")
    # What the buyer pays: 14.41 A800 card-hours drawn from a pack bought at 10 CNY each; the operators'
    # gross (their list prices) is shown beside it, labelled.
    assert (dashboard.spend, dashboard.spend_from_packs, dashboard.amount_due) == (
        Decimal("144.10"),
        Decimal("144.10"),
        Decimal("0.00"),
    )
    assert dashboard.list_price == Decimal("148.17")
    assert [(c.class_key, c.card_hours) for c in dashboard.drawn_by_class] == [(A800, Decimal("14.410000"))]
    assert dashboard.arrears_by_class == []
    # The balance shown is the pack's ledger account, down by exactly what rating drew.
    balance = LedgerAccount.objects.get(pack=used).balance
    assert balance == 100_000_000 - 14_410_000
    (forecast,) = response.context["forecasts"]
    assert forecast.remaining == Decimal("85.590000")
    for text in (
        "14.50",
        "¥144.10",
        "At operators' list prices",
        "¥148.17",
        "14.41",
        "85.59",
        "<svg",
        "Valley",  # the band by its name (core.charts.BAND_LABELS)
    ):
        assert text in page, text


def test_spend_per_cluster_is_exact_and_sorted_by_spend(
    used: Pack, buyer_client: Client, east_cluster: Cluster, west_cluster: Cluster
) -> None:
    response = buyer_client.get(URL)
    clusters = response.context["dashboard"].clusters
    assert [(c.cpi, c.chip, c.card_seconds, c.card_hours, c.spend, c.list_price) for c in clusters] == [
        (west_cluster.cpi, A800, 30600, Decimal("8.500000"), Decimal("82.50"), Decimal("74.25")),
        (east_cluster.cpi, A800, 21600, Decimal("6.000000"), Decimal("61.60"), Decimal("73.92")),
    ]
    page = response.content.decode()
    assert page.index("¥82.50") < page.index("¥61.60")


def test_a_cluster_filter_narrows_every_figure(
    used: Pack, buyer_client: Client, east_cluster: Cluster
) -> None:
    response = buyer_client.get(URL, {"cluster": east_cluster.pk})
    dashboard = response.context["dashboard"]
    assert dashboard.card_hours == Decimal("6.000000")
    assert (dashboard.spend, dashboard.list_price) == (Decimal("61.60"), Decimal("73.92"))
    assert [c.cpi for c in dashboard.clusters] == [east_cluster.cpi]


def test_a_period_filter_counts_only_its_days(used: Pack, buyer_client: Client) -> None:
    response = buyer_client.get(URL, {"from": day(2), "to": day(2)})
    dashboard = response.context["dashboard"]
    assert [bar.day.isoformat() for bar in dashboard.days] == [day(2)]
    assert dashboard.card_hours == Decimal("12.000000")  # 2 valley + 8 flat + 2 peak
    assert (dashboard.spend, dashboard.list_price) == (Decimal("121.60"), Decimal("121.92"))


def test_unrated_usage_is_announced(used: Pack, buyer_client: Client, east_cluster: Cluster) -> None:
    report(east_cluster, ("late", 3, local(1, 12), local(1, 13)))
    response = buyer_client.get(URL)
    unrated = response.context["dashboard"].unrated
    assert (unrated.records, unrated.card_seconds, unrated.card_hours) == (1, 10800, Decimal("3.000000"))
    assert "1 usage record (3.00 card-hours)" in response.content.decode()
    # The rated figures are unchanged until it is rated.
    assert response.context["dashboard"].card_hours == Decimal("14.500000")


# --- Forecast ------------------------------------------------------------------------------------------


def test_the_run_out_date_at_the_trailing_rate_is_exact(
    buyer: Organisation, east_cluster: Cluster, buyer_client: Client
) -> None:
    """7 A800 card-hours drawn in the last 7 days = 1 a day; 93 left → they run out in 93 days."""
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=100, price="1000.00", paid_at=local(20, 0))
    report(east_cluster, ("flat", 7, local(2, 12), local(2, 13)))
    usage_rate_pending()
    now = local(0, 12)
    (forecast,) = usage_forecast_for(buyer=buyer, now=now)
    assert (forecast.remaining, forecast.drawn_trailing, forecast.rate_per_day) == (
        Decimal("93.000000"),
        Decimal("7.000000"),
        Decimal("1.000000"),
    )
    assert (forecast.outcome, forecast.outcome_on, forecast.outcome_in_days, forecast.unused) == (
        Outcome.RUNS_OUT,
        (now + timedelta(days=93)).date(),
        93,
        Decimal("0.000000"),
    )

    page = buyer_client.get(URL).content.decode()
    on = (local(0, 12) + timedelta(days=93)).date().isoformat()
    assert f"Runs out on {on} (in 93 days) at the current rate." in page
    assert "expire unused" not in page and "go unused" not in page
    assert "last 7 days ÷ 7" in page


def test_a_pack_expiring_before_it_is_used_up_is_flagged(buyer: Organisation, east_cluster: Cluster) -> None:
    """The 30-day pack (drawn first) keeps 93 card-hours but expires in 19.5 days at 1 a day: 73.5 are
    lost, then the 50-hour pack lasts 50 days from that expiry."""
    soon = make_paid_pack(
        buyer=buyer, accelerator=A800, card_hours=100, price="1000.00", paid_at=local(10, 0), validity_days=30
    )
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=50, price="500.00", paid_at=local(10, 0))
    report(east_cluster, ("flat", 7, local(2, 12), local(2, 13)))
    usage_rate_pending()
    now = local(0, 12)
    (forecast,) = usage_forecast_for(buyer=buyer, now=now)
    assert forecast.remaining == Decimal("143.000000")
    flagged = [row for row in forecast.pack_rows if row.unused_at_expiry_micros]
    assert [(row.pack, row.unused_at_expiry) for row in flagged] == [(soon, Decimal("73.500000"))]
    # One message: the card-hours run out on day 70, and 73.5 of the first pack are lost on the way.
    assert (forecast.outcome, forecast.outcome_on, forecast.unused) == (
        Outcome.RUNS_OUT,
        (local(0, 0) + timedelta(days=70)).date(),
        Decimal("73.500000"),
    )


def test_a_last_pack_expiring_unused_never_says_it_runs_out(
    buyer: Organisation, east_cluster: Cluster, buyer_client: Client
) -> None:
    """The issue's contradiction ("runs out on D" beside "191 unused at expiry"): a 30-day pack of 100
    drawn 1 a day keeps 93 − 19.5 = 73.5 at its expiry. The forecast says only that those expire unused,
    on the pack's expiry date."""
    pack = make_paid_pack(
        buyer=buyer, accelerator=A800, card_hours=100, price="1000.00", paid_at=local(10, 0), validity_days=30
    )
    report(east_cluster, ("flat", 7, local(2, 12), local(2, 13)))
    usage_rate_pending()
    (forecast,) = usage_forecast_for(buyer=buyer, now=local(0, 12))
    expires_on = pack.expires_at.astimezone(SHANGHAI).date()
    assert (forecast.outcome, forecast.outcome_on, forecast.unused, forecast.runs_out_on) == (
        Outcome.EXPIRES_UNUSED,
        expires_on,
        Decimal("73.500000"),
        None,
    )
    page = buyer_client.get(URL).content.decode()
    assert "Runs out" not in page
    assert f"card-hours will expire unused, the last on {expires_on.isoformat()}." in page


def test_reserved_leases_are_set_aside_first(
    buyer: Organisation, east_cluster: Cluster, buyer_client: Client
) -> None:
    """93 left, 20 of them reserved by a lease that has not started: the other 73 at 1 a day last 73 days."""
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=100, price="1000.00", paid_at=local(20, 0))
    report(east_cluster, ("flat", 7, local(2, 12), local(2, 13)))
    usage_rate_pending()
    start = timezone.now().replace(microsecond=0) + timedelta(days=1)
    make_lease(job=make_job(buyer=buyer), cluster=east_cluster, start_at=start, expected_draw="20")
    now = timezone.now()
    (forecast,) = usage_forecast_for(buyer=buyer, now=now)
    assert (forecast.remaining, forecast.reserved, forecast.outcome, forecast.outcome_on) == (
        Decimal("93.000000"),
        Decimal("20.000000"),
        Outcome.RUNS_OUT,
        (now + timedelta(days=73)).astimezone(SHANGHAI).date(),
    )
    page = buyer_client.get(URL).content.decode()
    assert "Reserved leases will draw 20.00." in page


def test_reserved_leases_needing_more_than_is_left_say_so(
    buyer: Organisation, east_cluster: Cluster, buyer_client: Client
) -> None:
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=10, price="100.00", paid_at=local(20, 0))
    start = timezone.now().replace(microsecond=0) + timedelta(hours=2)
    make_lease(job=make_job(buyer=buyer), cluster=east_cluster, start_at=start, expected_draw="16")
    (forecast,) = usage_forecast_for(buyer=buyer)
    assert (forecast.reserved, forecast.outcome, forecast.outcome_on) == (
        Decimal("10.000000"),  # what the packs can give it; the rest would be arrears
        Outcome.RESERVED_EXCEED,
        None,
    )
    assert "Your reserved leases need more than is left" in buyer_client.get(URL).content.decode()


def test_no_recent_use_says_so(funded_buyer: Organisation, buyer_client: Client) -> None:
    response = buyer_client.get(URL)
    assert [(f.class_key, f.recent_use, f.outcome, f.runs_out_on) for f in response.context["forecasts"]] == [
        ("std", False, Outcome.IDLE, None),
        (A800, False, Outcome.IDLE, None),
    ]
    assert "No recent use" in response.content.decode()


# --- CSV -----------------------------------------------------------------------------------------------


def test_the_day_band_csv_has_the_exact_values(used: Pack, buyer_client: Client) -> None:
    response = buyer_client.get(reverse("usage-csv"))
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert rows_of(response) == [
        [
            "date",
            "band",
            "pack_class",
            "card_seconds",
            "card_hours",
            "pack_draw_card_hours",
            "arrears_card_hours",
            "spend_cny_exact",
            "operator_list_price_cny_exact",
        ],
        [day(3), "flat", A800, "7200", "2.000000", "2.000000", "0.000000", "20.000000", "24.000000"],
        [day(2), "valley", A800, "7200", "2.000000", "0.760000", "0.000000", "7.600000", "9.120000"],
        [day(2), "flat", A800, "28800", "8.000000", "8.000000", "0.000000", "80.000000", "72.000000"],
        [day(2), "peak", A800, "7200", "2.000000", "3.400000", "0.000000", "34.000000", "40.800000"],
        [day(1), "valley", A800, "1800", "0.500000", "0.250000", "0.000000", "2.500000", "2.250000"],
    ]


def test_the_cluster_csv_matches_the_page(
    used: Pack, buyer_client: Client, east_cluster: Cluster, west_cluster: Cluster
) -> None:
    response = buyer_client.get(reverse("usage-cluster-csv"), {"from": day(3), "to": day(1)})
    header = [
        "cluster",
        "band",
        "pack_class",
        "covered_by",
        "card_seconds",
        "card_hours",
        "pack_draw_card_hours",
        "spend_cny",
        "operator_list_price_cny",
    ]
    # One row per statement line (cluster × band × pack class × covered?), in an invoice's order.
    assert rows_of(response) == [
        header,
        [east_cluster.cpi, "peak", A800, "pack", "7200", "2.000000", "3.400000", "34.00", "40.80"],
        [east_cluster.cpi, "flat", A800, "pack", "7200", "2.000000", "2.000000", "20.00", "24.00"],
        [east_cluster.cpi, "valley", A800, "pack", "7200", "2.000000", "0.760000", "7.60", "9.12"],
        [west_cluster.cpi, "flat", A800, "pack", "28800", "8.000000", "8.000000", "80.00", "72.00"],
        [west_cluster.cpi, "valley", A800, "pack", "1800", "0.500000", "0.250000", "2.50", "2.25"],
    ]
    page = buyer_client.get(URL, {"from": day(3), "to": day(1)}).context["dashboard"]
    assert sum(Decimal(row[7]) for row in rows_of(response)[1:]) == page.spend == Decimal("144.10")


def test_a_csv_with_a_bad_filter_is_a_400(buyer_client: Client) -> None:
    response = buyer_client.get(reverse("usage-csv"), {"from": "2026-02-30"})
    assert response.status_code == 400
    assert b"from" in response.content


# --- Bad input -----------------------------------------------------------------------------------------


def test_an_end_before_the_start_is_an_error_beside_the_field(buyer_client: Client) -> None:
    response = buyer_client.get(URL, {"from": "2026-11-10", "to": "2026-11-01"})
    assert response.status_code == 200
    assert response.context["dashboard"] is None
    assert response.context["form"].errors == {"to": ["The end date is before the start date."]}
    assert "The end date is before the start date." in response.content.decode()


def test_a_period_over_a_year_is_refused(buyer_client: Client) -> None:
    response = buyer_client.get(URL, {"from": "2025-01-01", "to": "2026-11-01"})
    assert list(response.context["form"].errors) == ["from"]


def test_another_buyers_cluster_is_not_a_choice(
    buyer_client: Client, other_buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster
) -> None:
    """Globex used the west cluster; Acme only the east one: filtering on the west one is refused."""
    report(west_cluster, ("g", 2, local(2, 13), local(2, 14)), buyer="globex")
    report(east_cluster, ("a", 2, local(2, 13), local(2, 14)))
    response = buyer_client.get(URL, {"cluster": west_cluster.pk})
    assert response.status_code == 200
    assert "cluster" in response.context["form"].errors
    assert west_cluster.cpi not in response.content.decode()


# --- Isolation and permissions ---------------------------------------------------------------------------


def test_another_buyers_usage_never_appears(
    used: Pack,
    other_buyer: Organisation,
    other_buyer_client: Client,
    buyer_client: Client,
    east_cluster: Cluster,
) -> None:
    report(east_cluster, ("globex", 10, local(2, 3), local(2, 4)), buyer="globex")  # no pack: arrears
    usage_rate_pending()
    mine = buyer_client.get(URL).context["dashboard"]
    assert mine.card_hours == Decimal("14.500000") and mine.arrears_by_class == []
    theirs = other_buyer_client.get(URL)
    dashboard = theirs.context["dashboard"]
    assert dashboard.card_hours == Decimal("10.000000")
    assert [(a.class_key, a.card_hours) for a in dashboard.arrears_by_class] == [(A800, Decimal("3.800000"))]
    assert theirs.context["forecasts"] == []
    assert "zw-ai01" not in theirs.content.decode()
    assert rows_of(other_buyer_client.get(reverse("usage-csv")))[1:] == [
        [day(2), "valley", A800, "36000", "10.000000", "0.000000", "3.800000", "45.600000", "45.600000"]
    ]


@pytest.mark.parametrize("name", ["usage-dashboard", "usage-csv", "usage-cluster-csv"])
def test_an_operator_is_refused(operator_client: Client, name: str) -> None:
    assert operator_client.get(reverse(name)).status_code == 403


@pytest.mark.parametrize("name", ["usage-dashboard", "usage-csv", "usage-cluster-csv"])
def test_an_anonymous_visitor_is_sent_to_log_in(client: Client, name: str) -> None:
    response = client.get(reverse(name))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_a_viewer_may_read_it(buyer_viewer: User, login: Callable[[User], Client], used: Pack) -> None:
    assert login(buyer_viewer).get(URL).status_code == 200


# --- Queries -------------------------------------------------------------------------------------------


def test_the_query_count_does_not_grow_with_usage(
    buyer: Organisation,
    east_cluster: Cluster,
    west_cluster: Cluster,
    buyer_client: Client,
    django_assert_max_num_queries: Callable[..., AbstractContextManager[object]],
) -> None:
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=10_000, price="90000.00", paid_at=local(30, 0))
    make_paid_pack(buyer=buyer, accelerator=None, card_hours=1000, price="12000.00", paid_at=local(30, 0))
    records = []
    for days_ago in range(1, 21):
        for hour in range(0, 24, 2):
            start = local(days_ago, hour)
            records.append((f"r-{days_ago}-{hour}", 2, start, start + timedelta(hours=2)))
    report(east_cluster, *records)
    report(west_cluster, *((f"w{key}", cards, s, e) for key, cards, s, e in records[:120]))
    # Yesterday evening, local time: always past, always inside the default period (today's 00:00-00:30
    # was still in the future for the first half hour of each Shanghai day, and the batch refused it).
    report(east_cluster, ("unrated", 1, local(1, 23), local(1, 23, 30)))
    usage_rate_pending(max_batches=1, batch_size=360)
    dashboard = buyer_client.get(URL).context["dashboard"]
    assert dashboard.unrated.records == 1 and len(dashboard.rows) >= 60
    with django_assert_max_num_queries(12):
        response = buyer_client.get(URL)
    assert response.status_code == 200
    with django_assert_max_num_queries(6):
        buyer_client.get(reverse("usage-csv"))


def test_days_are_local_to_shanghai() -> None:
    period = UsagePeriod.default(now=datetime(2026, 11, 21, 16, 30, tzinfo=SHANGHAI).astimezone(SHANGHAI))
    assert (period.start_date.isoformat(), period.end_date.isoformat()) == ("2026-10-23", "2026-11-21")
    assert period.starts_at.utcoffset() == timedelta(hours=8)
    assert period.ends_at.isoformat() == "2026-11-22T00:00:00+08:00"
