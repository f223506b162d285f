"""The operator's heartbeat-reported available cards (K2) limit what the matcher offers and what acceptance
takes for starts before the report expires (last heartbeat + interval × missed limit: 90 s here); later
starts, stale reports and clusters that never beat use the declared cards. Cardhour's own holds count as
available in a report, so they are subtracted once. Time is pinned to a March 2027 night in Shanghai
(Guangdong's valley runs 00:00–08:00, so the cheapest start of a short job is its earliest feasible one)."""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone

from broker.errors import CapacityTakenError
from broker.services.jobs import job_spec
from broker.services.quotes import placements_find
from core.models import Organisation
from core.types import Actor
from federation.models import Cluster, ClusterStatus
from federation.services import heartbeat_record
from federation.types import IslandReport
from tests.broker.factories import make_job, make_lease

SHANGHAI = ZoneInfo("Asia/Shanghai")
DAY = datetime(2027, 3, 10, tzinfo=SHANGHAI)  # a Wednesday
TTL = timedelta(seconds=90)  # CARDHOUR_HEARTBEAT_INTERVAL_SECONDS 30 × CARDHOUR_HEARTBEAT_MISSED_LIMIT 3


def at(hour: int, minute: int = 0, second: int = 0) -> datetime:
    return DAY + timedelta(hours=hour, minutes=minute, seconds=second)


def beat(cluster: Cluster, *, now: datetime, **available: int) -> None:
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


def starts(buyer: Organisation, *, cards: int, now: datetime) -> dict[str, datetime]:
    """Island CPI → the start the matcher offers for a 2-hour job of ``cards`` cards from ``now``."""
    job = make_job(buyer=buyer, cards=cards, earliest_start_at=now, deadline_at=now + timedelta(hours=6))
    result = placements_find(spec=job_spec(job=job), now=now, limit=10)
    return {placement.island_cpis[0]: placement.start_at for placement in result.placements}


ISL_01 = "cpi:ctyun:yrd:sh-ai01:isl-01"
ISL_02 = "cpi:ctyun:yrd:sh-ai01:isl-02"


# --- The matcher ----------------------------------------------------------------------------------------


def test_reported_cards_limit_starts_before_the_next_heartbeat_and_later_starts_use_declared(
    buyer: Organisation, east_cluster: Cluster
) -> None:
    """East: two islands of 8. The operator reports 2 of isl-01's 8 cards available at 00:00:00."""
    beat(east_cluster, now=at(0), isl_01=2, isl_02=8)

    # A start at 00:00:30 is before the report expires (00:01:30): isl-01 cannot take 8 cards then, so
    # its offer moves to the next step (00:15:30, after the expiry: declared cards), isl-02's stays.
    assert starts(buyer, cards=8, now=at(0, 0, 30)) == {ISL_02: at(0, 0, 30), ISL_01: at(0, 15, 30)}
    # 2 cards fit the report.
    assert starts(buyer, cards=2, now=at(0, 0, 30)) == {ISL_01: at(0, 0, 30), ISL_02: at(0, 0, 30)}
    # A job whose earliest start is after the expiry sees the declared cards.
    job = make_job(buyer=buyer, cards=8, earliest_start_at=at(0, 2), deadline_at=at(6))
    later = placements_find(spec=job_spec(job=job), now=at(0, 0, 30), limit=10)
    assert {p.island_cpis[0]: p.start_at for p in later.placements} == {ISL_01: at(0, 2), ISL_02: at(0, 2)}


def test_a_stale_report_and_no_report_leave_the_declared_cards(
    buyer: Organisation, east_cluster: Cluster
) -> None:
    # Never beat: only the declared cards count.
    assert starts(buyer, cards=8, now=at(0)) == {ISL_01: at(0), ISL_02: at(0)}
    # A report 90 s old has expired (the heartbeat monitor takes such a cluster offline on its next run):
    # declared cards again, until the cluster is offline and sells nothing at all.
    beat(east_cluster, now=at(0), isl_01=0)
    assert starts(buyer, cards=8, now=at(0) + TTL) == {ISL_01: at(0) + TTL, ISL_02: at(0) + TTL}
    assert starts(buyer, cards=8, now=at(0) + TTL - timedelta(seconds=1)) == {
        ISL_02: at(0) + TTL - timedelta(seconds=1),
        ISL_01: at(0, 16, 29),
    }
    Cluster.objects.filter(pk=east_cluster.pk).update(status=ClusterStatus.OFFLINE)
    assert starts(buyer, cards=1, now=at(0) + TTL) == {}


def test_cardhours_own_holds_count_as_available_once(buyer: Organisation, east_cluster: Cluster) -> None:
    """A lease of 3 cards runs on isl-01 00:00–04:00. The operator's own work uses 1 card, so it reports
    8 − 1 = 7 available (the lease's 3 included): 7 − 3 = 4 cards are left for a start now."""
    make_lease(job=make_job(buyer=buyer, cards=3), cluster=east_cluster, start_at=at(0), end_at=at(4))
    beat(east_cluster, now=at(0), isl_01=7)

    assert starts(buyer, cards=4, now=at(0, 0, 10))[ISL_01] == at(0, 0, 10)
    # 5 cards: not before the report expires (00:01:30); from the next step the declared cards leave 5.
    assert starts(buyer, cards=5, now=at(0, 0, 10))[ISL_01] == at(0, 15, 10)
    assert starts(buyer, cards=5, now=at(0, 1, 30))[ISL_01] == at(0, 1, 30)


def test_spanning_jobs_respect_the_report_too(buyer: Organisation, east_cluster: Cluster) -> None:
    beat(east_cluster, now=at(0), isl_01=3, isl_02=4)
    job = make_job(buyer=buyer, cards=12, gang="cluster", earliest_start_at=at(0), deadline_at=at(6))
    result = placements_find(spec=job_spec(job=job), now=at(0), limit=10)
    [placement] = result.placements
    assert placement.start_at == at(0, 15)  # 3 + 4 = 7 reported now; 16 declared from 00:15
    assert list(zip(placement.island_cpis, (c for _, c in placement.allocation), strict=True)) == [
        (ISL_01, 8),
        (ISL_02, 4),
    ]
    job_now = make_job(buyer=buyer, cards=7, gang="cluster", earliest_start_at=at(0), deadline_at=at(6))
    [now_placement] = placements_find(spec=job_spec(job=job_now), now=at(0), limit=10).placements
    assert now_placement.start_at == at(0)
    assert list(zip(now_placement.island_cpis, (c for _, c in now_placement.allocation), strict=True)) == [
        (ISL_02, 4),
        (ISL_01, 3),
    ]


# --- Acceptance ------------------------------------------------------------------------------------------


def test_acceptance_refuses_cards_the_operator_reports_busy_with_numbers(
    buyer: Organisation, east_cluster: Cluster
) -> None:
    now = timezone.now().replace(microsecond=0)
    make_lease(
        job=make_job(buyer=buyer, cards=2),
        cluster=east_cluster,
        start_at=now,
        end_at=now + timedelta(hours=1),
    )
    beat(east_cluster, now=now, isl_01=5, isl_02=8)  # 3 cards of isl-01 busy with the operator's own work

    with pytest.raises(CapacityTakenError) as refused:
        make_lease(job=make_job(buyer=buyer, cards=4), cluster=east_cluster, start_at=now)
    assert refused.value.code == "capacity_taken"
    assert refused.value.extra == {
        "island": ISL_01,
        "free_cards": 3,
        "cards": 4,
        "reported_available_cards": 5,
        "report_expires_at": (now + TTL).isoformat(),
    }
    assert "has 3 free cards until its operator's next heartbeat is due" in str(refused.value)
    # What the report leaves is taken; a start after the report expires uses the declared cards.
    make_lease(job=make_job(buyer=buyer, cards=3), cluster=east_cluster, start_at=now)
    make_lease(job=make_job(buyer=buyer, cards=3), cluster=east_cluster, start_at=now + TTL)  # 2 + 3 + 3
    with pytest.raises(CapacityTakenError):
        make_lease(job=make_job(buyer=buyer, cards=1), cluster=east_cluster, start_at=now + TTL)


def test_a_lease_starting_before_the_expiry_is_checked_only_up_to_it(
    buyer: Organisation, east_cluster: Cluster
) -> None:
    """A reserved lease 2 min from now takes 6 cards; the report (5 available) binds the first 90 s of a
    lease starting now, which do not overlap it: the 8 − 6 = 2 declared cards are what limits it."""
    now = timezone.now().replace(microsecond=0)
    make_lease(job=make_job(buyer=buyer, cards=6), cluster=east_cluster, start_at=now + timedelta(minutes=2))
    beat(east_cluster, now=now, isl_01=5)
    make_lease(job=make_job(buyer=buyer, cards=2), cluster=east_cluster, start_at=now)
    with pytest.raises(CapacityTakenError) as refused:
        make_lease(job=make_job(buyer=buyer, cards=1), cluster=east_cluster, start_at=now)
    assert refused.value.extra == {"island": ISL_01, "free_cards": 0, "cards": 1}
