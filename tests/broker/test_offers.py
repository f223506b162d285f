"""Quotes a buyer understands (issue 15): a job pinned to one cluster, the relaxations that would produce a
quote when nothing fits, what a job keeps of its latest quote request, the earliest possible start of an
offer and its cost at every start of the window. Time is pinned to a March 2027 day, as in
test_matching.py."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from rest_framework.test import APIClient

from broker.errors import JobInvalidError
from broker.services import jobs as job_services
from broker.services.jobs import JobInput, job_spec
from broker.services.quotes import placements_find, quote_create, start_costs_find
from broker.services.relaxations import MAX_TRIES, relaxations_find
from broker.types import JobSpec, MatchResult
from core.models import Organisation
from core.types import Actor
from federation.models import Cluster
from federation.services import cluster_status_set
from tests.broker.conftest import A800, H800
from tests.broker.factories import make_job, make_lease

SHANGHAI = ZoneInfo("Asia/Shanghai")
DAY = datetime(2027, 3, 10, tzinfo=SHANGHAI)  # a Wednesday


def at(hour: int, minute: int = 0, days: int = 0) -> datetime:
    return DAY + timedelta(days=days, hours=hour, minutes=minute)


def relaxations(job, now: datetime):  # type: ignore[no-untyped-def]
    return quote_create(job=job, now=now).relaxations


def summary_of(relaxation):  # type: ignore[no-untyped-def]
    return (relaxation.kind, relaxation.changes, relaxation.cluster_cpi, relaxation.start_at, relaxation.cost)


# --- Pinning a cluster ------------------------------------------------------------------------------------


def job_posted(
    client: APIClient, name: str, *, latency_budget_ms: int, hours: int, duration_seconds: int
) -> dict[str, Any]:
    """A job of 8 cards from the Yangtze delta, due ``hours`` from now, created over the API."""
    from django.utils import timezone

    body = {
        "name": name,
        "cards": 8,
        "origin_hub": "yrd",
        "latency_budget_ms": latency_budget_ms,
        "deadline_at": (timezone.now() + timedelta(hours=hours)).isoformat(),
        "duration_seconds": duration_seconds,
    }
    job: dict[str, Any] = client.post("/api/v1/jobs", body, format="json").json()
    return job


def test_a_pinned_job_is_quoted_only_on_its_cluster(
    buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster
) -> None:
    free = make_job(buyer=buyer, earliest_start_at=at(0), deadline_at=at(0, days=1), duration_seconds=3600)
    pinned = make_job(
        buyer=buyer,
        earliest_start_at=at(0),
        deadline_at=at(0, days=1),
        duration_seconds=3600,
        cluster=east_cluster,
    )
    assert job_spec(job=pinned).only_cluster == east_cluster.pk
    everywhere = placements_find(spec=job_spec(job=free), now=at(0), distinct=True)
    assert [p.cluster_cpi for p in everywhere.placements] == [west_cluster.cpi, east_cluster.cpi]
    only = placements_find(spec=job_spec(job=pinned), now=at(0), distinct=True)
    assert [p.cluster_cpi for p in only.placements] == [east_cluster.cpi]
    # The other clusters' islands are not examined, so not counted as rejected either.
    assert (only.considered, only.feasible, sum(only.rejections.values())) == (2, 2, 0)
    cards16 = placements_find(spec=replace(job_spec(job=pinned), cards=16), now=at(0), distinct=True)
    assert (cards16.placements, cards16.considered, cards16.rejections["capacity"]) == ((), 2, 2)


def test_a_job_is_pinned_by_its_cluster_identifier_and_an_unknown_one_is_refused(
    buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster
) -> None:
    actor = Actor(organisation=buyer, system_label="test")
    now = at(0)

    def data(cluster: str) -> JobInput:
        return JobInput(
            name="pinned",
            origin_hub="yrd",
            latency_budget_ms=100,
            deadline_at=now + timedelta(hours=6),
            duration_seconds=3600,
            cards=8,
            cluster=cluster,
        )

    job, created = job_services.job_create(buyer=buyer, data=data(west_cluster.cpi), actor=actor, now=now)
    assert created and job.cluster_id == west_cluster.pk
    cluster_status_set(
        cluster=east_cluster,
        status="retired",
        actor=Actor(organisation=east_cluster.operator, system_label="t"),
        reason="retired for the test",
    )
    for cpi in ("cpi:ctyun:yrd:nowhere", east_cluster.cpi, "not a cpi"):
        with pytest.raises(JobInvalidError) as refused:
            job_services.job_create(buyer=buyer, data=data(cpi), actor=actor, now=now)
        assert refused.value.extra["errors"] == [
            {
                "field": "cluster",
                "code": "unknown_cluster",
                "message": f"No cluster {cpi!r} is listed on the market.",
            }
        ]


def test_the_api_pins_a_job_and_shows_the_pin(
    funded_buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster, token_client
) -> None:
    client: APIClient = token_client(funded_buyer)
    from django.utils import timezone

    body = {
        "name": "pinned",
        "cards": 8,
        "origin_hub": "yrd",
        "latency_budget_ms": 100,
        "deadline_at": (timezone.now() + timedelta(hours=6)).isoformat(),
        "duration_seconds": 3600,
    }
    response = client.post("/api/v1/jobs", {**body, "cluster": east_cluster.cpi}, format="json")
    assert response.status_code == 201, response.json()
    job = response.json()
    assert job["cluster"] == east_cluster.cpi
    quotes = client.post(f"/api/v1/jobs/{job['id']}/quotes", {}, format="json").json()
    assert [q["cluster"] for q in quotes["quotes"]] == [east_cluster.cpi]
    unpinned = client.post("/api/v1/jobs", body, format="json").json()
    assert unpinned["cluster"] is None
    unknown = client.post("/api/v1/jobs", {**body, "cluster": "cpi:ctyun:yrd:nowhere"}, format="json")
    assert unknown.status_code == 400
    assert unknown.json()["code"] == "job_invalid"
    assert [e["code"] for e in unknown.json()["extra"]["errors"]] == ["unknown_cluster"]
    malformed = client.post("/api/v1/jobs", {**body, "cluster": "CPI:Upper"}, format="json")
    assert malformed.status_code == 400 and "cluster" in malformed.json()["extra"]["fields"]


# --- What a job keeps of its latest quote request ---------------------------------------------------------


def test_the_job_keeps_its_latest_quote_summary_and_the_api_returns_it(
    funded_buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster, token_client
) -> None:
    client: APIClient = token_client(funded_buyer)
    job = job_posted(client, "near", latency_budget_ms=10, hours=6, duration_seconds=3600)
    assert client.get(f"/api/v1/jobs/{job['id']}").json()["quote_summary"] is None
    quoted = client.post(f"/api/v1/jobs/{job['id']}/quotes", {}, format="json").json()
    detail = client.get(f"/api/v1/jobs/{job['id']}").json()["quote_summary"]
    assert detail == {
        "quoted_at": detail["quoted_at"],
        "expires_at": quoted["expires_at"],
        "considered": 4,
        "feasible": 2,
        "offers": 1,
        "rejections": {
            "offline": 0,
            "chip": 0,
            "memory": 0,
            "fabric": 0,
            "latency": 2,
            "unpriced": 0,
            "reliability": 0,
            "price": 0,
            "capacity": 0,
            "window": 0,
        },
        "window_start_at": quoted["window"]["start_at"],
        "window_end_at": quoted["window"]["end_at"],
        "relaxations": [],
    }
    assert quoted["relaxations"] == []


# --- Relaxations --------------------------------------------------------------------------------------------


def test_nothing_fits_and_the_nearest_latency_spanning_and_fewer_cards_would(
    buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster
) -> None:
    """16 cards from yrd within 10 ms: east (yrd, islands of 8) is too small, west (nx, 24.3 ms away,
    islands of 32) too far. A 25 ms budget brings west in (16 × 9 × valley 0.5 = ¥72.00 at midnight);
    spanning east's two islands fits (16 × 12 × 0.38 = ¥72.96); and 8 cards fit on one of east's
    islands (¥36.48): the binary search's four tries find it (8 fits, 12, 10 and 9 do not)."""
    job = make_job(
        buyer=buyer,
        cards=16,
        latency_budget_ms=10,
        earliest_start_at=at(0),
        deadline_at=at(0, days=1),
        duration_seconds=3600,
    )
    found = relaxations(job, now=at(0))
    assert [summary_of(r) for r in found] == [
        ("latency", {"latency_budget_ms": 25}, west_cluster.cpi, at(0), Decimal("72.00")),
        ("gang", {"gang": "cluster"}, east_cluster.cpi, at(0), Decimal("72.96")),
        ("cards", {"cards": 8}, east_cluster.cpi, at(0), Decimal("36.48")),
    ]
    job.refresh_from_db()
    assert job.quote_summary["offers"] == 0
    assert (
        job.quote_summary["rejections"]["latency"] == 2 and job.quote_summary["rejections"]["capacity"] == 2
    )
    assert job.quote_summary["relaxations"][0] == {
        "kind": "latency",
        "changes": {"latency_budget_ms": 25},
        "cluster": west_cluster.cpi,
        "accelerator": A800,
        "start_at": at(0).astimezone(UTC).isoformat(),  # stored in UTC
        "cost": "72.00",
    }


def test_another_chip_and_a_higher_cap_are_suggested_with_what_they_need(
    buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster
) -> None:
    window = {"earliest_start_at": at(0), "deadline_at": at(0, days=1), "duration_seconds": 3600}
    h800 = make_job(buyer=buyer, accelerators=[H800], **window)
    assert [summary_of(r) for r in relaxations(h800, now=at(0))] == [
        ("chip", {"accelerators": [A800], "min_fp16_tflops": None}, west_cluster.cpi, at(0), Decimal("36.00"))
    ]
    # West averages 9 × 0.5 = ¥4.50 per card-hour at its cheapest start, east 12 × 0.38 = ¥4.56.
    capped = make_job(buyer=buyer, max_price_per_card_hour=Decimal("4.00"), **window)
    assert [summary_of(r) for r in relaxations(capped, now=at(0))] == [
        ("price", {"max_price_per_card_hour": "4.50"}, west_cluster.cpi, at(0), Decimal("36.00"))
    ]


def test_a_full_window_suggests_the_deadline_the_first_free_run_ends_by(
    buyer: Organisation, east_cluster: Cluster
) -> None:
    """Both of east's islands are held 00:00–03:00; a one-hour job due by 02:00 fits nowhere. Up to the
    planning horizon, the first free valley hour is 03:00–04:00 (8 × 12 × 0.38 = ¥36.48): the deadline
    04:00. Spanning and fewer cards do not help (every card is held)."""
    for island in ("isl-01", "isl-02"):
        make_lease(
            job=make_job(buyer=buyer), cluster=east_cluster, island=island, start_at=at(0), end_at=at(3)
        )
    job = make_job(buyer=buyer, earliest_start_at=at(0), deadline_at=at(2), duration_seconds=3600)
    assert [summary_of(r) for r in relaxations(job, now=at(0))] == [
        ("window", {"deadline_at": at(4).isoformat()}, east_cluster.cpi, at(3), Decimal("36.48"))
    ]


def test_a_pinned_job_that_cannot_fit_its_cluster_is_offered_any_cluster(
    buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster
) -> None:
    job = make_job(
        buyer=buyer,
        cards=16,
        cluster=east_cluster,
        earliest_start_at=at(0),
        deadline_at=at(0, days=1),
        duration_seconds=3600,
    )
    found = relaxations(job, now=at(0))
    assert [r.kind for r in found] == ["cluster", "gang", "cards"]
    assert summary_of(found[0]) == ("cluster", {"cluster": ""}, west_cluster.cpi, at(0), Decimal("72.00"))


def test_the_search_is_bounded(buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster) -> None:
    """Whatever the rejections, at most MAX_TRIES matcher runs."""
    job = make_job(
        buyer=buyer,
        cards=1000,
        accelerators=[H800],
        min_memory_gb=Decimal("500"),
        fabrics=["hccs"],
        latency_budget_ms=1,
        max_price_per_card_hour=Decimal("0.01"),
        cluster=east_cluster,
        earliest_start_at=at(0),
        deadline_at=at(1),
        duration_seconds=3600,
    )
    spec = job_spec(job=job)
    runs: list[JobSpec] = []

    def find(changed: JobSpec) -> MatchResult:
        runs.append(changed)
        return placements_find(spec=changed, now=at(0), limit=1, distinct=True)

    everything = MatchResult(
        placements=(),
        rejections=dict.fromkeys(("chip", "memory", "fabric", "latency", "price", "capacity", "window"), 1),
        considered=7,
        feasible=0,
        window_start_at=at(0),
        window_end_at=at(1),
    )
    assert relaxations_find(spec=spec, result=everything, find=find, now=at(0)) == []
    assert len(runs) == MAX_TRIES == 10


@pytest.mark.parametrize("accept", ["application/json", "application/json; indent=2"])
def test_every_time_in_a_quote_answer_is_given_in_one_zone(
    funded_buyer: Organisation, east_cluster: Cluster, token_client, accept: str
) -> None:
    """The earliest feasible start is kept as text in the quote's breakdown; it is shown in the answer's
    zone like every other time (it came out in UTC beside +08:00 starts), by the hand-written answer and
    by DRF's (an ``indent`` asks for DRF's)."""
    client: APIClient = token_client(funded_buyer)
    job = job_posted(client, "zones", latency_budget_ms=100, hours=30, duration_seconds=7200)
    answer = client.post(f"/api/v1/jobs/{job['id']}/quotes", {}, format="json", HTTP_ACCEPT=accept).json()
    (quote,) = answer["quotes"]
    times = [quote[k] for k in ("start_at", "end_at", "earliest_feasible_start_at", "expires_at")]
    times += [answer["window"]["start_at"], answer["window"]["end_at"], answer["expires_at"]]
    assert {t[-6:] for t in times} == {"+08:00"}, times
    earliest = datetime.fromisoformat(quote["earliest_feasible_start_at"])
    assert earliest <= datetime.fromisoformat(quote["start_at"])


# --- The earliest possible start, and the cost at every start ---------------------------------------------


def test_an_offer_knows_its_earliest_possible_start_and_its_cost_there(
    buyer: Organisation, east_cluster: Cluster
) -> None:
    """Two hours from a 10:00 peak: the valley start is midnight (¥72.96); starting at 10:00 on the same
    offer would cost ¥326.40. With isl-01 held 10:00–11:00 the offer's earliest start is still 10:00 (on
    isl-02)."""
    make_lease(job=make_job(buyer=buyer), cluster=east_cluster, start_at=at(10), end_at=at(11))
    job = make_job(buyer=buyer, earliest_start_at=at(10), deadline_at=at(10, days=1), duration_seconds=7200)
    (offer,) = placements_find(spec=job_spec(job=job), now=at(10), distinct=True).placements
    assert (offer.start_at, offer.cost) == (at(0, days=1), Decimal("72.96"))
    assert (offer.earliest_feasible_start_at, offer.earliest_feasible_cost) == (at(10), Decimal("326.40"))
    assert offer.saving == Decimal("253.44")
    assert offer.islands_available == 2


def test_start_costs_price_every_start_and_leave_out_the_held_ones(
    buyer: Organisation, east_cluster: Cluster
) -> None:
    job = make_job(buyer=buyer, earliest_start_at=at(10), deadline_at=at(10, days=1), duration_seconds=7200)
    islands = tuple(east_cluster.islands.order_by("name").values_list("pk", flat=True))
    spec = job_spec(job=job)
    curve = start_costs_find(spec=spec, cluster_id=east_cluster.pk, island_ids=islands, cards=8, now=at(10))
    assert curve is not None
    assert (curve.starts[0], curve.starts[-1], len(curve.starts)) == (at(10), at(8, days=1), 89)
    by_start = dict(zip(curve.starts, curve.costs, strict=True))
    assert (by_start[at(10)], by_start[at(0, days=1)]) == (Decimal("326.40"), Decimal("72.96"))
    # One island held over midnight: the other still takes it. Both held: those starts are gone.
    for island in ("isl-01", "isl-02"):
        make_lease(
            job=make_job(buyer=buyer),
            cluster=east_cluster,
            island=island,
            start_at=at(0, days=1),
            end_at=at(1, days=1),
        )
        curve = start_costs_find(
            spec=spec, cluster_id=east_cluster.pk, island_ids=islands, cards=8, now=at(10)
        )
        assert curve is not None
        held = [start for start, cost in zip(curve.starts, curve.costs, strict=True) if cost is None]
        if island == "isl-01":
            assert held == []
        else:  # runs of two hours that touch 00:00–01:00: from 22:15 to 00:45
            assert held == [at(22, 15) + timedelta(minutes=15 * k) for k in range(11)]
    assert start_costs_find(spec=spec, cluster_id=0, island_ids=islands, cards=8, now=at(10)) is None


def test_a_spanning_placements_costs_are_priced_at_every_start(
    buyer: Organisation, east_cluster: Cluster
) -> None:
    job = make_job(
        buyer=buyer,
        cards=16,
        gang="cluster",
        earliest_start_at=at(10),
        deadline_at=at(10, days=1),
        duration_seconds=7200,
    )
    curve = start_costs_find(
        spec=job_spec(job=job), cluster_id=east_cluster.pk, island_ids=(), cards=16, now=at(10)
    )
    assert curve is not None and None not in curve.costs
    assert (curve.costs[0], dict(zip(curve.starts, curve.costs, strict=True))[at(0, days=1)]) == (
        Decimal("652.80"),
        Decimal("145.92"),
    )
