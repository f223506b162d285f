"""The matcher: ranking by price and latency, valley shifting, every rejection reason, standard cards,
gang placement and the capacity calendar. Time is pinned to a March 2027 day (no summer critical peak)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest

from broker.services.jobs import job_spec
from broker.services.quotes import placements_find
from core.models import Organisation
from core.types import Actor
from federation.models import Cluster
from federation.services import cluster_status_set
from tests.broker.conftest import A800, H800
from tests.broker.factories import make_job, make_lease, make_reliability
from tests.factories import make_cluster
from tests.metering.factories import make_price_card

SHANGHAI = ZoneInfo("Asia/Shanghai")
DAY = datetime(2027, 3, 10, tzinfo=SHANGHAI)  # a Wednesday


def at(hour: int, minute: int = 0, days: int = 0) -> datetime:
    return DAY + timedelta(days=days, hours=hour, minutes=minute)


def find(job, *, now: datetime | None = None, limit: int = 10, **overrides):  # type: ignore[no-untyped-def]
    spec = replace(job_spec(job=job), **overrides)
    return placements_find(spec=spec, now=now or at(0), limit=limit)


@pytest.fixture
def h800_cluster(east_operator: Organisation, presets: None) -> Cluster:
    """8 H800 cards in Guangdong (gba), 30 CNY/card-hour flat."""
    cluster = make_cluster(
        operator=east_operator,
        hub="gba",
        name="sz-ai01",
        accelerator=H800,
        islands=[("isl-01", 8)],
        site="Shenzhen",
    )
    make_price_card(cluster=cluster, rate="30.0000", tariff_code="flat")
    return cluster


def test_a_valley_start_beats_a_peak_start(buyer: Organisation, east_cluster: Cluster) -> None:
    job = make_job(buyer=buyer, earliest_start_at=at(10), deadline_at=at(10, days=1), duration_seconds=7200)
    result = find(job)
    best = result.placements[0]
    # Guangdong: valley 00:00–08:00 at 0.38; the start moves from the 10:00 peak (1.7) to midnight.
    assert best.start_at == at(0, days=1)
    assert best.cost == Decimal("72.96")  # 8 cards × 2 h × 12 × 0.38
    assert best.earliest_feasible_cost == Decimal("326.40")  # 8 × 2 × 12 × 1.7 at 10:00
    assert best.saving == Decimal("253.44")
    assert [(b.band, b.card_seconds, b.cost) for b in best.bands] == [("valley", 57600, Decimal("72.96"))]
    assert best.expected_draw == Decimal("6.080000")  # 16 card-hours × 0.38
    assert result.feasible == 2 and len(result.placements) == 2


def test_cost_is_split_by_band_when_a_run_crosses_band_edges(
    buyer: Organisation, east_cluster: Cluster
) -> None:
    # 07:00–11:00 exactly (window = duration): valley 1 h, flat 2 h, peak 1 h.
    job = make_job(buyer=buyer, earliest_start_at=at(7), deadline_at=at(11), duration_seconds=4 * 3600)
    best = find(job).placements[0]
    assert [(b.band, b.card_hours, b.cost) for b in best.bands] == [
        ("peak", Decimal("8.000000"), Decimal("163.20")),
        ("flat", Decimal("16.000000"), Decimal("192.00")),
        ("valley", Decimal("8.000000"), Decimal("36.48")),
    ]
    assert best.cost == Decimal("391.68")
    assert best.saving == Decimal("0.00")


def test_a_western_hub_wins_only_within_the_latency_budget(
    buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster
) -> None:
    job = make_job(
        buyer=buyer, origin_hub="yrd", earliest_start_at=at(10), deadline_at=at(12), duration_seconds=7200
    )
    wide = find(job, latency_budget_ms=30)
    assert wide.placements[0].cluster_cpi == west_cluster.cpi  # 8 × 2 × 9 × 1.5 = 216 < 326.40
    assert wide.placements[0].cost == Decimal("216.00")
    assert wide.placements[0].latency_ms == Decimal("24.300")  # yrd–nx: the seeded distance estimate
    assert [p.cluster_cpi for p in wide.placements] == [west_cluster.cpi] * 2 + [east_cluster.cpi] * 2
    narrow = find(job, latency_budget_ms=10)
    assert {p.cluster_cpi for p in narrow.placements} == {east_cluster.cpi}
    assert narrow.rejections["latency"] == 2


def test_latency_preference_puts_the_nearest_first(
    buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster
) -> None:
    job = make_job(
        buyer=buyer, preference="latency", earliest_start_at=at(10), deadline_at=at(12), duration_seconds=7200
    )
    result = find(job)
    assert [p.cluster_cpi for p in result.placements][:2] == [east_cluster.cpi] * 2
    weighted = find(
        make_job(
            buyer=buyer,
            preference="weighted",
            price_weight=Decimal("0.9"),
            earliest_start_at=at(10),
            deadline_at=at(12),
            duration_seconds=7200,
        )
    )
    assert weighted.placements[0].cluster_cpi == west_cluster.cpi


def test_price_ties_are_broken_by_latency(
    buyer: Organisation, east_operator: Organisation, presets: None
) -> None:
    near = make_cluster(operator=east_operator, hub="yrd", name="a-near", islands=[("isl-01", 8)])
    far = make_cluster(operator=east_operator, hub="gz", name="a-far", islands=[("isl-01", 8)])
    for cluster in (far, near):
        make_price_card(cluster=cluster, rate="10.0000", tariff_code="flat")
    job = make_job(buyer=buyer, earliest_start_at=at(10), deadline_at=at(12), duration_seconds=7200)
    assert [p.cluster_cpi for p in find(job).placements] == [near.cpi, far.cpi]


def test_every_rejection_reason_is_counted(
    buyer: Organisation, east_operator: Organisation, west_operator: Organisation, presets: None
) -> None:
    def cluster(
        name: str,
        hub: str = "yrd",
        chip: str = A800,
        cards: int = 8,
        fabric: str = "infiniband",
        rate: str | None = "10.0000",
    ) -> Cluster:
        made = make_cluster(
            operator=east_operator,
            hub=hub,
            name=name,
            accelerator=chip,
            islands=[("isl-01", cards)],
            fabric=fabric,
        )
        if rate:
            make_price_card(cluster=made, rate=rate, tariff_code="flat")
        return made

    good = cluster("good")
    offline = cluster("down")
    cluster_status_set(actor=Actor.system("test"), cluster=offline, status="offline", reason="test")
    draining = cluster("drain")
    cluster_status_set(actor=Actor.system("test"), cluster=draining, status="draining", reason="test")
    cluster("wrong-chip", chip="nvidia-l20")
    cluster("roce", fabric="roce")
    cluster("far", hub="nx")
    cluster("unpriced", rate=None)
    cluster("dear", rate="99.0000")
    make_reliability(cluster=cluster("shaky"), percent="90.000")
    cluster("small", cards=4)
    busy = cluster("busy")
    make_lease(job=make_job(buyer=buyer), cluster=busy, cards=8, start_at=at(9), end_at=at(13))
    job = make_job(
        buyer=buyer,
        accelerators=[A800, "nvidia-h20"],
        fabrics=["infiniband"],
        latency_budget_ms=10,
        max_price_per_card_hour=Decimal("50"),
        earliest_start_at=at(10),
        deadline_at=at(12),
        duration_seconds=7200,
        # Below the shaky cluster's 90 %, above the others' prior (99.0 %: no score stored).
        min_reliability=Decimal("98.5"),
    )
    result = find(job)
    assert result.rejections == {
        "offline": 2,
        "chip": 1,
        "memory": 0,
        "fabric": 1,
        "latency": 1,
        "unpriced": 1,
        "reliability": 1,
        "price": 1,
        "capacity": 2,
        "window": 0,
    }
    assert [p.cluster_cpi for p in result.placements] == [good.cpi]
    assert result.considered == 11 and result.feasible == 1
    memory_job = make_job(
        buyer=buyer,
        min_memory_gb=Decimal("96"),
        earliest_start_at=at(10),
        deadline_at=at(12),
        duration_seconds=7200,
    )
    memory = find(memory_job)
    assert memory.rejections["memory"] == 9 and memory.rejections["chip"] == 0  # the L20 has 48 GB
    # Too little TFLOPS is the chip's fault.
    assert (
        find(
            make_job(
                buyer=buyer,
                min_fp16_tflops=Decimal("500"),
                earliest_start_at=at(10),
                deadline_at=at(12),
                duration_seconds=7200,
            )
        ).rejections["chip"]
        == 9
    )  # the two offline ones count as offline


def test_a_window_that_has_passed_rejects_everything_as_window(
    buyer: Organisation, east_cluster: Cluster
) -> None:
    job = make_job(buyer=buyer, earliest_start_at=at(10), deadline_at=at(12), duration_seconds=7200)
    result = find(job, now=at(10, 1))
    assert result.placements == ()
    assert result.rejections["window"] == 2


def test_standard_cards_are_matched_across_chips_by_their_factor(
    buyer: Organisation, east_cluster: Cluster, h800_cluster: Cluster
) -> None:
    job = make_job(
        buyer=buyer,
        cards=None,
        standard_cards=Decimal("6"),
        earliest_start_at=at(12),
        deadline_at=at(14),
        duration_seconds=7200,
    )
    result = find(job, latency_budget_ms=100)
    cards = {p.cluster_cpi: p.cards for p in result.placements}
    # A800: factor 0.78 → ⌈6 / 0.78⌉ = 8 cards; H800: factor 2.4735 → ⌈6 / 2.4735⌉ = 3 cards.
    assert cards == {east_cluster.cpi: 8, h800_cluster.cpi: 3}
    h800 = next(p for p in result.placements if p.cluster_cpi == h800_cluster.cpi)
    assert h800.cost == Decimal("180.00")  # 3 × 2 h × 30 flat
    assert h800.standard_card_factor == Decimal("2.4735")
    # A cap per standard card-hour: the H800 costs 180 / (3 × 2.4735 × 2) = 12.13; the A800 at 12:00–14:00
    # (flat) 8 × 2 × 12 / (8 × 0.78 × 2) = 15.38.
    capped = find(job, latency_budget_ms=100, max_price_per_card_hour=Decimal("13"))
    assert [p.cluster_cpi for p in capped.placements] == [h800_cluster.cpi]
    assert capped.rejections["price"] == 2


def test_a_chip_without_public_figures_cannot_serve_standard_cards(
    buyer: Organisation, east_operator: Organisation, presets: None
) -> None:
    secret = make_cluster(
        operator=east_operator, hub="yrd", name="k100", accelerator="hygon-dcu-k100", islands=[("isl-01", 16)]
    )
    make_price_card(cluster=secret, rate="5.0000")
    job = make_job(
        buyer=buyer,
        cards=None,
        standard_cards=Decimal("2"),
        earliest_start_at=at(10),
        deadline_at=at(12),
        duration_seconds=7200,
    )
    assert find(job).rejections["chip"] == 1
    by_cards = make_job(
        buyer=buyer, cards=4, earliest_start_at=at(10), deadline_at=at(12), duration_seconds=7200
    )
    assert find(by_cards).placements[0].cluster_cpi == secret.cpi


def test_gang_placement_never_splits_an_island(buyer: Organisation, east_cluster: Cluster) -> None:
    job = make_job(buyer=buyer, cards=10, earliest_start_at=at(10), deadline_at=at(12), duration_seconds=7200)
    result = find(job)
    assert result.placements == ()
    assert result.rejections["capacity"] == 2  # two islands of 8
    spanning = find(
        make_job(
            buyer=buyer,
            cards=10,
            gang="cluster",
            earliest_start_at=at(10),
            deadline_at=at(12),
            duration_seconds=7200,
        )
    )
    (placement,) = spanning.placements
    assert placement.cards == 10
    assert sorted(cards for _, cards in placement.allocation) == [2, 8]
    assert len({island for island, _ in placement.allocation}) == 2


def test_spanning_counts_only_cards_free_for_the_whole_run(
    buyer: Organisation, east_cluster: Cluster
) -> None:
    isl1 = east_cluster.islands.get(name="isl-01")
    make_lease(
        job=make_job(buyer=buyer),
        cluster=east_cluster,
        cards=5,
        island="isl-01",
        start_at=at(11),
        end_at=at(11, 30),
    )
    job = make_job(
        buyer=buyer,
        cards=12,
        gang="cluster",
        earliest_start_at=at(10),
        deadline_at=at(12),
        duration_seconds=7200,
    )
    assert find(job).placements == ()  # 3 + 8 < 12 while the hold lasts
    job = make_job(
        buyer=buyer,
        cards=11,
        gang="cluster",
        earliest_start_at=at(10),
        deadline_at=at(12),
        duration_seconds=7200,
    )
    (placement,) = find(job).placements
    assert dict(placement.allocation)[isl1.pk] == 3


def test_holds_push_the_start_past_them(
    buyer: Organisation, east_operator: Organisation, presets: None
) -> None:
    cluster = make_cluster(operator=east_operator, hub="yrd", name="one", islands=[("isl-01", 8)])
    make_price_card(cluster=cluster, rate="10.0000", tariff_code="flat")
    make_lease(job=make_job(buyer=buyer), cluster=cluster, cards=4, start_at=at(10), end_at=at(11, 10))
    job = make_job(buyer=buyer, cards=6, earliest_start_at=at(10), deadline_at=at(16), duration_seconds=3600)
    (placement,) = find(job).placements
    # Flat tariff: every start costs the same, so the earliest feasible one wins; the hold ends at 11:10,
    # and the quote rounds it out to the 11:15 slot edge.
    assert placement.start_at == at(11, 15)
    assert placement.saving == Decimal("0.00")
    # Four cards still fit beside the hold from the start.
    small = make_job(
        buyer=buyer, cards=4, earliest_start_at=at(10), deadline_at=at(16), duration_seconds=3600
    )
    assert find(small).placements[0].start_at == at(10)


def test_a_full_island_is_a_capacity_rejection(buyer: Organisation, east_cluster: Cluster) -> None:
    for island in ("isl-01", "isl-02"):
        make_lease(
            job=make_job(buyer=buyer),
            cluster=east_cluster,
            cards=8,
            island=island,
            start_at=at(9),
            end_at=at(13),
        )
    job = make_job(buyer=buyer, earliest_start_at=at(10), deadline_at=at(13), duration_seconds=7200)
    result = find(job)
    assert result.placements == ()
    assert result.rejections["capacity"] == 2
    later = find(job, deadline_at=at(16))
    assert {p.start_at for p in later.placements} == {at(13)}


def test_unhealthy_cards_are_not_offered(buyer: Organisation, east_cluster: Cluster) -> None:
    from federation.models import Island

    Island.objects.filter(cluster=east_cluster).update(unhealthy_cards=1)
    job = make_job(buyer=buyer, earliest_start_at=at(10), deadline_at=at(12), duration_seconds=7200)
    assert find(job).rejections["capacity"] == 2


def test_limit_caps_the_quotes_and_excluded_clusters_are_not_counted(
    buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster
) -> None:
    job = make_job(buyer=buyer, earliest_start_at=at(10), deadline_at=at(12), duration_seconds=7200)
    assert len(find(job, limit=3).placements) == 3
    result = find(job, exclude_clusters=frozenset({west_cluster.pk}))
    assert {p.cluster_cpi for p in result.placements} == {east_cluster.cpi}
    assert result.considered == 2


def test_a_20_ms_budget_from_the_yangtze_river_delta_keeps_wuhu_and_leaves_gansu_and_ningxia(
    buyer: Organisation, west_operator: Organisation, presets: None
) -> None:
    """The east-to-west split on the seeded matrix: Wuhu is the yrd hub's second cluster (the same-hub
    5 ms tier); Qingyang (gs, 20.2 ms estimated) and Zhongwei (nx, 24.3 ms) are beyond a 20 ms budget and
    within a 25 ms one."""
    wuhu = make_cluster(
        operator=west_operator, hub="yrd", name="wh-ai01", islands=[("isl-01", 8)], site="Wuhu"
    )
    qingyang = make_cluster(
        operator=west_operator, hub="gs", name="qy-ai01", islands=[("isl-01", 8)], site="Qingyang"
    )
    zhongwei = make_cluster(
        operator=west_operator, hub="nx", name="zw-ai02", islands=[("isl-01", 8)], site="Zhongwei"
    )
    for cluster in (wuhu, qingyang, zhongwei):
        make_price_card(cluster=cluster, rate="10.0000", tariff_code="flat")
    job = make_job(
        buyer=buyer, origin_hub="yrd", earliest_start_at=at(10), deadline_at=at(12), duration_seconds=7200
    )

    within_20 = find(job, latency_budget_ms=20)
    assert {(p.cluster_cpi, p.latency_ms) for p in within_20.placements} == {(wuhu.cpi, Decimal("5.000"))}
    assert within_20.rejections["latency"] == 2

    within_25 = find(job, latency_budget_ms=25)
    assert {(p.cluster_cpi, p.latency_ms) for p in within_25.placements} == {
        (wuhu.cpi, Decimal("5.000")),
        (qingyang.cpi, Decimal("20.200")),
        (zhongwei.cpi, Decimal("24.300")),
    }
