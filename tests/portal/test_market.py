"""The buyers' marketplace: free cards now, prices, band strips, latency from the home hub, filters, sorts,
permissions and a bounded number of queries."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from broker.market import buyer_home_hub, capacity_by_hub_and_chip
from broker.models import BuyerPreference
from broker.services.preferences import buyer_home_hub_set
from core.models import Organisation
from core.types import Actor
from federation.models import Cluster
from federation.services import cluster_status_set, heartbeat_record
from federation.types import IslandReport
from metering.selectors.tariffs import price_card_current
from tests.broker.factories import make_job, make_lease
from tests.factories import make_cluster
from tests.metering.factories import make_price_card

URL = "/market/"


@pytest.fixture
def world(east_cluster: Cluster, west_cluster: Cluster) -> tuple[Cluster, Cluster]:
    """East: 16 A800 in yrd at 12 CNY (cn-gd). West: 64 A800 in nx at 9 CNY (its own tariff)."""
    return east_cluster, west_cluster


def rows_by_cpi(response: Any) -> dict[str, Any]:
    return {row.cluster.cpi: row for row in response.context["rows"]}


def cpis(response: Any) -> list[str]:
    return [row.cluster.cpi for row in response.context["rows"]]


# --- Access -------------------------------------------------------------------------------------------


def test_market_renders_for_a_buyer(buyer_client: Client, world: tuple[Cluster, Cluster]) -> None:
    response = buyer_client.get(URL)
    assert response.status_code == 200
    assert response.templates[0].name == "broker/market/market.html"
    assert cpis(response) == ["cpi:cucc:nx:zw-ai01", "cpi:ctyun:yrd:sh-ai01"]  # cheapest first


def test_anonymous_is_sent_to_log_in(client: Client, world: tuple[Cluster, Cluster]) -> None:
    response = client.get(URL)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_an_operator_reads_the_market_to_price_against_it_but_cannot_buy(
    operator_client: Client, east_operator: Organisation, world: tuple[Cluster, Cluster]
) -> None:
    """Operators see what buyers see (clusters, free cards, list prices, bands, latency), their own
    clusters marked, and nothing that buys: no "place a job", no home hub, no pack prices."""
    east, west = world
    response = operator_client.get(URL)
    assert response.status_code == 200
    assert cpis(response) == ["cpi:cucc:nx:zw-ai01", "cpi:ctyun:yrd:sh-ai01"]
    html = response.content.decode()
    assert response.context["is_buyer"] is False
    assert response.context["own_operator_id"] == east_operator.pk
    assert html.count('<span class="badge good own">yours</span>') == 1
    own_row = html[html.index('<tr class="own">') : html.index("</tr>", html.index('<tr class="own">'))]
    assert east.cpi in own_row and west.cpi not in own_row
    assert 'data-list="12.0000"' in html and 'data-list="9.0000"' in html
    assert reverse("job-create") not in html
    assert 'name="home_hub"' not in html and "data-yours=" not in html
    assert "You see the market as buyers see it" in html
    # The navigation offers it under the operator's pages.
    assert any(link.url == URL for link in response.context["portal_nav"])
    # A home hub is a buyer's: the POST is refused and writes nothing.
    assert operator_client.post(URL, {"home_hub": "nx"}).status_code == 403
    assert not BuyerPreference.objects.exists()


def test_a_buyer_that_also_operates_sees_its_own_clusters_marked_and_can_buy(
    login: Callable[[User], Client], east_operator: Organisation, world: tuple[Cluster, Cluster]
) -> None:
    from tests.factories import MembershipFactory, UserFactory

    east_operator.is_buyer = True
    east_operator.save()
    user = UserFactory(username="both")
    MembershipFactory(user=user, organisation=east_operator, role="owner")
    html = login(user).get(URL).content.decode()
    assert html.count('<span class="badge good own">yours</span>') == 1
    assert reverse("job-create") in html and 'name="home_hub"' in html


def test_staff_without_a_buyer_organisation_is_refused(staff_client: Client) -> None:
    assert staff_client.get(URL).status_code == 403


# --- Free cards, prices, strips ----------------------------------------------------------------------


def test_free_cards_count_live_holds_and_not_future_ones(
    buyer_client: Client, buyer: Organisation, world: tuple[Cluster, Cluster]
) -> None:
    east, west = world
    now = timezone.now().replace(microsecond=0)
    make_lease(job=make_job(buyer=buyer, cards=6), cluster=east, start_at=now - timedelta(minutes=5))
    make_lease(
        job=make_job(buyer=buyer, cards=4),
        cluster=east,
        island="isl-02",
        start_at=now + timedelta(hours=3),
    )
    island = east.islands.get(name="isl-02")
    island.unhealthy_cards = 1
    island.save(update_fields=["unhealthy_cards"])

    rows = rows_by_cpi(buyer_client.get(URL))

    # 16 cards − 1 unhealthy − 6 held now; the lease starting in 3 h holds nothing yet.
    assert (rows[east.cpi].free_cards, rows[east.cpi].held_cards, rows[east.cpi].unhealthy_cards) == (9, 6, 1)
    assert (rows[west.cpi].free_cards, rows[west.cpi].held_cards) == (64, 0)


def test_an_island_never_counts_below_zero(
    buyer_client: Client, buyer: Organisation, world: tuple[Cluster, Cluster]
) -> None:
    east, _ = world
    make_lease(job=make_job(buyer=buyer, cards=8), cluster=east, island="isl-01")
    island = east.islands.get(name="isl-01")
    island.unhealthy_cards = 3  # reported after the lease took the whole island
    island.save(update_fields=["unhealthy_cards"])

    response = buyer_client.get(URL)
    rows = rows_by_cpi(response)

    assert rows[east.cpi].free_cards == 8  # isl-01: max(8 − 3 − 8, 0) = 0; isl-02: 8
    summary = response.context["summary"]
    assert [(t.key, t.free_cards, t.held_cards) for t in summary.by_hub] == [("yrd", 8, 8), ("nx", 64, 0)]


def test_price_is_the_price_card_in_force(buyer_client: Client, world: tuple[Cluster, Cluster]) -> None:
    east, west = world
    make_price_card(
        cluster=east, rate="15.5000", tariff_code="cn-gd", effective_from=timezone.now() + timedelta(days=1)
    )  # not in force yet

    response = buyer_client.get(URL)
    rows = rows_by_cpi(response)

    for cluster in (east, west):
        card = price_card_current(cluster=cluster)
        assert rows[cluster.cpi].price_card.pk == card.pk
    assert rows[east.cpi].price_card.rate_per_card_hour == Decimal("12.0000")
    assert rows[west.cpi].price_card.rate_per_card_hour == Decimal("9.0000")
    content = response.content.decode()
    assert "¥12.00" in content and "¥9.00" in content and "¥15.50" not in content


def test_one_strip_per_tariff_version_with_a_now_marker(
    buyer_client: Client, east_operator: Organisation, world: tuple[Cluster, Cluster]
) -> None:
    other = make_cluster(operator=east_operator, hub="yrd", name="sh-ai02", islands=[("isl-01", 8)])
    make_price_card(cluster=other, rate="11.0000", tariff_code="cn-gd")

    response = buyer_client.get(URL)
    rows = response.context["rows"]

    assert len(rows) == 3
    by_code = {row.strip.tariff_code: row.strip for row in rows}
    assert set(by_code) == {"cn-gd", "cucc-west"}
    gd = [row.strip for row in rows if row.strip.tariff_code == "cn-gd"]
    assert gd[0] is gd[1]  # drawn once, reused
    assert 'class="now"' in str(by_code["cn-gd"].svg)
    zone = ZoneInfo(by_code["cn-gd"].time_zone)
    assert by_code["cn-gd"].local_date == timezone.now().astimezone(zone).date()


# --- Filters and sorts --------------------------------------------------------------------------------


@pytest.fixture
def market(world: tuple[Cluster, Cluster], west_operator: Organisation) -> dict[str, Cluster]:
    """Adds an H800 cluster in nx (8 cards at 20 CNY) and an offline A800 cluster in gba."""
    east, west = world
    h800 = make_cluster(
        operator=west_operator,
        hub="nx",
        name="zw-h800",
        accelerator="nvidia-h800-sxm5-80gb",
        islands=[("isl-01", 8)],
    )
    make_price_card(cluster=h800, rate="20.0000", tariff_code="cn-nx")
    down = make_cluster(operator=west_operator, hub="gba", name="sz-ai01", islands=[("isl-01", 32)])
    make_price_card(cluster=down, rate="5.0000", tariff_code="cn-gd")
    cluster_status_set(
        actor=Actor(organisation=west_operator, system_label="test"),
        cluster=down,
        status="offline",
        reason="maintenance",
    )
    return {"east": east, "west": west, "h800": h800, "down": down}


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({}, ["west", "east", "h800"]),
        ({"hub": "nx"}, ["west", "h800"]),
        ({"chip": "nvidia-h800-sxm5-80gb"}, ["h800"]),
        ({"operator": "ctyun"}, ["east"]),
        ({"min_free": "16"}, ["west", "east"]),
        ({"max_price": "12"}, ["west", "east"]),
        ({"max_price": "11.99"}, ["west"]),
        ({"include_offline": "on"}, ["down", "west", "east", "h800"]),
        ({"include_offline": "on", "hub": "gba"}, ["down"]),
        ({"sort": "free"}, ["west", "east", "h800"]),
        ({"sort": "hub"}, ["east", "west", "h800"]),  # yrd before nx; price within a hub
    ],
)
def test_filters_and_sorts(
    buyer_client: Client, market: dict[str, Cluster], query: dict[str, str], expected: list[str]
) -> None:
    response = buyer_client.get(URL, query)
    assert response.status_code == 200
    assert cpis(response) == [market[name].cpi for name in expected]


def test_offline_cluster_is_marked_and_offers_no_placement(
    buyer_client: Client, market: dict[str, Cluster]
) -> None:
    response = buyer_client.get(URL, {"include_offline": "on", "hub": "gba"})
    (row,) = response.context["rows"]
    assert row.cluster.status == "offline" and not row.placeable
    assert "Offline" in response.content.decode()


def test_sort_by_latency_follows_the_home_hub(
    buyer_client: Client, buyer: Organisation, market: dict[str, Cluster]
) -> None:
    # No preference, no job: from yrd (5 ms to yrd, 20 ms to nx).
    response = buyer_client.get(URL, {"sort": "latency"})
    assert cpis(response) == [market["east"].cpi, market["west"].cpi, market["h800"].cpi]
    assert response.context["home"].source == "default"
    assert "the default" in response.content.decode()

    buyer_home_hub_set(buyer=buyer, hub_code="nx", actor=Actor(organisation=buyer, system_label="test"))

    response = buyer_client.get(URL, {"sort": "latency"})
    assert cpis(response) == [market["west"].cpi, market["h800"].cpi, market["east"].cpi]


def test_invalid_filter_is_reported_beside_its_field_and_ignored(
    buyer_client: Client, market: dict[str, Cluster]
) -> None:
    response = buyer_client.get(URL, {"min_free": "-3", "hub": "nx"})
    assert response.status_code == 200
    assert "min_free" in response.context["filters"].errors
    assert cpis(response) == [market["west"].cpi, market["h800"].cpi]


def test_summary_by_hub_and_chip(
    buyer_client: Client, buyer: Organisation, market: dict[str, Cluster]
) -> None:
    make_lease(job=make_job(buyer=buyer, cards=10), cluster=market["west"])
    summary = buyer_client.get(URL).context["summary"]
    assert [(t.key, t.free_cards, t.cards) for t in summary.by_hub] == [("yrd", 16, 16), ("nx", 62, 72)]
    assert {t.key: (t.free_cards, t.cards) for t in summary.by_chip} == {
        "nvidia-a800-sxm4-80gb": (70, 80),
        "nvidia-h800-sxm5-80gb": (8, 8),
    }


def test_place_a_job_link_prefills_chip_and_origin(
    buyer_client: Client, world: tuple[Cluster, Cluster]
) -> None:
    job_url = reverse("job-create")
    content = buyer_client.get(URL).content.decode()
    # The link pins the job to the row's cluster (the form shows it and the buyer may clear it).
    assert (
        f'href="{job_url}?accelerator=nvidia-a800-sxm4-80gb&amp;origin_hub=yrd&amp;cluster=cpi%3Acucc%3Anx%3Azw-ai01"'
        in content
    )
    form = buyer_client.get(
        f"{job_url}?accelerator=nvidia-a800-sxm4-80gb&origin_hub=yrd&cluster=cpi:cucc:nx:zw-ai01"
    )
    assert form.context["form"]["cluster"].value() == "cpi:cucc:nx:zw-ai01"


# --- Home hub -----------------------------------------------------------------------------------------


def test_home_hub_post_persists_and_changes_latency(
    buyer_client: Client,
    buyer: Organisation,
    other_buyer: Organisation,
    world: tuple[Cluster, Cluster],
) -> None:
    east, west = world
    buyer_home_hub_set(
        buyer=other_buyer, hub_code="gba", actor=Actor(organisation=other_buyer, system_label="test")
    )
    before = rows_by_cpi(buyer_client.get(URL))
    # yrd ↔ nx: the seeded distance estimate (federation.catalog.hub_latency_seed).
    assert (before[east.cpi].latency_ms, before[west.cpi].latency_ms) == (Decimal(5), Decimal("24.3"))

    response = buyer_client.post(URL + "?sort=latency", {"home_hub": "nx"})

    assert response.status_code == 302
    assert response["Location"] == URL + "?sort=latency"
    assert BuyerPreference.objects.get(buyer=buyer).home_hub.code == "nx"
    assert buyer_home_hub(buyer=buyer) == "nx"
    after = buyer_client.get(URL)
    rows = rows_by_cpi(after)
    assert (rows[east.cpi].latency_ms, rows[west.cpi].latency_ms) == (Decimal("24.3"), Decimal(5))
    assert after.context["home"].source == "preference"
    # Another buyer's preference is untouched.
    assert BuyerPreference.objects.get(buyer=other_buyer).home_hub.code == "gba"
    assert BuyerPreference.objects.count() == 2


def test_unknown_home_hub_is_an_error_beside_the_field(
    buyer_client: Client, buyer: Organisation, world: tuple[Cluster, Cluster]
) -> None:
    response = buyer_client.post(URL, {"home_hub": "atlantis"})
    assert response.status_code == 200
    assert response.context["home_form"].errors["home_hub"]
    assert "has-error" in response.content.decode()
    assert not BuyerPreference.objects.exists()


def test_a_viewer_cannot_set_the_home_hub(
    login: Callable[[User], Client], buyer_viewer: User, world: tuple[Cluster, Cluster]
) -> None:
    client = login(buyer_viewer)
    assert client.get(URL).status_code == 200
    assert client.post(URL, {"home_hub": "nx"}).status_code == 403
    assert not BuyerPreference.objects.exists()


def test_home_hub_defaults_to_the_latest_job_origin(
    buyer_client: Client, buyer: Organisation, world: tuple[Cluster, Cluster]
) -> None:
    assert buyer_home_hub(buyer=buyer) is None
    make_job(buyer=buyer, origin_hub="yrd")
    make_job(buyer=buyer, origin_hub="gba")
    assert buyer_home_hub(buyer=buyer) == "gba"
    response = buyer_client.get(URL)
    assert (response.context["home"].code, response.context["home"].source) == ("gba", "latest_job")


def test_home_hub_set_refuses_another_buyer(buyer: Organisation, other_buyer: Organisation) -> None:
    from core.errors import PermissionDeniedError

    with pytest.raises(PermissionDeniedError):
        buyer_home_hub_set(
            buyer=buyer, hub_code="nx", actor=Actor(organisation=other_buyer, system_label="t")
        )
    assert not BuyerPreference.objects.exists()


# --- Queries ------------------------------------------------------------------------------------------


def test_query_count_does_not_grow_with_clusters(
    buyer_client: Client,
    buyer: Organisation,
    west_operator: Organisation,
    world: tuple[Cluster, Cluster],
    django_assert_max_num_queries: Any,
) -> None:
    def add(count: int, start: int) -> None:
        for i in range(start, start + count):
            cluster = make_cluster(
                operator=west_operator, hub="gs", name=f"qy-{i:02d}", islands=[("isl-01", 8), ("isl-02", 8)]
            )
            make_price_card(cluster=cluster, rate=f"{10 + i}.0000", tariff_code="cn-nx" if i % 2 else "cn-gd")
            make_lease(job=make_job(buyer=buyer, cards=2), cluster=cluster)

    add(2, 0)  # 4 clusters, on both tariffs the later ones use
    buyer_client.get(URL)  # warm the compiled-tariff cache (one load per tariff version) and the session
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as small:
        assert len(buyer_client.get(URL).context["rows"]) == 4
    add(26, 2)  # 30 clusters
    with django_assert_max_num_queries(len(small)):
        response = buyer_client.get(URL)
    assert len(response.context["rows"]) == 30
    assert all(row.held_cards == 2 for row in response.context["rows"] if row.cluster.hub.code == "gs")


# --- The buyer's own price ------------------------------------------------------------------------------


def test_a_buyer_without_a_pack_sees_the_list_price_as_what_it_pays(
    buyer_client: Client, world: tuple[Cluster, Cluster]
) -> None:
    response = buyer_client.get(URL)
    assert set(response.context["yours"].values()) == {None}
    page = response.content.decode()
    assert page.count('data-yours="none"') == 2
    assert "no pack: billed at this list price" in page


def test_a_standard_pack_prices_a_chip_at_its_factor(
    buyer: Organisation, buyer_client: Client, world: tuple[Cluster, Cluster]
) -> None:
    """A standard pack at 12 CNY per standard card-hour pays an A800 card-hour with 0.78 of one: 9.36."""
    from tests.metering.factories import make_paid_pack

    make_paid_pack(buyer=buyer, accelerator=None, card_hours=1000, price="12000.00", key="std")
    east, west = world
    response = buyer_client.get(URL)
    yours = response.context["yours"]
    assert {
        cpi: (y.class_key, y.pack_price_per_card_hour, y.factor, y.price_per_card_hour)
        for cpi, y in ((c.cpi, yours[c.pk]) for c in (east, west))
    } == {
        east.cpi: ("std", Decimal("12.00"), Decimal("0.78"), Decimal("9.36")),
        west.cpi: ("std", Decimal("12.00"), Decimal("0.78"), Decimal("9.36")),
    }
    page = response.content.decode()
    assert page.count('data-yours="9.36"') == 2
    assert "std pack ¥12.00 × 0.78" in page and "list ¥12.00" in page and "list ¥9.00" in page


def test_a_chip_pack_expiring_first_is_the_price(
    funded_buyer: Organisation, buyer_client: Client, world: tuple[Cluster, Cluster]
) -> None:
    """The A800 pack (9 CNY) and the standard one (12 CNY) expire together; the A800 one was bought first,
    so rating draws it first: an A800 card-hour costs the buyer 9.00."""
    east, _west = world
    yours = buyer_client.get(URL).context["yours"][east.pk]
    assert (yours.class_key, yours.price_per_card_hour, yours.factor) == (
        "nvidia-a800-sxm4-80gb",
        Decimal("9.00"),
        None,
    )


# --- What the operator reports (K2) -------------------------------------------------------------------

TTL = timedelta(seconds=90)  # CARDHOUR_HEARTBEAT_INTERVAL_SECONDS 30 × CARDHOUR_HEARTBEAT_MISSED_LIMIT 3


def beat(cluster: Cluster, *, now: Any, **available: int) -> None:
    """A heartbeat received at ``now`` reporting ``available`` cards per island name (isl_01=2 …)."""
    heartbeat_record(
        actor=Actor(organisation=cluster.operator, system_label="test agent"),
        cluster=cluster,
        sent_at=now,
        health="ok",
        islands=[
            IslandReport(name=name.replace("_", "-"), available_cards=n) for name, n in available.items()
        ],
        now=now,
    )


def test_market_free_now_shows_the_reported_figure(
    buyer_client: Client, buyer: Organisation, east_cluster: Cluster
) -> None:
    now = timezone.now()
    beat(east_cluster, now=now, isl_01=4, isl_02=8)

    row = {row.cluster.cpi: row for row in buyer_client.get("/market/").context["rows"]}[east_cluster.cpi]
    assert (row.free_cards, row.withheld_cards, row.held_cards) == (12, 4, 0)

    # A lease now counts against the report once: 4 − 2 on isl-01, 8 on isl-02.
    make_lease(job=make_job(buyer=buyer, cards=2), cluster=east_cluster, start_at=now - timedelta(minutes=1))
    response = buyer_client.get("/market/")
    row = {row.cluster.cpi: row for row in response.context["rows"]}[east_cluster.cpi]
    assert (row.free_cards, row.withheld_cards, row.held_cards) == (10, 4, 2)
    assert "4 busy (operator)" in response.content.decode()
    [cell] = [c for c in capacity_by_hub_and_chip(statuses=["active"], at=now) if c.hub == "yrd"]
    assert (cell.free_cards, cell.withheld_cards, cell.held_cards) == (10, 4, 2)

    # Once the report has expired, the declared cards again.
    later = now + TTL
    [cell] = [c for c in capacity_by_hub_and_chip(statuses=["active"], at=later) if c.hub == "yrd"]
    assert (cell.free_cards, cell.withheld_cards) == (14, 0)


def test_market_never_counts_an_island_below_zero_when_the_operator_takes_leased_cards(
    buyer: Organisation, east_cluster: Cluster
) -> None:
    now = timezone.now()
    make_lease(job=make_job(buyer=buyer, cards=6), cluster=east_cluster, start_at=now - timedelta(minutes=1))
    beat(east_cluster, now=now, isl_01=2)  # less than Cardhour holds: the operator's work took 4 of them
    [cell] = [c for c in capacity_by_hub_and_chip(statuses=["active"], at=now) if c.hub == "yrd"]
    assert (cell.free_cards, cell.withheld_cards, cell.held_cards) == (8, 6, 6)  # isl-01 0, isl-02 8
