"""The operator's lease API: who sees what, the lease feed (filters, cursor, long-poll) and start/stop."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone
from rest_framework.test import APIClient

from broker.models import CapacityHold, Job, Lease, LeaseState, LeaseTransition
from broker.services import dispatch
from core import wakeups
from core.models import Organisation
from core.types import Actor
from federation.models import Cluster
from metering.models import PriceCard
from tests.broker.factories import make_job, make_lease
from tests.factories import make_cluster
from tests.metering.factories import make_price_card

pytestmark = pytest.mark.django_db

Client = Callable[[Organisation], APIClient]
LEASES = "/api/v1/operator/leases"


def priced_since(cluster: Cluster, days: int = 2) -> Cluster:
    """Price cards are written effective now; the leases here start in the past, so backdate them."""
    PriceCard.objects.filter(cluster=cluster).update(effective_from=timezone.now() - timedelta(days=days))
    return cluster


@pytest.fixture
def east_cluster(east_cluster: Cluster) -> Cluster:
    return priced_since(east_cluster)


@pytest.fixture
def west_cluster(west_cluster: Cluster) -> Cluster:
    return priced_since(west_cluster)


def now_s() -> datetime:
    return timezone.now().replace(microsecond=0)


def lease_on(
    cluster: Cluster, buyer: Organisation, *, hours_ago: int = 1, hours: int = 2, **kw: Any
) -> Lease:
    """A reserved lease on ``cluster`` whose window started ``hours_ago`` and lasts ``hours``."""
    start = now_s() - timedelta(hours=hours_ago)
    job = make_job(buyer=buyer)
    return make_lease(job=job, cluster=cluster, start_at=start, end_at=start + timedelta(hours=hours), **kw)


def started(lease: Lease, operator: Organisation, at: datetime | None = None) -> Lease:
    return dispatch.lease_start(
        operator=operator, lease_id=lease.pk, actor=Actor.system("test"), at=at or lease.start_at
    )


def ids(response: Any) -> list[int]:
    return [item["id"] for item in response.json()["results"]]


# --- Authorisation ----------------------------------------------------------------------------------


def test_a_buyer_token_gets_403_not_an_operator(
    token_client: Client, buyer: Organisation, east_cluster: Cluster
) -> None:
    lease = lease_on(east_cluster, buyer)
    client = token_client(buyer)

    for method, url in [
        ("get", LEASES),
        ("get", f"{LEASES}/{lease.pk}"),
        ("post", f"{LEASES}/{lease.pk}/start"),
        ("post", f"{LEASES}/{lease.pk}/stop"),
        ("post", "/api/v1/operator/usage"),
        ("post", "/api/v1/operator/endpoint-secret"),
    ]:
        response = getattr(client, method)(url, {}, format="json")
        assert response.status_code == 403, url
        assert response.json()["code"] == "not_an_operator"
    assert Lease.objects.get(pk=lease.pk).state == LeaseState.RESERVED


def test_an_operator_sees_only_its_own_leases(
    token_client: Client,
    buyer: Organisation,
    east_operator: Organisation,
    east_cluster: Cluster,
    west_cluster: Cluster,
) -> None:
    mine = lease_on(east_cluster, buyer)
    theirs = lease_on(west_cluster, buyer)
    client = token_client(east_operator)

    assert ids(client.get(LEASES)) == [mine.pk]
    assert client.get(f"{LEASES}/{mine.pk}").status_code == 200
    for method, url in [
        ("get", f"{LEASES}/{theirs.pk}"),
        ("post", f"{LEASES}/{theirs.pk}/start"),
        ("post", f"{LEASES}/{theirs.pk}/stop"),
        ("get", f"{LEASES}/999999"),
        ("get", f"{LEASES}/{2**63}"),
        ("post", f"{LEASES}/{2**63}/start"),
    ]:
        response = getattr(client, method)(url, {}, format="json")
        assert response.status_code == 404, url
        assert response.json()["code"] == "lease_not_found"
    theirs.refresh_from_db()
    assert theirs.state == LeaseState.RESERVED
    assert LeaseTransition.objects.filter(lease=theirs).count() == 1


def test_the_lease_document(
    token_client: Client, buyer: Organisation, east_operator: Organisation, east_cluster: Cluster
) -> None:
    lease = lease_on(east_cluster, buyer, cards=6, island="isl-02")
    body = token_client(east_operator).get(f"{LEASES}/{lease.pk}").json()

    assert body == {
        "id": lease.pk,
        "job": lease.job_id,
        "buyer": "acme",
        "cluster": "cpi:ctyun:yrd:sh-ai01",
        "islands": [{"cpi": "cpi:ctyun:yrd:sh-ai01:isl-02", "cards": 6}],
        "cards": 6,
        "start_at": timezone.localtime(lease.start_at).isoformat(),
        "end_at": timezone.localtime(lease.end_at).isoformat(),
        "state": "reserved",
        "state_changed_at": timezone.localtime(lease.state_changed_at).isoformat(),
        "price_card": {"version": 1, "rate_per_card_hour": "12.0000", "currency": "CNY"},
        "started_at": None,
        "stop_requested_at": None,
        "ended_at": None,
        "last_usage_end_at": None,
        "replaces": None,
        "reason": "",
        "transitions": [
            {
                "id": LeaseTransition.objects.get(lease=lease).pk,
                "from_state": None,
                "to_state": "reserved",
                "at": timezone.localtime(lease.state_changed_at).isoformat(),
                "reason": "",
            }
        ],
    }


# --- The feed: filters, cursor, long-poll -----------------------------------------------------------


@pytest.fixture
def three_leases(
    buyer: Organisation, east_operator: Organisation, east_cluster: Cluster
) -> tuple[Lease, Lease, Lease]:
    """A reserved, a running and a completed lease on east_cluster (4 cards each)."""
    reserved = lease_on(east_cluster, buyer, cards=4)
    running = started(lease_on(east_cluster, buyer, cards=4), east_operator)
    done = started(lease_on(east_cluster, buyer, cards=4, island="isl-02"), east_operator)
    dispatch.lease_stop(operator=east_operator, lease_id=done.pk, actor=Actor.system("test"))
    return reserved, running, done


def test_the_state_filter_is_repeatable_or_a_comma_list(
    token_client: Client, east_operator: Organisation, three_leases: tuple[Lease, Lease, Lease]
) -> None:
    reserved, running, done = three_leases
    client = token_client(east_operator)

    assert ids(client.get(LEASES)) == [reserved.pk, running.pk, done.pk]
    assert ids(client.get(LEASES, {"state": "reserved"})) == [reserved.pk]
    assert ids(client.get(f"{LEASES}?state=reserved&state=running")) == [reserved.pk, running.pk]
    assert ids(client.get(LEASES, {"state": "running,completed"})) == [running.pk, done.pk]
    assert ids(client.get(LEASES, {"state": "cancelled"})) == []

    bad = client.get(LEASES, {"state": "reserved,sleeping"})
    assert bad.status_code == 400
    assert bad.json()["code"] == "invalid" and "state" in bad.json()["extra"]["fields"]


def test_the_cluster_filter(
    token_client: Client, buyer: Organisation, east_operator: Organisation, east_cluster: Cluster
) -> None:
    other = make_cluster(operator=east_operator, hub="yrd", name="sh-ai02", islands=[("isl-01", 8)])
    make_price_card(cluster=other, rate="11.0000", tariff_code="cn-gd")
    priced_since(other)
    first = lease_on(east_cluster, buyer)
    second = lease_on(other, buyer)
    client = token_client(east_operator)

    assert ids(client.get(LEASES, {"cluster": "cpi:ctyun:yrd:sh-ai02"})) == [second.pk]
    assert ids(client.get(LEASES, {"cluster": "cpi:ctyun:yrd:sh-ai01"})) == [first.pk]
    assert ids(client.get(LEASES, {"cluster": "cpi:ctyun:yrd:nowhere"})) == []


def test_the_cursor_returns_what_changed_since(
    token_client: Client,
    buyer: Organisation,
    east_operator: Organisation,
    east_cluster: Cluster,
    west_cluster: Cluster,
) -> None:
    first = lease_on(east_cluster, buyer, cards=4)
    second = lease_on(east_cluster, buyer, cards=4)
    client = token_client(east_operator)

    listing = client.get(LEASES).json()
    cursor = listing["cursor"]
    assert cursor == LeaseTransition.objects.get(lease=second).pk
    assert client.get(LEASES, {"after": cursor}).json() == {
        "count": 0,
        "next": None,
        "previous": None,
        "cursor": cursor,
        "results": [],
    }

    started(second, east_operator)
    started(first, east_operator)
    lease_on(west_cluster, buyer)  # another operator's change moves nobody's cursor here
    changed = client.get(LEASES, {"after": cursor}).json()
    assert [item["id"] for item in changed["results"]] == [second.pk, first.pk]  # in change order
    assert [item["state"] for item in changed["results"]] == ["running", "running"]
    assert changed["cursor"] == LeaseTransition.objects.filter(lease=first).latest("id").pk

    dispatch.lease_stop(operator=east_operator, lease_id=second.pk, actor=Actor.system("test"))
    again = client.get(LEASES, {"after": changed["cursor"], "state": "completed"}).json()
    assert [item["id"] for item in again["results"]] == [second.pk]
    assert again["cursor"] == LeaseTransition.objects.filter(lease=second).latest("id").pk
    assert client.get(LEASES, {"after": again["cursor"]}).json()["results"] == []


def test_wait_beyond_the_maximum_is_invalid(token_client: Client, east_operator: Organisation) -> None:
    response = token_client(east_operator).get(LEASES, {"wait": 31})

    assert response.status_code == 400
    assert list(response.json()["extra"]["fields"]) == ["wait"]


def test_wait_inside_a_transaction_answers_at_once(
    token_client: Client, east_operator: Organisation, east_cluster: Cluster
) -> None:
    """Tests (and any atomic caller) run inside a transaction: the view never sleeps holding one."""
    began = time.monotonic()
    response = token_client(east_operator).get(LEASES, {"wait": 30, "after": 0})

    assert response.status_code == 200 and response.json()["results"] == []
    assert time.monotonic() - began < 5


@pytest.mark.django_db(transaction=True)
def test_a_long_poll_returns_a_change_made_by_another_thread_during_the_wait(
    token_client: Client,
    buyer: Organisation,
    east_operator: Organisation,
    east_cluster: Cluster,
) -> None:
    lease = lease_on(east_cluster, buyer)
    client = token_client(east_operator)
    cursor = client.get(LEASES).json()["cursor"]

    # The other thread starts the lease once the request has found nothing and subscribed to wake-ups.
    failures: list[BaseException] = []

    def other_agent() -> None:
        try:
            deadline = time.monotonic() + 10
            while wakeups.waiting_count() == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            started(Lease.objects.get(pk=lease.pk), east_operator)
        except BaseException as exc:  # reported by the test thread
            failures.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=other_agent)
    thread.start()
    began = time.monotonic()
    response = client.get(LEASES, {"after": cursor, "wait": 20})
    elapsed = time.monotonic() - began
    thread.join(10)

    assert failures == []
    assert response.status_code == 200
    body = response.json()
    assert [(item["id"], item["state"]) for item in body["results"]] == [(lease.pk, "running")]
    assert body["cursor"] == LeaseTransition.objects.filter(lease=lease).latest("id").pk
    # Woken by the change (NOTIFY on PostgreSQL, the same-process wake-up elsewhere), not by the wait's end.
    assert elapsed < 5
    assert wakeups.waiting_count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_long_poll_with_nothing_new_answers_empty_when_the_wait_ends(
    token_client: Client, buyer: Organisation, east_operator: Organisation, east_cluster: Cluster
) -> None:
    lease_on(east_cluster, buyer)
    client = token_client(east_operator)
    cursor = client.get(LEASES).json()["cursor"]

    began = time.monotonic()
    response = client.get(LEASES, {"after": cursor, "wait": 1})
    elapsed = time.monotonic() - began

    assert response.json() == {"count": 0, "next": None, "previous": None, "cursor": cursor, "results": []}
    assert 0.5 <= elapsed < 3  # the wait ends in its second half (broker/api/operator.py: jitter)


# --- Start and stop ---------------------------------------------------------------------------------


def test_start_then_stop_and_their_idempotent_repeats(
    token_client: Client, buyer: Organisation, east_operator: Organisation, east_cluster: Cluster
) -> None:
    lease = lease_on(east_cluster, buyer)
    client = token_client(east_operator)
    at = lease.start_at + timedelta(seconds=30)

    response = client.post(f"{LEASES}/{lease.pk}/start", {"at": at.isoformat()}, format="json")
    assert response.status_code == 200
    assert response.json()["state"] == "running"
    assert response.json()["started_at"] == timezone.localtime(at).isoformat()

    again = client.post(f"{LEASES}/{lease.pk}/start", {}, format="json")
    assert again.status_code == 200 and again.json() == response.json()
    assert LeaseTransition.objects.filter(lease=lease).count() == 2

    end = now_s()
    stopped = client.post(f"{LEASES}/{lease.pk}/stop", {"at": end.isoformat()}, format="json")
    assert stopped.status_code == 200
    assert stopped.json()["state"] == "completed"
    assert stopped.json()["ended_at"] == timezone.localtime(end).isoformat()
    assert stopped.json()["reason"] == "stopped by the operator"
    assert not CapacityHold.objects.filter(lease=lease, active=True).exists()
    assert Job.objects.get(pk=lease.job_id).state == Job.State.COMPLETED

    repeat = client.post(f"{LEASES}/{lease.pk}/stop", {}, format="json")
    assert repeat.status_code == 200 and repeat.json() == stopped.json()
    assert list(LeaseTransition.objects.filter(lease=lease).values_list("to_state", flat=True)) == [
        "reserved",
        "running",
        "completed",
    ]

    for url, payload in [
        (f"{LEASES}/{lease.pk}/stop", {"outcome": "failed"}),
        (f"{LEASES}/{lease.pk}/start", {}),
    ]:
        conflict = client.post(url, payload, format="json")
        assert conflict.status_code == 409
        assert conflict.json()["code"] == "lease_invalid_transition"
    assert LeaseTransition.objects.filter(lease=lease).count() == 3


def test_a_failed_stop_records_the_operators_reason(
    token_client: Client, buyer: Organisation, east_operator: Organisation, east_cluster: Cluster
) -> None:
    lease = started(lease_on(east_cluster, buyer), east_operator)

    response = token_client(east_operator).post(
        f"{LEASES}/{lease.pk}/stop", {"outcome": "failed", "reason": "node 7 lost its NVLink"}, format="json"
    )

    assert response.status_code == 200
    assert response.json()["state"] == "failed" and response.json()["reason"] == "node 7 lost its NVLink"
    job = Job.objects.get(pk=lease.job_id)
    assert job.state == Job.State.FAILED and job.failure_reason == "node 7 lost its NVLink"


def test_a_reserved_lease_can_fail_but_not_complete(
    token_client: Client, buyer: Organisation, east_operator: Organisation, east_cluster: Cluster
) -> None:
    lease = lease_on(east_cluster, buyer)
    client = token_client(east_operator)

    completed = client.post(f"{LEASES}/{lease.pk}/stop", {}, format="json")
    assert completed.status_code == 409
    assert completed.json()["extra"] == {"lease_id": lease.pk, "state": "reserved", "to_state": "completed"}
    assert Lease.objects.get(pk=lease.pk).state == LeaseState.RESERVED

    failed = client.post(f"{LEASES}/{lease.pk}/stop", {"outcome": "failed"}, format="json")
    assert failed.status_code == 200 and failed.json()["state"] == "failed"


def test_a_stop_requested_lease_completes_when_stopped(
    token_client: Client, buyer: Organisation, east_operator: Organisation, east_cluster: Cluster
) -> None:
    from broker.services.leases import lease_cancel

    lease = started(lease_on(east_cluster, buyer), east_operator)
    lease_cancel(lease_id=lease.pk, actor=Actor.system("buyer"))
    client = token_client(east_operator)

    assert client.post(f"{LEASES}/{lease.pk}/start", {}, format="json").json()["state"] == "stop_requested"
    response = client.post(f"{LEASES}/{lease.pk}/stop", {}, format="json")
    assert response.status_code == 200 and response.json()["state"] == "completed"


def test_a_cancelled_lease_cannot_start(
    token_client: Client, buyer: Organisation, east_operator: Organisation, east_cluster: Cluster
) -> None:
    from broker.services.leases import lease_cancel

    lease = lease_on(east_cluster, buyer)
    lease_cancel(lease_id=lease.pk, actor=Actor.system("buyer"))

    response = token_client(east_operator).post(f"{LEASES}/{lease.pk}/start", {}, format="json")

    assert response.status_code == 409
    assert response.json()["extra"] == {"lease_id": lease.pk, "state": "cancelled", "to_state": "running"}


def test_a_start_more_than_the_grace_before_start_at_is_refused(
    token_client: Client, buyer: Organisation, east_operator: Organisation, east_cluster: Cluster
) -> None:
    start = now_s() + timedelta(minutes=10)
    lease = make_lease(job=make_job(buyer=buyer), cluster=east_cluster, start_at=start)
    at = start - timedelta(minutes=5, seconds=1)

    response = token_client(east_operator).post(
        f"{LEASES}/{lease.pk}/start", {"at": at.isoformat()}, format="json"
    )

    assert response.status_code == 400
    assert response.json()["code"] == "lease_time_invalid"
    assert response.json()["extra"] == {
        "lease_id": lease.pk,
        "field": "at",
        "reason": "before_start",
        "earliest_at": (start - timedelta(minutes=5)).isoformat(),
    }
    assert Lease.objects.get(pk=lease.pk).state == LeaseState.RESERVED
    assert LeaseTransition.objects.filter(lease=lease).count() == 1


def test_a_start_after_the_window_is_refused(
    token_client: Client, buyer: Organisation, east_operator: Organisation, east_cluster: Cluster
) -> None:
    lease = lease_on(east_cluster, buyer, hours_ago=3, hours=2)

    response = token_client(east_operator).post(f"{LEASES}/{lease.pk}/start", {}, format="json")

    assert response.status_code == 400
    assert response.json()["extra"]["reason"] == "after_end"
    assert Lease.objects.get(pk=lease.pk).state == LeaseState.RESERVED


def test_a_start_within_the_grace_before_start_at_is_accepted(
    token_client: Client, buyer: Organisation, east_operator: Organisation, east_cluster: Cluster
) -> None:
    start = now_s() + timedelta(minutes=4)
    lease = make_lease(job=make_job(buyer=buyer), cluster=east_cluster, start_at=start)

    response = token_client(east_operator).post(f"{LEASES}/{lease.pk}/start", {}, format="json")

    assert response.status_code == 200 and response.json()["state"] == "running"


def test_start_and_stop_times_are_checked(
    token_client: Client, buyer: Organisation, east_operator: Organisation, east_cluster: Cluster
) -> None:
    lease = lease_on(east_cluster, buyer)
    client = token_client(east_operator)
    future = (now_s() + timedelta(minutes=10)).isoformat()

    early = client.post(f"{LEASES}/{lease.pk}/start", {"at": future}, format="json")
    assert early.json()["extra"]["reason"] == "in_future"
    naive = client.post(f"{LEASES}/{lease.pk}/start", {"at": "2026-11-21T10:00:00"}, format="json")
    assert naive.status_code == 400 and list(naive.json()["extra"]["fields"]) == ["at"]

    started(lease, east_operator, at=lease.start_at + timedelta(minutes=10))
    before = client.post(f"{LEASES}/{lease.pk}/stop", {"at": lease.start_at.isoformat()}, format="json")
    assert before.status_code == 400 and before.json()["extra"]["reason"] == "before_started"
    assert Lease.objects.get(pk=lease.pk).state == LeaseState.RUNNING


def test_a_poll_with_nothing_new_on_its_cluster_answers_from_the_probe_in_the_page_shape(
    token_client: Callable[..., Any], buyer: Organisation, east_operator: Organisation, east_cluster: Cluster
) -> None:
    other = make_cluster(operator=east_operator, hub="yrd", name="probe-other", islands=[("isl-01", 8)])
    make_price_card(cluster=other)
    priced_since(other)
    lease_on(east_cluster, buyer)
    client = token_client(east_operator)
    cursor = client.get(LEASES).json()["cursor"]
    lease_on(other, buyer)  # a change on the operator's other cluster only

    assert dispatch.lease_feed_changed_since(operator=east_operator, after=cursor) is True
    assert (
        dispatch.lease_feed_changed_since(operator=east_operator, after=cursor, cluster=east_cluster.cpi)
        is False
    )
    quiet = client.get(LEASES, {"after": cursor, "cluster": east_cluster.cpi}).json()
    assert quiet == {"count": 0, "next": None, "previous": None, "cursor": cursor, "results": []}
    # The same answer the full page gives when nothing matches (page=1 skips the probe).
    assert client.get(LEASES, {"after": cursor, "cluster": east_cluster.cpi, "page": 1}).json() == quiet

    changed = client.get(LEASES, {"after": cursor, "cluster": other.cpi}).json()
    assert [lease["cluster"] for lease in changed["results"]] == [other.cpi]
    assert changed["cursor"] > cursor
