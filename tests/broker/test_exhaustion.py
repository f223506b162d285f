"""A buyer whose packs run dry has its running leases stopped, not overspent: usage reported through the
operator API, rated by metering (which raises the exhaustion flag), then leases_stop_exhausted."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from broker.models import BuyerNotice, Lease, LeaseState, LeaseTransition
from broker.services import dispatch
from broker.services.leases import lease_cancel
from core.models import Organisation
from core.types import Actor
from federation.models import Cluster
from metering.models import BuyerExhaustion, PriceCard, UsageRecord
from metering.services.rating import usage_rate_pending
from tests.broker.conftest import A800, H800
from tests.broker.factories import make_job, make_lease
from tests.factories import BuyerFactory, make_cluster
from tests.metering.factories import make_paid_pack, make_price_card

pytestmark = pytest.mark.django_db

Client = Callable[[Organisation], APIClient]
SYSTEM = Actor.system("test")
USAGE = "/api/v1/operator/usage"
SHANGHAI = ZoneInfo("Asia/Shanghai")


def priced_since(cluster: Cluster, days: int = 4) -> Cluster:
    """Price cards are written effective now; the leases here start in the past, so backdate them."""
    PriceCard.objects.filter(cluster=cluster).update(effective_from=timezone.now() - timedelta(days=days))
    return cluster


@pytest.fixture
def east_cluster(east_cluster: Cluster) -> Cluster:
    return priced_since(east_cluster)


@pytest.fixture
def h800_cluster(east_operator: Organisation, presets: None) -> Cluster:
    cluster = make_cluster(
        operator=east_operator, hub="yrd", name="sh-h800", accelerator=H800, islands=[("isl-01", 8)]
    )
    make_price_card(cluster=cluster, rate="25.0000", tariff_code="cn-gd")
    return priced_since(cluster)


@pytest.fixture
def east(token_client: Client, east_operator: Organisation) -> APIClient:
    return token_client(east_operator)


@pytest.fixture
def thin_buyer(buyer: Organisation) -> Organisation:
    """Acme with a single A800 card-hour (bought three days ago, before any usage) and no standard cards."""
    bought = timezone.now() - timedelta(days=3)
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=1, price="9.00", key="tiny", paid_at=bought)
    return buyer


def now_s() -> datetime:
    return timezone.now().replace(microsecond=0)


def running_lease(cluster: Cluster, buyer: Organisation, *, island: str = "isl-01") -> Lease:
    """8 cards over [2 h ago, 2 h from now), started at its start."""
    start = now_s() - timedelta(hours=2)
    lease = make_lease(
        job=make_job(buyer=buyer),
        cluster=cluster,
        start_at=start,
        end_at=start + timedelta(hours=4),
        island=island,
    )
    return dispatch.lease_start(operator=lease.operator, lease_id=lease.pk, actor=SYSTEM, at=start)


def usage(lease: Lease, key: str, start: datetime, end: datetime) -> dict[str, Any]:
    return {
        "lease": lease.pk,
        "idempotency_key": key,
        "start_at": start.isoformat(),
        "end_at": end.isoformat(),
        "cards": lease.cards,
    }


def exhaust(client: APIClient, lease: Lease, key: str = "hour") -> None:
    """Report an hour of 8 cards in two half-hour records (≥ 3 A800 card-hours in any band) and rate it: the
    1-card-hour pack runs dry."""
    half = timedelta(minutes=30)
    start = lease.start_at
    records = [
        usage(lease, f"{key}-1", start, start + half),
        usage(lease, f"{key}-2", start + half, start + 2 * half),
    ]
    response = client.post(USAGE, {"records": records}, format="json")
    assert response.status_code == 201
    assert usage_rate_pending() >= 1


@override_settings(CARDHOUR_USAGE_REPORT_INTERVAL_SECONDS=60)
def test_exhausted_packs_stop_the_buyers_running_lease_and_usage_beyond_the_interval_is_refused(
    east: APIClient, thin_buyer: Organisation, east_cluster: Cluster
) -> None:
    lease = running_lease(east_cluster, thin_buyer)
    assert dispatch.leases_stop_exhausted() == 0  # nothing flagged yet

    exhaust(east, lease)
    flag = BuyerExhaustion.objects.get(cleared_at__isnull=True)
    assert (flag.buyer_id, flag.pack_class) == (thin_buyer.pk, A800)

    now = now_s()
    assert dispatch.leases_stop_exhausted(now=now) == 1

    lease.refresh_from_db()
    assert lease.state == LeaseState.STOP_REQUESTED and lease.stop_requested_at == now
    assert lease.reason == f"packs exhausted: no {A800} or standard card-hours left"
    transition = LeaseTransition.objects.filter(lease=lease).latest("id")
    assert (transition.from_state, transition.to_state, transition.at) == ("running", "stop_requested", now)
    assert transition.actor_label == "broker: packs exhausted"
    notice = BuyerNotice.objects.get()
    assert (notice.buyer_id, notice.kind, notice.lease_id, notice.job_id) == (
        thin_buyer.pk,
        "packs_exhausted",
        lease.pk,
        lease.job_id,
    )
    assert notice.message == (
        f"Your {A800} card-hour packs ran out, so lease {lease.pk} on cpi:ctyun:yrd:sh-ai01 was asked to stop. "
        "Buy a pack to run it again."
    )

    # Idempotent: the lease is already asked to stop.
    assert dispatch.leases_stop_exhausted(now=now + timedelta(seconds=10)) == 0
    assert LeaseTransition.objects.filter(lease=lease).count() == 3
    assert BuyerNotice.objects.count() == 1

    # The operator learns it from its feed.
    pulled = east.get("/api/v1/operator/leases", {"state": "stop_requested"}).json()["results"]
    assert [(item["id"], item["stop_requested_at"]) for item in pulled] == [
        (lease.pk, timezone.localtime(now).isoformat())
    ]

    # Usage up to one reporting interval after the request is accepted; beyond it, refused, nothing written.
    last = lease.start_at + timedelta(hours=1)
    before = UsageRecord.objects.count()
    beyond = east.post(
        USAGE, {"records": [usage(lease, "tail", last, now + timedelta(seconds=61))]}, format="json"
    )
    assert beyond.status_code == 400
    assert [(e["code"], e["field"]) for e in beyond.json()["extra"]["errors"]] == [
        ("after_stop_request", "end_at")
    ]
    assert UsageRecord.objects.count() == before
    within = east.post(
        USAGE, {"records": [usage(lease, "tail", last, now + timedelta(seconds=60))]}, format="json"
    )
    assert within.status_code == 201

    stopped = east.post(
        f"/api/v1/operator/leases/{lease.pk}/stop",
        {"at": (now + timedelta(seconds=60)).isoformat()},
        format="json",
    )
    assert stopped.status_code == 200 and stopped.json()["state"] == "completed"


def test_only_that_buyers_leases_on_that_chip_are_stopped(
    east: APIClient,
    thin_buyer: Organisation,
    east_cluster: Cluster,
    h800_cluster: Cluster,
) -> None:
    other_buyer = BuyerFactory(slug="beta", name="Beta Labs")
    make_paid_pack(
        buyer=other_buyer,
        accelerator=A800,
        card_hours=1000,
        price="9000.00",
        key="beta",
        paid_at=timezone.now() - timedelta(days=1),
    )
    a800 = running_lease(east_cluster, thin_buyer)
    h800 = running_lease(h800_cluster, thin_buyer)
    others = running_lease(east_cluster, other_buyer, island="isl-02")
    reserved = make_lease(
        job=make_job(buyer=thin_buyer), cluster=east_cluster, start_at=now_s() + timedelta(hours=3)
    )

    exhaust(east, a800)
    east.post(
        USAGE,
        {"records": [usage(others, "beta-1", others.start_at, others.start_at + timedelta(hours=1))]},
        format="json",
    )
    usage_rate_pending()
    assert list(BuyerExhaustion.objects.values_list("buyer__slug", "pack_class")) == [("acme", A800)]

    assert dispatch.leases_stop_exhausted() == 1
    states = dict(Lease.objects.values_list("pk", "state"))
    assert states == {
        a800.pk: "stop_requested",
        h800.pk: "running",  # no H800 usage has run dry: its own flag would stop it
        others.pk: "running",
        reserved.pk: "reserved",
    }


def test_one_record_that_drains_the_pack_raises_the_flag(
    east: APIClient, thin_buyer: Organisation, east_cluster: Cluster
) -> None:
    # Yesterday 01:00–02:00 in Guangdong: one valley slice (0.38), 3.04 card-hours against a pack of 1.
    day = timezone.now().astimezone(SHANGHAI).date() - timedelta(days=1)
    start = datetime.combine(day, time(1, 0), tzinfo=SHANGHAI)
    reserved = make_lease(
        job=make_job(buyer=thin_buyer),
        cluster=east_cluster,
        start_at=start,
        end_at=start + timedelta(hours=4),
    )
    lease = dispatch.lease_start(operator=reserved.operator, lease_id=reserved.pk, actor=SYSTEM, at=start)
    hour = usage(lease, "one-hour", start, start + timedelta(hours=1))
    assert east.post(USAGE, {"records": [hour]}, format="json").status_code == 201
    usage_rate_pending()

    assert BuyerExhaustion.objects.filter(buyer=thin_buyer, cleared_at__isnull=True).exists()


def test_a_cleared_flag_stops_nothing(
    east: APIClient, thin_buyer: Organisation, east_cluster: Cluster
) -> None:
    lease = running_lease(east_cluster, thin_buyer)
    exhaust(east, lease)

    make_paid_pack(buyer=thin_buyer, accelerator=A800, card_hours=100, price="900.00", key="refill")

    assert BuyerExhaustion.objects.get().cleared_at is not None
    assert dispatch.leases_stop_exhausted() == 0
    assert Lease.objects.get(pk=lease.pk).state == LeaseState.RUNNING
    assert BuyerNotice.objects.count() == 0


def test_a_lease_already_asked_to_stop_is_left_alone(
    east: APIClient, thin_buyer: Organisation, east_cluster: Cluster
) -> None:
    lease = running_lease(east_cluster, thin_buyer)
    exhaust(east, lease)
    lease_cancel(lease_id=lease.pk, actor=SYSTEM)
    transitions = LeaseTransition.objects.filter(lease=lease).count()

    assert dispatch.leases_stop_exhausted() == 0
    assert LeaseTransition.objects.filter(lease=lease).count() == transitions
    assert BuyerNotice.objects.count() == 0


@pytest.fixture
def wide_cluster(east_operator: Organisation, presets: None) -> Cluster:
    """Five islands of 8 A800 cards in Shanghai, priced four days ago."""
    cluster = make_cluster(
        operator=east_operator,
        hub="yrd",
        name="sh-ai09",
        islands=[(f"isl-{n:02}", 8) for n in range(1, 6)],
        site="Shanghai",
    )
    make_price_card(cluster=cluster, rate="12.0000", tariff_code="cn-gd")
    return priced_since(cluster)


def five_leases_exhausted(client: APIClient, cluster: Cluster, buyer: Organisation) -> list[Lease]:
    running = [running_lease(cluster, buyer, island=f"isl-{n:02}") for n in range(1, 6)]
    exhaust(client, running[0])
    return running


def stop_requested(leases: list[Lease]) -> list[bool]:
    states = dict(Lease.objects.filter(pk__in=[lease.pk for lease in leases]).values_list("pk", "state"))
    return [states[lease.pk] == LeaseState.STOP_REQUESTED for lease in leases]


def test_a_run_stops_the_leases_a_chunk_to_a_transaction(
    monkeypatch: pytest.MonkeyPatch, east: APIClient, thin_buyer: Organisation, wide_cluster: Cluster
) -> None:
    monkeypatch.setattr(dispatch, "STOP_CHUNK", 2)
    running = five_leases_exhausted(east, wide_cluster, thin_buyer)

    assert dispatch.leases_stop_exhausted() == 5
    assert stop_requested(running) == [True] * 5
    assert BuyerNotice.objects.filter(kind="packs_exhausted").count() == 5
    assert dispatch.leases_stop_exhausted() == 0


def test_a_run_over_its_time_budget_leaves_the_rest_to_the_next_run(
    monkeypatch: pytest.MonkeyPatch, east: APIClient, thin_buyer: Organisation, wide_cluster: Cluster
) -> None:
    """Past its budget (0 here) a run starts no further chunk, but always does its first one, so a run whose
    selection alone took the budget still makes progress."""
    monkeypatch.setattr(dispatch, "STOP_CHUNK", 2)
    monkeypatch.setattr(dispatch, "STOP_RUN_BUDGET_SECONDS", 0.0)
    running = five_leases_exhausted(east, wide_cluster, thin_buyer)

    assert [dispatch.leases_stop_exhausted() for _ in range(4)] == [2, 2, 1, 0]
    assert stop_requested(running) == [True] * 5


@contextmanager
def row_held(lease: Lease) -> Iterator[None]:
    """The lease's row locked by another connection (a thread's transaction) until the block ends."""
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                Lease.objects.select_for_update().filter(pk=lease.pk).get()
                locked.set()
                release.wait(30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(30)
        yield
    finally:
        release.set()
        holder.join(30)


@pytest.mark.django_db(transaction=True)
def test_a_lease_another_transaction_holds_is_left_to_the_next_run(
    east: APIClient, thin_buyer: Organisation, wide_cluster: Cluster
) -> None:
    """A usage report (or failover) holding a lease's row does not make the stop run wait on it: the run stops
    the others and the next run takes it. PostgreSQL only (SQLite has no row locks)."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks and SKIP LOCKED need PostgreSQL")
    running = five_leases_exhausted(east, wide_cluster, thin_buyer)
    with row_held(running[2]):
        assert dispatch.leases_stop_exhausted() == 4
        assert stop_requested(running) == [True, True, False, True, True]
    assert dispatch.leases_stop_exhausted() == 1
    assert stop_requested(running) == [True] * 5


@pytest.mark.django_db(transaction=True)
def test_a_usage_report_that_waits_past_the_lock_timeout_is_a_busy_503_and_writes_nothing(
    east: APIClient, buyer: Organisation, wide_cluster: Cluster
) -> None:
    """Contention is not a fault: a report whose lease another transaction holds past ``lock_timeout`` gets
    503 ``database_busy`` with Retry-After, nothing of it is stored, and the same report succeeds once the lock
    is free. PostgreSQL only."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks need PostgreSQL")
    lease = running_lease(wide_cluster, buyer)
    start = lease.start_at
    body = {"records": [usage(lease, "busy-1", start, start + timedelta(minutes=5))]}
    with row_held(lease):
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '200ms'")
        try:
            response = east.post(USAGE, body, format="json")
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")
    assert response.status_code == 503, response.content
    assert response.json()["code"] == "database_busy"
    assert response.json()["extra"] == {"retry_after_seconds": 1}
    assert response["Retry-After"] == "1"
    assert not UsageRecord.objects.filter(reference=f"lease:{lease.pk}").exists()

    again = east.post(USAGE, body, format="json")
    assert again.status_code == 201, again.content
    assert UsageRecord.objects.filter(reference=f"lease:{lease.pk}").count() == 1
