"""The staff dashboard: who may open it, the federation matrix, utilisation, revenue by band from the rated
segments, offline clusters and the ledger reconciliation status."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db.models import Sum
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from core.models import Organisation
from core.money import from_micros
from core.types import Actor
from federation.models import Cluster
from federation.services import cluster_status_set
from metering.models import RatedSegment, ReconciliationRun
from metering.services.rating import usage_rate_pending
from metering.services.usage import usage_record_create_batch
from metering.types import UsageRecordInput
from tests.broker.factories import make_job, make_lease
from tests.factories import make_cluster
from tests.metering.conftest import local

URL = "/staff/"
H800 = "nvidia-h800-sxm5-80gb"


@pytest.fixture
def world(east_cluster: Cluster, west_cluster: Cluster, west_operator: Organisation) -> dict[str, Cluster]:
    """East: 16 A800 in yrd. West: 64 A800 in nx. Plus 24 H800 in nx."""
    h800 = make_cluster(
        operator=west_operator, hub="nx", name="zw-h800", accelerator=H800, islands=[("isl-01", 24)]
    )
    return {"east": east_cluster, "west": west_cluster, "h800": h800}


def test_staff_sees_the_dashboard(staff_client: Client, world: dict[str, Cluster]) -> None:
    response = staff_client.get(URL)
    assert response.status_code == 200
    assert response.templates[0].name == "staff/dashboard.html"


def test_anonymous_is_sent_to_log_in(client: Client) -> None:
    response = client.get(URL)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


@pytest.mark.parametrize("who", ["buyer_client", "operator_client"])
def test_non_staff_are_refused(who: str, request: pytest.FixtureRequest) -> None:
    client: Client = request.getfixturevalue(who)
    assert client.get(URL).status_code == 403
    assert client.post(reverse("staff-reconcile")).status_code == 403
    assert not ReconciliationRun.objects.exists()


def test_matrix_totals_are_exact(staff_client: Client, world: dict[str, Cluster]) -> None:
    cluster_status_set(
        actor=Actor.system("test"), cluster=world["east"], status="offline", reason="maintenance"
    )  # offline cards are still federated
    matrix = staff_client.get(URL).context["capacity"].matrix

    assert matrix.hubs == [("yrd", "Yangtze River Delta"), ("nx", "Ningxia")]
    assert [slug for slug, _ in matrix.chips] == ["nvidia-a800-sxm4-80gb", H800]
    assert matrix.rows()[0][2:] == ([16, 64], 80)
    assert matrix.rows()[1][2:] == ([0, 24], 24)
    assert matrix.column_totals() == [16, 88]
    assert matrix.total == 104


def test_utilisation_now_counts_live_holds_of_sellable_clusters(
    staff_client: Client, buyer: Organisation, world: dict[str, Cluster]
) -> None:
    make_lease(job=make_job(buyer=buyer, cards=8), cluster=world["west"], start_at=timezone.now())
    make_lease(
        job=make_job(buyer=buyer, cards=8),
        cluster=world["east"],
        start_at=timezone.now() + timedelta(hours=2),
    )  # not yet
    response = staff_client.get(URL)
    utilisation = response.context["capacity"].utilisation

    assert (utilisation.overall.held_cards, utilisation.overall.sellable_cards) == (8, 104)
    assert utilisation.overall.utilisation == Decimal("0.0769")
    assert {t.key: (t.held_cards, t.sellable_cards) for t in utilisation.by_hub} == {
        "yrd": (0, 16),
        "nx": (8, 88),
    }
    # The hour in progress on the 7-day line averages the lease's minutes in it.
    assert response.context["utilisation_line"].count("<circle") == 7 * 24


def test_utilisation_line_averages_holds_per_hour(buyer: Organisation, world: dict[str, Cluster]) -> None:
    from broker.market import utilisation_hourly

    now = timezone.now().replace(minute=30, second=0, microsecond=0)
    start = now - timedelta(hours=3)  # hh-3:30 → hh:30, 8 cards
    make_lease(job=make_job(buyer=buyer, cards=8), cluster=world["west"], start_at=start, end_at=now)
    points = utilisation_hourly(end=now, hours=5, sellable_cards=104)

    assert [p.held_cards for p in points] == [
        Decimal("0"),
        Decimal("4"),  # half of the hour
        Decimal("8"),
        Decimal("8"),
        Decimal("8"),  # the hour in progress (30 min so far), held throughout
    ]
    assert points[2].utilisation == Decimal("0.0769")


def _rate_usage(west_operator: Organisation) -> None:
    usage_record_create_batch(
        operator=west_operator,
        records=[
            UsageRecordInput(
                idempotency_key=key,
                cluster="cpi:cucc:nx:zw-ai01",
                buyer="acme",
                cards=cards,
                start_at=start,
                end_at=end,
                price_card_version=1,
            )
            for key, cards, start, end in [
                ("r-1", 8, local(3, 6), local(3, 12)),
                ("r-2", 4, local(3, 17), local(3, 23)),
            ]
        ],
    )
    assert usage_rate_pending() == 2


def test_revenue_by_band_equals_the_rated_segments(
    staff_client: Client, funded_buyer: Organisation, west_operator: Organisation, world: dict[str, Cluster]
) -> None:
    _rate_usage(west_operator)
    month = local(3, 6).date().replace(day=1)
    response = staff_client.get(URL, {"month": month.strftime("%Y-%m")})
    revenue = response.context["revenue"]

    expected = {
        row["band"]: (from_micros(row["g"]), from_micros(row["c"]))
        for row in RatedSegment.objects.values("band").annotate(g=Sum("gross"), c=Sum("commission"))
    }
    assert len(expected) >= 2
    assert {b.band: (b.gross, b.commission) for b in revenue.by_band} == expected
    assert revenue.gross == sum((g for g, _ in expected.values()), Decimal(0))
    total_gross = RatedSegment.objects.aggregate(t=Sum("gross"))["t"]
    assert revenue.gross == from_micros(total_gross)
    per_day_total = sum((v for day in revenue.per_day.values() for v in day.values()), Decimal(0))
    assert per_day_total == revenue.gross
    assert f"¥{revenue.gross.quantize(Decimal('0.01')):,}" in response.content.decode()


def test_revenue_of_another_month_is_not_counted(
    staff_client: Client, funded_buyer: Organisation, west_operator: Organisation, world: dict[str, Cluster]
) -> None:
    _rate_usage(west_operator)
    month = local(3, 6).date().replace(day=1)
    earlier = (month - timedelta(days=1)).replace(day=1)
    revenue = staff_client.get(URL, {"month": earlier.strftime("%Y-%m")}).context["revenue"]
    assert (revenue.gross, revenue.by_band) == (Decimal("0.000000"), [])


def test_offline_cluster_is_listed_with_cause_and_admin_link(
    staff_client: Client, world: dict[str, Cluster]
) -> None:
    east = world["east"]
    cluster_status_set(
        actor=Actor.system("heartbeat monitor"), cluster=east, status="offline", reason="No heartbeat"
    )
    response = staff_client.get(URL)
    offline = response.context["offline"]

    assert offline.count == 1
    (item,) = offline.clusters
    assert item.cluster.cpi == east.cpi
    assert item.reason == "No heartbeat"
    assert item.since is not None
    content = response.content.decode()
    assert reverse("admin:federation_cluster_change", args=[east.pk]) in content
    assert "No heartbeat" in content


def test_reconcile_run_now_records_and_shows_the_status(
    staff_client: Client, world: dict[str, Cluster]
) -> None:
    assert "has not been reconciled yet" in staff_client.get(URL).content.decode()

    response = staff_client.post(reverse("staff-reconcile"))

    assert response.status_code == 302
    assert response["Location"] == URL
    run = ReconciliationRun.objects.get()
    assert run.ok is True and run.breaches == []
    page = staff_client.get(URL)
    assert page.context["reconciliation"] == run
    assert "No breach at" in page.content.decode()


def test_reconcile_breaches_are_shown_with_their_codes(staff_client: Client) -> None:
    ReconciliationRun.objects.create(
        checked_at=timezone.now(),
        ok=False,
        breaches=[
            {"code": "unit_not_zero", "message": "The entries of a unit do not sum to zero.", "count": 2}
        ],
    )
    content = staff_client.get(URL).content.decode()
    assert "unit_not_zero" in content and "(2 rows)" in content


def test_query_count_does_not_grow_with_offline_clusters(
    staff_client: Client,
    west_operator: Organisation,
    world: dict[str, Cluster],
    django_assert_max_num_queries: Any,
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def add(count: int, start: int) -> None:
        for i in range(start, start + count):
            cluster = make_cluster(
                operator=west_operator, hub="gs", name=f"qy-{i:02d}", islands=[("isl-01", 8)]
            )
            cluster_status_set(actor=Actor.system("test"), cluster=cluster, status="offline", reason="down")

    add(1, 0)
    staff_client.get(URL)
    with CaptureQueriesContext(connection) as small:
        staff_client.get(URL)
    add(29, 1)
    with django_assert_max_num_queries(len(small)):
        response = staff_client.get(URL)
    assert response.context["offline"].count == 30
