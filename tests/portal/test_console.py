"""The operator console: clusters (leased now, utilisation, heartbeat), a cluster's islands and utilisation
over time, and the leases on the operator's clusters (broker.views.console, broker.console)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any, cast

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from broker import console
from broker.models import Lease, LeaseState
from broker.services import dispatch
from broker.services.leases import lease_lock, lease_transition
from core.models import Organisation
from core.types import Actor
from federation.models import Cluster, Island
from metering.services.rating import usage_rate_pending
from tests.broker.factories import make_job, make_lease
from tests.factories import MembershipFactory, UserFactory, make_cluster

pytestmark = pytest.mark.django_db


def _lease(
    buyer: Organisation,
    cluster: Cluster,
    *,
    start: Any,
    hours: int = 2,
    cards: int = 8,
    island: str = "isl-01",
) -> Lease:
    job = make_job(buyer=buyer, cards=cards, duration_seconds=hours * 3600)
    return make_lease(
        job=job,
        cluster=cluster,
        cards=cards,
        start_at=start,
        end_at=start + timedelta(hours=hours),
        island=island,
    )


def _row_for(response: Any, cpi: str) -> console.ClusterRow:
    return next(row for row in response.context["rows"] if row.cluster.cpi == cpi)


# --- Access -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, args",
    [
        ("operator-cluster-list", []),
        ("operator-cluster-detail", ["cpi:ctyun:yrd:sh-ai01"]),
        ("operator-lease-list", []),
        ("operator-lease-detail", [1]),
    ],
)
def test_anonymous_is_sent_to_log_in(name: str, args: list[Any], east_cluster: Cluster) -> None:
    response = Client().get(reverse(name, args=args))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


@pytest.mark.parametrize("name", ["operator-cluster-list", "operator-lease-list"])
def test_a_buyer_is_refused(name: str, buyer_client: Client) -> None:
    assert buyer_client.get(reverse(name)).status_code == 403


def test_a_buyer_is_refused_a_cluster_page(buyer_client: Client, east_cluster: Cluster) -> None:
    assert buyer_client.get(reverse("operator-cluster-detail", args=[east_cluster.cpi])).status_code == 403


# --- Clusters ---------------------------------------------------------------------------------------


def test_cluster_list_shows_exactly_my_clusters(
    operator_client: Client, east_cluster: Cluster, west_cluster: Cluster
) -> None:
    response = operator_client.get(reverse("operator-cluster-list"))
    assert response.status_code == 200
    assert [row.cluster.cpi for row in response.context["rows"]] == [east_cluster.cpi]
    assert east_cluster.cpi.encode() in response.content
    assert west_cluster.cpi.encode() not in response.content
    row = _row_for(response, east_cluster.cpi)
    assert row.leased_now == 0
    assert row.utilisation == Decimal("0.0")
    assert row.rate_now == Decimal("12.0000")
    assert row.heartbeat_late is True  # never beat
    assert "¥12.00" in response.content.decode()


def test_leased_now_and_utilisation_count_live_holds_only(
    operator_client: Client, buyer: Organisation, east_cluster: Cluster
) -> None:
    now = timezone.now().replace(microsecond=0)
    _lease(buyer, east_cluster, start=now - timedelta(hours=1), cards=8, island="isl-01")
    _lease(buyer, east_cluster, start=now + timedelta(hours=3), cards=6, island="isl-02")  # not now
    Island.objects.filter(cluster=east_cluster, name="isl-02").update(unhealthy_cards=4)

    response = operator_client.get(reverse("operator-cluster-list"))

    row = _row_for(response, east_cluster.cpi)
    assert row.leased_now == 8
    assert row.unhealthy_cards == 4
    assert row.sellable_cards == 12
    assert row.utilisation == Decimal("66.7")  # 8 of 16 - 4
    summary = response.context["summary"]
    assert (summary.clusters, summary.online, summary.offline) == (1, 1, 0)
    assert (summary.cards, summary.sellable_cards, summary.leased_now) == (16, 12, 8)
    assert summary.utilisation == Decimal("66.7")
    assert "66.7 %" in response.content.decode()


def test_a_fresh_heartbeat_is_not_late(operator_client: Client, east_cluster: Cluster) -> None:
    Cluster.objects.filter(pk=east_cluster.pk).update(
        last_heartbeat_at=timezone.now() - timedelta(seconds=20)
    )
    response = operator_client.get(reverse("operator-cluster-list"))
    assert _row_for(response, east_cluster.cpi).heartbeat_late is False


def test_cluster_list_filters_by_status_and_hub(
    operator_client: Client, east_operator: Organisation, presets: None
) -> None:
    make_cluster(operator=east_operator, hub="yrd", name="sh-a", islands=[("i1", 8)])
    offline = make_cluster(operator=east_operator, hub="nx", name="zw-a", islands=[("i1", 8)])
    Cluster.objects.filter(pk=offline.pk).update(status="offline")

    by_status = operator_client.get(reverse("operator-cluster-list"), {"status": "offline"})
    assert [r.cluster.cpi for r in by_status.context["rows"]] == [offline.cpi]
    by_hub = operator_client.get(reverse("operator-cluster-list"), {"hub": "yrd"})
    assert [r.cluster.cpi for r in by_hub.context["rows"]] == ["cpi:ctyun:yrd:sh-a"]
    summary = by_hub.context["summary"]  # the summary covers the whole fleet, not the filter
    assert (summary.clusters, summary.online, summary.offline) == (2, 1, 1)
    bogus = operator_client.get(reverse("operator-cluster-list"), {"status": "nonsense"})
    assert len(bogus.context["rows"]) == 2  # an unknown value filters nothing


def test_cluster_list_query_count_does_not_grow_with_rows(
    operator_client: Client,
    east_operator: Organisation,
    buyer: Organisation,
    presets: None,
    django_assert_max_num_queries: Callable[..., Any],
) -> None:
    now = timezone.now().replace(microsecond=0)
    for i in range(12):
        cluster = make_cluster(
            operator=east_operator, hub="yrd", name=f"sh-{i:02d}", islands=[("i1", 8), ("i2", 8)]
        )
        from tests.metering.factories import make_price_card

        make_price_card(cluster=cluster, rate="10.0000", tariff_code="cn-gd")
        _lease(buyer, cluster, start=now - timedelta(minutes=30), cards=4, island="i1")
    with django_assert_max_num_queries(12):
        response = operator_client.get(reverse("operator-cluster-list"))
    assert len(response.context["rows"]) == 12
    assert all(row.leased_now == 4 and row.utilisation == Decimal("25.0") for row in response.context["rows"])


# --- Cluster detail ---------------------------------------------------------------------------------


def test_cluster_detail_shows_islands_history_and_links(
    operator_client: Client, buyer: Organisation, east_cluster: Cluster
) -> None:
    now = timezone.now().replace(microsecond=0)
    lease = _lease(buyer, east_cluster, start=now - timedelta(minutes=10), cards=6, island="isl-02")

    response = operator_client.get(reverse("operator-cluster-detail", args=[east_cluster.cpi]))

    assert response.status_code == 200
    islands = {row.island.name: row for row in response.context["islands"]}
    assert (islands["isl-01"].leased_now, islands["isl-02"].leased_now) == (0, 6)
    assert islands["isl-02"].utilisation == Decimal("75.0")
    assert response.context["leased_now"] == 6
    assert response.context["utilisation_now"] == Decimal("37.5")
    assert response.context["price_card"].rate_per_card_hour == Decimal("12.0000")
    assert [c.to_status for c in response.context["history"]] == ["active"]
    assert [le.pk for le in response.context["live_leases"]] == [lease.pk]
    body = response.content.decode()
    assert reverse("operator-lease-detail", args=[lease.pk]) in body
    assert "acme" in body  # the buyer's slug, as the lease feed gives it
    assert "Acme AI" not in body


def test_another_operators_cluster_is_404(
    operator_client: Client, east_cluster: Cluster, west_cluster: Cluster
) -> None:
    assert operator_client.get(reverse("operator-cluster-detail", args=[west_cluster.cpi])).status_code == 404
    assert (
        operator_client.get(reverse("operator-cluster-detail", args=["cpi:ctyun:yrd:nope"])).status_code
        == 404
    )
    assert operator_client.get(reverse("operator-cluster-detail", args=["not-a-cpi"])).status_code == 404


def test_utilisation_series_counts_past_live_ended_and_future_holds(
    buyer: Organisation, east_cluster: Cluster
) -> None:
    now = timezone.now()
    hour = console.current_hour(now=now)
    live = _lease(
        buyer, east_cluster, start=hour - timedelta(hours=1), cards=8, island="isl-01"
    )  # [H-1, H+1)
    future = _lease(
        buyer, east_cluster, start=hour + timedelta(hours=2), cards=8, island="isl-02"
    )  # [H+2, H+4)
    ended = _lease(buyer, east_cluster, start=hour - timedelta(hours=5), hours=4, cards=8, island="isl-02")
    with_lock = lease_lock(lease_id=ended.pk)
    lease_transition(
        lease=with_lock, to_state=LeaseState.RUNNING, actor=Actor.system("t"), at=hour - timedelta(hours=5)
    )
    lease_transition(
        lease=with_lock, to_state=LeaseState.COMPLETED, actor=Actor.system("t"), at=hour - timedelta(hours=3)
    )

    series = console.cluster_utilisation(cluster=east_cluster, now=now)

    assert series.sellable_cards == 16
    assert len(series.history) == 168 and len(series.forecast) == 48
    assert series.history[-1].start_at == hour - timedelta(hours=1)
    assert [p.percent for p in series.history[-6:]] == [
        Decimal(x) for x in ("0.0", "50.0", "50.0", "0.0", "0.0", "50.0")
    ]
    assert [p.leased_cards for p in series.history[-6:]][1] == Decimal("8.00")
    assert series.forecast[0].start_at == hour
    assert [p.percent for p in series.forecast[:5]] == [
        Decimal(x) for x in ("50.0", "0.0", "50.0", "50.0", "0.0")
    ]
    assert series.history_peak == Decimal("50.0")
    assert live.pk and future.pk
    # now: the live lease only, the future one is not leased yet
    assert [r.leased_now for r in console.island_console_rows(cluster=east_cluster, now=now)] == [8, 0]


def test_utilisation_of_a_part_hour(buyer: Organisation, east_cluster: Cluster) -> None:
    now = timezone.now()
    hour = console.current_hour(now=now)
    _lease(buyer, east_cluster, start=hour + timedelta(hours=5, minutes=30), hours=1, cards=4)
    series = console.cluster_utilisation(cluster=east_cluster, now=now)
    assert [p.leased_cards for p in series.forecast[5:7]] == [Decimal("2.00"), Decimal("2.00")]
    assert [p.percent for p in series.forecast[5:7]] == [Decimal("12.5"), Decimal("12.5")]


def test_cluster_detail_chart_shows_the_forecast(
    operator_client: Client, buyer: Organisation, east_cluster: Cluster
) -> None:
    hour = console.current_hour()
    _lease(buyer, east_cluster, start=hour + timedelta(hours=2), cards=8, island="isl-02")
    response = operator_client.get(reverse("operator-cluster-detail", args=[east_cluster.cpi]))
    assert response.context["leased_now"] == 0
    label = timezone.localtime(hour + timedelta(hours=2)).strftime("%m-%d %H:00")
    assert f"{label}: 50.0 %" in str(response.context["forecast_chart"])
    assert response.context["series"].forecast_peak == Decimal("50.0")


def test_cluster_detail_query_count(
    operator_client: Client,
    buyer: Organisation,
    east_cluster: Cluster,
    django_assert_max_num_queries: Callable[..., Any],
) -> None:
    now = timezone.now().replace(microsecond=0)
    for i in range(10):
        _lease(buyer, east_cluster, start=now + timedelta(hours=2 * i), cards=2, island="isl-01")
    with django_assert_max_num_queries(16):
        response = operator_client.get(reverse("operator-cluster-detail", args=[east_cluster.cpi]))
    assert len(response.context["live_leases"]) == 10


# --- Leases -----------------------------------------------------------------------------------------


def test_lease_list_shows_only_leases_on_my_clusters(
    operator_client: Client, buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster
) -> None:
    now = timezone.now().replace(microsecond=0)
    mine = _lease(buyer, east_cluster, start=now)
    theirs = _lease(buyer, west_cluster, start=now)

    response = operator_client.get(reverse("operator-lease-list"))

    assert response.status_code == 200
    assert [lease.pk for lease in response.context["page"].object_list] == [mine.pk]
    body = response.content.decode()
    assert reverse("operator-lease-detail", args=[mine.pk]) in body
    assert reverse("operator-lease-detail", args=[theirs.pk]) not in body
    assert west_cluster.cpi not in body


def test_lease_list_filters_by_state_and_cluster(
    operator_client: Client, buyer: Organisation, east_operator: Organisation, east_cluster: Cluster
) -> None:
    now = timezone.now().replace(microsecond=0)
    other = make_cluster(operator=east_operator, hub="yrd", name="sh-b", islands=[("isl-01", 8)])
    from tests.metering.factories import make_price_card

    make_price_card(cluster=other, rate="10.0000", tariff_code="cn-gd")
    reserved = _lease(buyer, east_cluster, start=now + timedelta(hours=1))
    running = _lease(buyer, east_cluster, start=now, island="isl-02")
    dispatch.lease_start(operator=east_operator, lease_id=running.pk, actor=Actor.system("agent"), at=now)
    elsewhere = _lease(buyer, other, start=now)

    def ids(**params: str) -> list[int]:
        response = operator_client.get(reverse("operator-lease-list"), params)
        return sorted(lease.pk for lease in response.context["page"].object_list)

    assert ids(state="running") == [running.pk]
    assert ids(state="reserved") == sorted([reserved.pk, elsewhere.pk])
    assert ids(cluster=other.cpi) == [elsewhere.pk]
    assert ids(cluster="cpi:cucc:nx:zw-ai01") == sorted(
        [reserved.pk, running.pk, elsewhere.pk]
    )  # not mine: ignored


def test_lease_list_query_count_does_not_grow_with_rows(
    operator_client: Client,
    buyer: Organisation,
    east_cluster: Cluster,
    django_assert_max_num_queries: Callable[..., Any],
) -> None:
    now = timezone.now().replace(microsecond=0)
    for i in range(30):
        _lease(
            buyer,
            east_cluster,
            start=now + timedelta(hours=i),
            hours=1,
            cards=1,
            island=("isl-01", "isl-02")[i % 2],
        )
    with django_assert_max_num_queries(10):
        response = operator_client.get(reverse("operator-lease-list"))
    assert len(response.context["page"].object_list) == 30


def test_lease_detail_shows_transitions_and_usage(
    operator_client: Client, funded_buyer: Organisation, east_operator: Organisation, east_cluster: Cluster
) -> None:
    start = timezone.now().replace(microsecond=0) - timedelta(hours=1)
    lease = _lease(funded_buyer, east_cluster, start=start, cards=8)
    agent = Actor(organisation=east_operator, system_label="agent")
    dispatch.lease_start(operator=east_operator, lease_id=lease.pk, actor=agent, at=timezone.now())
    dispatch.lease_usage_report(
        operator=east_operator,
        records=[
            dispatch.LeaseUsageInput(
                lease_id=lease.pk,
                idempotency_key="u1",
                start_at=start,
                end_at=start + timedelta(minutes=30),
                cards=8,
            )
        ],
        actor=agent,
    )
    usage_rate_pending()

    response = operator_client.get(reverse("operator-lease-detail", args=[lease.pk]))

    assert response.status_code == 200
    assert [t.to_state for t in response.context["transitions"]] == ["reserved", "running"]
    usage = response.context["usage"]
    assert (usage.record_count, usage.unrated_records, usage.rated_card_hours) == (1, 0, Decimal("4.00"))
    assert response.context["usage_rows"][0][1] == Decimal("4.00")
    body = response.content.decode()
    assert "u1" in body and "4.00" in body
    # no buttons that would act for the agent
    assert "<form" not in body.split('id="main"', 1)[1].replace('class="org-switch"', "")


def test_another_operators_lease_is_404(
    operator_client: Client, buyer: Organisation, west_cluster: Cluster, east_cluster: Cluster
) -> None:
    theirs = _lease(buyer, west_cluster, start=timezone.now().replace(microsecond=0))
    assert operator_client.get(reverse("operator-lease-detail", args=[theirs.pk])).status_code == 404
    assert operator_client.get(reverse("operator-lease-detail", args=[999999])).status_code == 404


def test_a_viewer_of_the_operator_sees_the_console(
    login: Callable[[User], Client], east_operator: Organisation, east_cluster: Cluster
) -> None:
    viewer = cast(User, UserFactory(username="victor"))
    MembershipFactory(user=viewer, organisation=east_operator, role="viewer")
    client = login(viewer)
    assert client.get(reverse("operator-cluster-list")).status_code == 200
    assert client.get(reverse("operator-cluster-detail", args=[east_cluster.cpi])).status_code == 200
