"""Reliability in placement (issue 16 item 4): the per-cluster score computed from lease records against a
hand calculation, the prior of a new cluster, a job's minimum rejecting a cluster under its own counted
reason, the score on quotes (API), and ranking by cost less the expected SLA credit."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from decimal import ROUND_FLOOR, Decimal

import numpy as np
import pytest
from django.test import override_settings
from django.utils import timezone
from django_celery_beat.models import PeriodicTask
from rest_framework.test import APIClient

from broker.catalog import market
from broker.matching import match
from broker.models import ClusterReliability, Job, Lease, LeaseState
from broker.services.dispatch import LeaseUsageInput, lease_usage_report
from broker.services.failover import leases_fail_over
from broker.services.jobs import job_spec
from broker.services.leases import lease_transition
from broker.services.quotes import _tariff, placements_find, quote_create
from broker.services.reliability import cluster_reliability_refresh
from broker.tasks import reliability_refresh
from core.models import Organisation
from core.types import Actor
from federation.models import Cluster, ClusterStatus
from federation.services import cluster_status_set, clusters_mark_missed_heartbeats
from metering.models import PriceCard, Tariff
from metering.services.tariffs import price_card_set
from tests.broker.factories import make_job, make_lease, make_reliability
from tests.factories import make_cluster
from tests.metering.factories import make_price_card

TEST = Actor.system("test")
H = timedelta(hours=1)


def _transition(lease: Lease, to_state: str, at: datetime) -> None:
    lease.refresh_from_db()
    lease_transition(lease=lease, to_state=to_state, actor=TEST, at=at)


def _take_offline(cluster: Cluster) -> None:
    """The heartbeat monitor's way: the cluster's last heartbeat is long past."""
    long_ago = timezone.now() - timedelta(hours=1)
    Cluster.objects.filter(pk=cluster.pk).update(last_heartbeat_at=long_ago, last_heartbeat_sent_at=long_ago)
    Cluster.objects.exclude(pk=cluster.pk).update(last_heartbeat_at=timezone.now())
    assert clusters_mark_missed_heartbeats(now=timezone.now()) == [cluster.cpi]


@pytest.fixture
def two_islands(east_operator: Organisation, presets: None) -> Cluster:
    cluster = make_cluster(
        operator=east_operator, hub="yrd", name="rel-01", islands=[("isl-01", 8), ("isl-02", 8)]
    )
    make_price_card(cluster=cluster, rate="10.0000", tariff_code="flat")
    PriceCard.objects.filter(cluster=cluster).update(
        effective_from=timezone.now().replace(microsecond=0) - timedelta(days=40)
    )
    return cluster


@override_settings(
    CARDHOUR_RELIABILITY_PRIOR_CARD_HOURS=Decimal(10), CARDHOUR_RELIABILITY_PRIOR_PERCENT=Decimal(99)
)
def test_the_score_matches_a_hand_calculation_over_the_window(
    two_islands: Cluster, buyer: Organisation, east_operator: Organisation, presets: None
) -> None:
    cluster = two_islands
    t = timezone.now().replace(microsecond=0)  # the refresh's "now", pinned
    job = make_job(
        buyer=buyer, earliest_start_at=t - timedelta(days=31), deadline_at=t + timedelta(days=1), cards=8
    )

    def lease(start: timedelta, end: timedelta, *, island: str, cards: int = 8) -> Lease:
        return make_lease(
            job=job, cluster=cluster, start_at=t + start, end_at=t + end, island=island, cards=cards
        )

    # L5: straddles the window's start (30 days): only its last hour is inside. Completed on time.
    l5 = lease(-timedelta(days=30) - H, -timedelta(days=30) + H, island="isl-01")
    _transition(l5, LeaseState.RUNNING, t - timedelta(days=30) - H)
    _transition(l5, LeaseState.COMPLETED, t - timedelta(days=30) + H)
    # L7: the buyer asked it to stop an hour in; the operator stopped it 6 minutes later.
    l7 = lease(-13 * H, -11 * H, island="isl-02")
    _transition(l7, LeaseState.RUNNING, t - 13 * H)
    _transition(l7, LeaseState.STOP_REQUESTED, t - 12 * H)
    _transition(l7, LeaseState.COMPLETED, t - 12 * H + timedelta(minutes=6))
    # L1: started 5 minutes late, completed at its end.
    l1 = lease(-10 * H, -8 * H, island="isl-01")
    _transition(l1, LeaseState.RUNNING, t - 10 * H + timedelta(minutes=5))
    _transition(l1, LeaseState.COMPLETED, t - 8 * H)
    # L6: the operator reported it failed an hour in.
    l6 = lease(-9 * H, -7 * H, island="isl-02")
    _transition(l6, LeaseState.RUNNING, t - 9 * H)
    _transition(l6, LeaseState.FAILED, t - 8 * H)
    # L2: usage reported for its first hour; the cluster went offline and failover interrupted it half an
    # hour later (billing, and delivery, stop at the last usage reported).
    l2 = lease(-6 * H, -4 * H, island="isl-01")
    _transition(l2, LeaseState.RUNNING, t - 6 * H)
    lease_usage_report(
        operator=east_operator,
        records=[
            LeaseUsageInput(
                lease_id=l2.pk, idempotency_key="l2-1", start_at=t - 6 * H, end_at=t - 5 * H, cards=8
            )
        ],
        actor=Actor(organisation=east_operator, system_label="agent"),
    )
    _take_offline(cluster)
    assert leases_fail_over(now=t - 4.5 * H) == 1
    cluster_status_set(actor=TEST, cluster=cluster, status=ClusterStatus.ACTIVE, reason="back")
    # L3: cancelled by the buyer before it started: nothing sold.
    l3 = lease(-3 * H, -1 * H, island="isl-01")
    _transition(l3, LeaseState.CANCELLED, t - 3.5 * H)
    # L4: running since its start two hours ago, 4 cards, until two hours from now.
    l4 = lease(-2 * H, 2 * H, island="isl-02", cards=4)
    _transition(l4, LeaseState.RUNNING, t - 2 * H)

    l2.refresh_from_db()
    assert (l2.state, l2.ended_at) == (LeaseState.INTERRUPTED, t - 5 * H)

    # By hand, card-seconds (sold, delivered) in [t − 30 d, t):
    expected = {
        "L5": (8 * 3600, 8 * 3600),
        "L7": (8 * 3600, 8 * 3600),  # sold until the stop request
        "L1": (8 * 7200, 8 * (7200 - 300)),
        "L6": (8 * 7200, 8 * 3600),
        "L2": (8 * 7200, 8 * 3600),
        "L3": (0, 0),
        "L4": (4 * 7200, 4 * 7200),  # until now
    }
    sold = sum(s for s, _ in expected.values())
    delivered = sum(d for _, d in expected.values())
    assert (sold, delivered) == (259_200, 199_200)
    prior_seconds, prior = Decimal(10 * 3600), Decimal("0.99")
    percent = ((delivered + prior_seconds * prior) / (sold + prior_seconds) * 100).quantize(
        Decimal("0.001"), ROUND_FLOOR
    )
    assert percent == Decimal("79.552")  # 79.5528…, rounded down

    idle = make_cluster(operator=east_operator, hub="yrd", name="rel-new", islands=[("isl-01", 8)])
    assert cluster_reliability_refresh(now=t) == Cluster.objects.exclude(status="retired").count()
    row = ClusterReliability.objects.get(cluster=cluster)
    assert (row.sold_card_seconds, row.delivered_card_seconds, row.interruptions) == (sold, delivered, 2)
    assert row.reliability_percent == percent
    assert row.card_hours == Decimal("72.000000")
    assert row.interruptions_per_1000_card_hours == Decimal("27.778")  # 2 × 1000 / 72
    assert (row.computed_at, row.window_start_at) == (t, t - timedelta(days=30))
    assert (row.prior_card_hours, row.prior_percent) == (Decimal(10), Decimal(99))
    assert row.has_history

    # A new cluster scores the stated prior, and says so.
    new = ClusterReliability.objects.get(cluster=idle)
    assert (new.sold_card_seconds, new.reliability_percent, new.has_history) == (0, Decimal("99.000"), False)
    assert new.interruptions_per_1000_card_hours is None

    # Recomputing at the same instant changes nothing; an hour later the running lease delivered an hour more.
    cluster_reliability_refresh(now=t)
    assert ClusterReliability.objects.filter(cluster=cluster).count() == 1
    assert ClusterReliability.objects.get(cluster=cluster).reliability_percent == percent
    cluster_reliability_refresh(now=t + H)
    later = ClusterReliability.objects.get(cluster=cluster)
    # L5 left the window; L4 sold and delivered 4 card-hours more.
    assert (later.sold_card_seconds, later.delivered_card_seconds) == (
        sold - 28_800 + 14_400,
        delivered - 28_800 + 14_400,
    )


def test_the_refresh_is_an_hourly_beat(db: None) -> None:
    """The migration is applied, and its forward step creates the hourly schedule once (run here on an
    empty table: a transactional test's flush, kept by --reuse-db, may have removed the migrated row)."""
    from django.apps import apps
    from django.db import connection
    from django.db.migrations.recorder import MigrationRecorder

    from config.celery_app import app as celery_app

    migration = importlib.import_module("broker.migrations.0008_reliability")
    assert MigrationRecorder(connection).migration_qs.filter(app="broker", name="0008_reliability").exists()
    PeriodicTask.objects.filter(task="broker.reliability_refresh").delete()
    migration.create_schedule(apps, None)
    migration.create_schedule(apps, None)
    task = PeriodicTask.objects.select_related("interval").get(task="broker.reliability_refresh")
    assert (task.interval.every, task.interval.period, task.enabled, task.expire_seconds) == (
        3600,
        "seconds",
        True,
        3600,
    )
    celery_app.loader.import_default_modules()
    assert reliability_refresh.name in celery_app.tasks
    migration.remove_schedule(apps, None)
    assert not PeriodicTask.objects.filter(task="broker.reliability_refresh").exists()


def _job(buyer: Organisation, **overrides: object) -> Job:
    now = timezone.now().replace(microsecond=0)
    values: dict[str, object] = {
        "earliest_start_at": now + H,
        "deadline_at": now + 4 * H,
        "duration_seconds": 7200,
        "latency_budget_ms": 100,
    }
    values.update(overrides)
    return make_job(buyer=buyer, **values)


def test_a_minimum_reliability_rejects_clusters_below_it_under_its_own_reason(
    buyer: Organisation, east_operator: Organisation, presets: None
) -> None:
    steady = make_cluster(operator=east_operator, hub="yrd", name="steady", islands=[("isl-01", 8)])
    shaky = make_cluster(
        operator=east_operator, hub="yrd", name="shaky", islands=[("isl-01", 8), ("isl-02", 8)]
    )
    new = make_cluster(operator=east_operator, hub="yrd", name="new", islands=[("isl-01", 8)])
    for cluster in (steady, shaky, new):
        make_price_card(cluster=cluster, rate="10.0000", tariff_code="flat")
    make_reliability(cluster=steady, percent="99.800")
    make_reliability(cluster=shaky, percent="97.250", interruptions=3)
    market.reset()

    quoted = quote_create(job=_job(buyer, min_reliability=Decimal("99.5")))
    assert [q.cluster_id for q in quoted.quotes] == [steady.pk]
    # Both islands of the shaky cluster, and the new cluster at its prior (99.0 %), are counted.
    assert quoted.result.rejections["reliability"] == 3
    assert quoted.job.quote_summary["rejections"]["reliability"] == 3

    # At 99.0 % the prior admits the new cluster; the shaky one is still out.
    loose = placements_find(spec=job_spec(job=_job(buyer, min_reliability=Decimal("99"))))
    assert {p.cluster_id for p in loose.placements} == {steady.pk, new.pk}
    assert loose.rejections["reliability"] == 2
    # Without a minimum nothing is rejected for it.
    assert placements_find(spec=job_spec(job=_job(buyer))).rejections["reliability"] == 0

    # With nothing left, the nearest relaxation is the shaky cluster's own score.
    none_left = quote_create(job=_job(buyer, min_reliability=Decimal("99.9")))
    assert none_left.quotes == []
    (relaxation,) = [r for r in none_left.relaxations if r.kind == "reliability"]
    assert relaxation.changes == {"min_reliability": "99.800"}


def test_quotes_show_the_score_and_the_api_takes_the_minimum(
    buyer: Organisation,
    east_operator: Organisation,
    presets: None,
    token_client: Callable[[Organisation], APIClient],
) -> None:
    steady = make_cluster(operator=east_operator, hub="yrd", name="steady", islands=[("isl-01", 8)])
    new = make_cluster(operator=east_operator, hub="yrd", name="new", islands=[("isl-01", 8)])
    make_price_card(cluster=steady, rate="10.0000", tariff_code="flat")
    make_price_card(cluster=new, rate="11.0000", tariff_code="flat")
    make_reliability(cluster=steady, percent="99.800", sold_card_seconds=7_200_000, interruptions=2)
    market.reset()
    client = token_client(buyer)
    now = timezone.now().replace(microsecond=0)
    body = {
        "name": "r",
        "cards": 8,
        "origin_hub": "yrd",
        "latency_budget_ms": 100,
        "earliest_start_at": (now + H).isoformat(),
        "deadline_at": (now + 4 * H).isoformat(),
        "duration_seconds": 7200,
        "min_reliability": "99.5",
    }
    bad = client.post("/api/v1/jobs", {**body, "min_reliability": "100.5"}, format="json")
    assert bad.status_code == 400
    created = client.post("/api/v1/jobs", body, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["min_reliability"] == "99.500"
    quoted = client.post(f"/api/v1/jobs/{created.json()['id']}/quotes", {}, format="json").json()
    assert quoted["rejections"]["reliability"] == 1
    (quote,) = quoted["quotes"]
    assert quote["reliability"] == {
        "percent": "99.800",
        "prior": False,
        "interruptions_per_1000_card_hours": "1.000",  # 2 in 2,000 card-hours
    }
    assert (quote["expected_credit"], quote["adjusted_cost"]) == ("0.00", quote["cost"])

    anyone = client.post("/api/v1/jobs", {**body, "min_reliability": None, "name": "any"}, format="json")
    quoted = client.post(f"/api/v1/jobs/{anyone.json()['id']}/quotes", {}, format="json").json()
    by_cluster = {q["cluster"]: q["reliability"] for q in quoted["quotes"]}
    assert by_cluster[new.cpi] == {
        "percent": "99.000",
        "prior": True,
        "interruptions_per_1000_card_hours": None,
    }


def _sla_card(cluster: Cluster, *, rate: str) -> None:
    price_card_set(
        cluster=cluster,
        rate_per_card_hour=Decimal(rate),
        tariff=Tariff.objects.get(code="flat", owner__isnull=True),
        sla_availability_percent=Decimal("99.5"),
        sla_credit_schedule=[
            {"below_percent": "99.5", "credit_percent": "10"},
            {"below_percent": "99", "credit_percent": "25"},
        ],
        actor=Actor(organisation=cluster.operator, system_label="test"),
    )


def test_ranking_by_cost_less_the_expected_credit_changes_the_order(
    buyer: Organisation, east_operator: Organisation, presets: None
) -> None:
    # A: 10.00 list, reliable (99.8 %: no credit). B: 11.00 list, 98.5 %: below 99 % the card credits 25 %,
    # so B is expected to cost 8.25 per card-hour after the credit, less than A.
    a = make_cluster(operator=east_operator, hub="yrd", name="a", islands=[("isl-01", 8)])
    b = make_cluster(operator=east_operator, hub="yrd", name="b", islands=[("isl-01", 8)])
    _sla_card(a, rate="10.0000")
    _sla_card(b, rate="11.0000")
    make_reliability(cluster=a, percent="99.800")
    make_reliability(cluster=b, percent="98.500")
    market.reset()

    by_price = placements_find(spec=job_spec(job=_job(buyer, preference="price")))
    assert [p.cluster_id for p in by_price.placements] == [a.pk, b.pk]
    by_adjusted = placements_find(spec=job_spec(job=_job(buyer, preference="adjusted")))
    assert [p.cluster_id for p in by_adjusted.placements] == [b.pk, a.pk]
    first, second = by_adjusted.placements
    # 8 cards × 2 h × 11 = 176.00, 25 % of it expected back; A: 160.00, nothing expected back.
    assert (first.cost, first.expected_credit, first.adjusted_cost) == (
        Decimal("176.00"),
        Decimal("44.00"),
        Decimal("132.00"),
    )
    assert (second.cost, second.expected_credit, second.adjusted_cost) == (
        Decimal("160.00"),
        Decimal("0.00"),
        Decimal("160.00"),
    )
    # A price cap still applies to the list price, not the adjusted one.
    capped = placements_find(
        spec=job_spec(job=_job(buyer, preference="adjusted", max_price_per_card_hour=Decimal("10.5")))
    )
    assert [p.cluster_id for p in capped.placements] == [a.pk]
    # The quote keeps the credit and the adjusted cost in its breakdown.
    stored = quote_create(job=_job(buyer, preference="adjusted"))
    assert stored.quotes[0].breakdown["expected_credit"] == "44.00"
    assert stored.quotes[0].breakdown["adjusted_cost"] == "132.00"


def test_scores_reach_the_matcher_with_the_catalogue_not_per_quote(
    buyer: Organisation, east_operator: Organisation, presets: None, settings: object
) -> None:
    """Issue 14: a quote adds no query for reliability. The scores are read once per catalogue load into
    one array per cluster; a quote with a minimum and the adjusted preference reads the arrays only."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from broker.catalog import Market

    cluster = make_cluster(operator=east_operator, hub="yrd", name="steady", islands=[("isl-01", 8)])
    _sla_card(cluster, rate="10.0000")
    make_reliability(cluster=cluster, percent="98.500")
    settings.CARDHOUR_BROKER_CATALOG_TTL_SECONDS = 60.0  # type: ignore[attr-defined]
    fresh = Market()
    catalogue, _ = fresh.view(start=0, end=1)
    position = int(np.nonzero(catalogue.cluster_id == cluster.pk)[0][0])
    assert int(catalogue.cluster_reliability_e3[position]) == 98_500
    assert catalogue.cluster_credit[position] == Decimal("0.25")  # below 99 %: 25 % back
    spec = replace(job_spec(job=_job(buyer, preference="adjusted")), min_reliability=Decimal("98"))
    with CaptureQueriesContext(connection) as queries:
        fresh.view(start=0, end=1)
        result = match(
            spec=spec,
            catalogue=catalogue,
            holds=fresh.holds.overlapping(0, 2**40),
            now=timezone.now(),
            step=900,
            limit=5,
            tariff_of=_tariff,
        )
    assert [p.cluster_id for p in result.placements] == [cluster.pk]
    assert not [q["sql"] for q in queries.captured_queries if ClusterReliability._meta.db_table in q["sql"]]


def test_failover_re_places_only_on_clusters_meeting_the_minimum(
    two_islands: Cluster, funded_buyer: Organisation, east_operator: Organisation, presets: None
) -> None:
    """The job's minimum holds for its re-placement too: the only other cluster scores below it, so the
    interrupted checkpointable job fails, and the reason counts it under `reliability`."""
    shaky = make_cluster(operator=east_operator, hub="yrd", name="shaky", islands=[("isl-01", 8)])
    make_price_card(cluster=shaky, rate="5.0000", tariff_code="flat")
    make_reliability(cluster=shaky, percent="95.000")
    now = timezone.now().replace(microsecond=0)
    job = make_job(
        buyer=funded_buyer,
        earliest_start_at=now - H,
        deadline_at=now + 24 * H,
        duration_seconds=7200,
        checkpointable=True,
        min_reliability=Decimal("98"),
    )
    lease = make_lease(job=job, cluster=two_islands, start_at=now - H, island="isl-01")
    _transition(lease, LeaseState.RUNNING, now - H)
    _take_offline(two_islands)
    assert leases_fail_over() == 1
    job.refresh_from_db()
    assert job.state == Job.State.FAILED
    assert "reliability 1" in job.failure_reason
    assert not Lease.objects.filter(replaces=lease).exists()
