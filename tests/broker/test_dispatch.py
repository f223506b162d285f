"""Usage reported against leases (validation, hand-off to metering, idempotency, last_usage_end_at) and
signed lease events POSTed to clusters' endpoints (delivery, retry with backoff, giving up)."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from broker.models import Lease, LeaseEventDelivery, LeaseState, LeaseTransition, OperatorEndpoint
from broker.services import dispatch
from broker.services.leases import lease_cancel
from core.models import Organisation
from core.types import Actor
from federation.models import Cluster
from metering.models import PriceCard, UsageRecord
from tests.broker.factories import make_job, make_lease
from tests.metering.factories import make_price_card

pytestmark = pytest.mark.django_db

Client = Callable[[Organisation], APIClient]
USAGE = "/api/v1/operator/usage"
SYSTEM = Actor.system("test")


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


def running_lease(
    cluster: Cluster,
    buyer: Organisation,
    *,
    cards: int = 8,
    hours_ago: int = 2,
    hours: int = 4,
    start: datetime | None = None,
    **kw: Any,
) -> Lease:
    """A lease of ``cards`` cards whose window began ``hours_ago`` (or at ``start``) and lasts ``hours``."""
    start = start or now_s() - timedelta(hours=hours_ago)
    lease = make_lease(
        job=make_job(buyer=buyer, cards=cards),
        cluster=cluster,
        cards=cards,
        start_at=start,
        end_at=start + timedelta(hours=hours),
        **kw,
    )
    return dispatch.lease_start(operator=lease.operator, lease_id=lease.pk, actor=SYSTEM, at=start)


def rec(
    lease: Lease, key: str, start: datetime, minutes: int = 10, cards: int | None = None
) -> dict[str, Any]:
    return {
        "lease": lease.pk,
        "idempotency_key": key,
        "start_at": start.isoformat(),
        "end_at": (start + timedelta(minutes=minutes)).isoformat(),
        "cards": lease.cards if cards is None else cards,
    }


def post(client: APIClient, *records: dict[str, Any]) -> Any:
    return client.post(USAGE, {"records": list(records)}, format="json")


@pytest.fixture
def east(token_client: Client, east_operator: Organisation) -> APIClient:
    return token_client(east_operator)


# --- Usage handed to metering -----------------------------------------------------------------------


def test_usage_is_stored_against_the_lease_with_its_locked_price_card(
    east: APIClient, buyer: Organisation, east_cluster: Cluster
) -> None:
    lease = running_lease(east_cluster, buyer)
    # The operator publishes a new price after the lease was accepted: the lease keeps version 1.
    newer = make_price_card(cluster=east_cluster, rate="30.0000", tariff_code="cn-gd")
    assert newer.version == 2
    start = newer.effective_from.replace(microsecond=0) + timedelta(seconds=1)

    response = post(east, rec(lease, "u-1", start, minutes=1), rec(lease, "u-2", lease.start_at, cards=3))

    assert response.status_code == 201
    body = response.json()
    stored = {
        r.idempotency_key: r for r in UsageRecord.objects.select_related("price_card", "cluster", "buyer")
    }
    assert body == {
        "created": 2,
        "duplicates": 0,
        "conflicts": 0,
        "records": [
            {"index": 0, "idempotency_key": "u-1", "status": "created", "usage_record": stored["u-1"].pk},
            {"index": 1, "idempotency_key": "u-2", "status": "created", "usage_record": stored["u-2"].pk},
        ],
    }
    first = stored["u-1"]
    assert first.reference == f"lease:{lease.pk}"
    assert first.price_card_id == lease.price_card_id and first.price_card.version == 1
    assert first.cluster == east_cluster and first.buyer == buyer and first.cards == 8
    assert (first.start_at, first.end_at) == (start, start + timedelta(minutes=1))
    assert stored["u-2"].cards == 3 and stored["u-2"].price_card.version == 1
    lease.refresh_from_db()
    assert lease.last_usage_end_at == start + timedelta(minutes=1)


def test_a_replay_answers_the_original_records_with_200(
    east: APIClient, buyer: Organisation, east_cluster: Cluster
) -> None:
    lease = running_lease(east_cluster, buyer)
    records = [rec(lease, "u-1", lease.start_at), rec(lease, "u-2", lease.start_at + timedelta(minutes=10))]
    first = post(east, *records).json()

    again = post(east, *records)

    assert again.status_code == 200
    assert again.json() == {
        "created": 0,
        "duplicates": 2,
        "conflicts": 0,
        "records": [{**r, "status": "duplicate"} for r in first["records"]],
    }
    assert UsageRecord.objects.count() == 2


def test_a_conflicting_duplicate_is_409_and_the_rest_of_the_batch_is_stored(
    east: APIClient, buyer: Organisation, east_cluster: Cluster
) -> None:
    lease = running_lease(east_cluster, buyer)
    original = post(east, rec(lease, "u-1", lease.start_at)).json()["records"][0]["usage_record"]

    later = lease.start_at + timedelta(minutes=10)  # u-2 after u-1: the same seconds twice would be refused
    response = post(east, rec(lease, "u-1", lease.start_at, cards=2), rec(lease, "u-2", later))

    assert response.status_code == 409
    body = response.json()
    created = UsageRecord.objects.get(idempotency_key="u-2").pk
    assert body["code"] == "usage_conflict"
    assert body["extra"] == {
        "created": 1,
        "duplicates": 0,
        "conflicts": 1,
        "records": [
            {"index": 0, "idempotency_key": "u-1", "status": "conflict", "usage_record": original},
            {"index": 1, "idempotency_key": "u-2", "status": "created", "usage_record": created},
        ],
    }
    assert UsageRecord.objects.get(pk=original).cards == 8
    assert UsageRecord.objects.count() == 2


def test_last_usage_end_at_only_moves_forward(
    east: APIClient, buyer: Organisation, east_cluster: Cluster
) -> None:
    first = running_lease(east_cluster, buyer)
    # The same start: a clock tick between the two would put "b" before the second lease's window.
    second = running_lease(east_cluster, buyer, island="isl-02", start=first.start_at)
    t0 = first.start_at

    post(
        east,
        rec(first, "a", t0 + timedelta(minutes=30)),
        rec(second, "b", t0),
        rec(second, "c", t0 + timedelta(minutes=10)),
    )
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.last_usage_end_at == t0 + timedelta(minutes=40)
    assert second.last_usage_end_at == t0 + timedelta(minutes=20)

    post(east, rec(first, "d", t0))  # older usage arriving late does not move it back
    first.refresh_from_db()
    assert first.last_usage_end_at == t0 + timedelta(minutes=40)


def test_late_usage_of_an_ended_lease_is_accepted(
    east: APIClient, buyer: Organisation, east_cluster: Cluster
) -> None:
    lease = running_lease(east_cluster, buyer)
    dispatch.lease_stop(
        operator=lease.operator, lease_id=lease.pk, actor=SYSTEM, at=lease.start_at + timedelta(minutes=30)
    )

    response = post(east, rec(lease, "late", lease.start_at + timedelta(minutes=20)))

    assert response.status_code == 201


# --- Usage validation: each code, and nothing written ------------------------------------------------


def fault(response: Any) -> list[tuple[int, str, str, str]]:
    assert response.status_code == 400, response.json()
    body = response.json()
    assert body["code"] == "lease_usage_invalid"
    return [(e["index"], e["idempotency_key"], e["code"], e["field"]) for e in body["extra"]["errors"]]


def test_usage_of_another_operators_or_a_missing_lease_is_lease_not_found(
    east: APIClient, buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster
) -> None:
    mine = running_lease(east_cluster, buyer)
    theirs = running_lease(west_cluster, buyer)
    ok = rec(mine, "ok", mine.start_at)
    missing = {**rec(mine, "gone", mine.start_at), "lease": 10**12}

    response = post(east, ok, rec(theirs, "x", theirs.start_at), missing)

    assert fault(response) == [(1, "x", "lease_not_found", "lease"), (2, "gone", "lease_not_found", "lease")]
    assert UsageRecord.objects.count() == 0
    mine.refresh_from_db()
    assert mine.last_usage_end_at is None


def test_usage_of_a_lease_that_never_ran_is_refused(
    east: APIClient, buyer: Organisation, east_cluster: Cluster
) -> None:
    start = now_s() - timedelta(hours=1)
    reserved = make_lease(job=make_job(buyer=buyer), cluster=east_cluster, start_at=start)
    cancelled = make_lease(job=make_job(buyer=buyer), cluster=east_cluster, start_at=start, island="isl-02")
    lease_cancel(lease_id=cancelled.pk, actor=SYSTEM)

    response = post(east, rec(reserved, "r", start), rec(cancelled, "c", start))

    assert fault(response) == [(0, "r", "lease_not_started", "lease"), (1, "c", "lease_not_started", "lease")]
    assert UsageRecord.objects.count() == 0


def test_usage_outside_the_lease_window_or_over_its_cards_is_refused(
    east: APIClient, buyer: Organisation, east_cluster: Cluster
) -> None:
    lease = running_lease(east_cluster, buyer, cards=4, hours_ago=2, hours=2)  # ends now
    t0 = lease.start_at

    response = post(
        east,
        rec(lease, "fine", t0),
        rec(lease, "early", t0 - timedelta(minutes=1)),
        rec(lease, "late", lease.end_at - timedelta(minutes=5)),
        rec(lease, "wide", t0, cards=5),
        rec(lease, "last", lease.end_at - timedelta(minutes=10)),  # ends exactly at end_at: fine
    )

    assert fault(response) == [
        (1, "early", "before_lease_start", "start_at"),
        (2, "late", "after_lease_end", "end_at"),
        (3, "wide", "cards_over_lease", "cards"),
    ]
    assert UsageRecord.objects.count() == 0


def test_usage_after_the_reported_stop_is_refused(
    east: APIClient, buyer: Organisation, east_cluster: Cluster
) -> None:
    lease = running_lease(east_cluster, buyer)
    stop = lease.start_at + timedelta(minutes=30)
    dispatch.lease_stop(operator=lease.operator, lease_id=lease.pk, actor=SYSTEM, at=stop)

    response = post(east, rec(lease, "over", stop - timedelta(minutes=5)))

    assert fault(response) == [(0, "over", "after_lease_ended", "end_at")]
    assert post(east, rec(lease, "upto", stop - timedelta(minutes=10))).status_code == 201


@override_settings(CARDHOUR_USAGE_REPORT_INTERVAL_SECONDS=60)
def test_usage_more_than_one_interval_after_a_stop_request_is_refused(
    east: APIClient, buyer: Organisation, east_cluster: Cluster
) -> None:
    lease = running_lease(east_cluster, buyer)
    lease_cancel(lease_id=lease.pk, actor=SYSTEM)  # a running lease cancelled by the buyer: stop requested
    lease.refresh_from_db()
    asked = lease.stop_requested_at
    assert lease.state == LeaseState.STOP_REQUESTED and asked is not None
    limit = asked.replace(microsecond=0) + timedelta(seconds=60)

    beyond = {
        **rec(lease, "beyond", limit - timedelta(minutes=10)),
        "end_at": (limit + timedelta(seconds=1)).isoformat(),
    }
    within = {**rec(lease, "within", limit - timedelta(minutes=10)), "end_at": limit.isoformat()}

    assert fault(post(east, within, beyond)) == [(1, "beyond", "after_stop_request", "end_at")]
    assert UsageRecord.objects.count() == 0
    assert post(east, within).status_code == 201


def test_a_replayed_batch_is_answered_even_after_its_lease_was_asked_to_stop(
    east: APIClient, buyer: Organisation, east_cluster: Cluster
) -> None:
    lease = running_lease(east_cluster, buyer)
    record = rec(lease, "sent", now_s() - timedelta(minutes=1), minutes=3)  # ends 2 minutes from now
    original = post(east, record).json()["records"][0]["usage_record"]
    Lease.objects.filter(pk=lease.pk).update(
        state=LeaseState.STOP_REQUESTED, stop_requested_at=now_s() - timedelta(minutes=2)
    )

    replay = post(east, record)
    fresh = post(east, {**record, "idempotency_key": "new"})

    assert replay.status_code == 200
    assert replay.json()["records"] == [
        {"index": 0, "idempotency_key": "sent", "status": "duplicate", "usage_record": original}
    ]
    assert fault(fresh) == [(0, "new", "after_stop_request", "end_at")]


def test_metering_validation_passes_through(
    east: APIClient, buyer: Organisation, east_cluster: Cluster
) -> None:
    lease = running_lease(east_cluster, buyer)
    start = lease.start_at
    backwards = {**rec(lease, "b", start + timedelta(minutes=10)), "end_at": start.isoformat()}
    subsecond = {**rec(lease, "s", start), "start_at": (start + timedelta(microseconds=5)).isoformat()}

    response = post(east, backwards, subsecond)

    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "usage_batch_invalid"
    assert [(e["index"], e["code"]) for e in body["extra"]["errors"]] == [
        (0, "end_not_after_start"),
        (1, "subsecond_timestamp"),
    ]
    assert UsageRecord.objects.count() == 0


@override_settings(CARDHOUR_USAGE_BATCH_MAX=2)
def test_a_batch_over_the_maximum_is_refused(
    east: APIClient, buyer: Organisation, east_cluster: Cluster
) -> None:
    lease = running_lease(east_cluster, buyer)

    response = post(
        east, *(rec(lease, f"k{i}", lease.start_at + timedelta(minutes=10 * i)) for i in range(3))
    )

    assert response.status_code == 400
    assert response.json()["code"] == "usage_batch_too_large" and response.json()["extra"] == {"max": 2}
    assert UsageRecord.objects.count() == 0


def test_a_malformed_body_gets_field_errors_and_unusual_but_valid_input_is_accepted(
    east: APIClient, buyer: Organisation, east_cluster: Cluster
) -> None:
    lease = running_lease(east_cluster, buyer)
    start = lease.start_at

    empty = post(east)
    assert empty.status_code == 400 and list(empty.json()["extra"]["fields"]) == ["records"]
    naive = post(east, {**rec(lease, "n", start), "start_at": "2026-11-21T10:00:00"})
    assert naive.status_code == 400 and naive.json()["code"] == "invalid"
    assert naive.json()["extra"]["fields"]["records"]["0"] == {
        "start_at": ["Include a UTC offset (e.g. 2026-11-21T10:00:00+08:00 or ...Z)."]
    }
    zero = post(east, rec(lease, "z", start, cards=0))
    assert zero.status_code == 400 and list(zero.json()["extra"]["fields"]["records"]["0"]) == ["cards"]
    assert UsageRecord.objects.count() == 0

    # A lease id as a string is refused (JSON types as the schema says, core.api.strict); a key with
    # surrounding spaces takes the serializer's path, not the fast one, and is trimmed.
    text_id = post(east, {**rec(lease, "t", start), "lease": str(lease.pk)})
    assert text_id.status_code == 400
    assert text_id.json()["extra"]["fields"] == {
        "records": {"0": {"lease": ["Must be an integer, not a string."]}}
    }
    odd = post(east, rec(lease, "  spaced  ", start))
    assert odd.status_code == 201
    assert odd.json()["records"][0]["idempotency_key"] == "spaced"


def test_the_service_takes_an_empty_batch(east_operator: Organisation) -> None:
    result = dispatch.lease_usage_report(operator=east_operator, records=[], actor=SYSTEM)

    assert result.outcomes == () and result.created == 0


# --- Lease events -----------------------------------------------------------------------------------


@dataclass
class Receiver:
    """A cluster agent's endpoint: checks each event's signature and answers ``status``."""

    secret: str = ""
    status: int = 204
    received: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            timestamp = self.headers["X-Cardhour-Timestamp"]
            expected = hmac.new(
                state.secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256
            ).hexdigest()
            state.received.append(
                {
                    "path": self.path,
                    "event": self.headers["X-Cardhour-Event"],
                    "delivery": self.headers["X-Cardhour-Delivery"],
                    "content_type": self.headers["Content-Type"],
                    "signed": hmac.compare_digest(self.headers["X-Cardhour-Signature"], f"sha256={expected}"),
                    "body": json.loads(body),
                }
            )
            self.send_response(state.status)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/cardhour/events"
    yield state
    server.shutdown()
    server.server_close()


@pytest.fixture
def subscribed(east: APIClient, east_cluster: Cluster, receiver: Receiver) -> Receiver:
    """East's cluster points at the receiver and east enabled lease events (through the API)."""
    Cluster.objects.filter(pk=east_cluster.pk).update(endpoint_url=receiver.url)
    response = east.post("/api/v1/operator/endpoint-secret")
    assert response.status_code == 200
    receiver.secret = response.json()["secret"]
    return receiver


def test_no_event_is_queued_without_an_enabled_endpoint(buyer: Organisation, east_cluster: Cluster) -> None:
    running_lease(east_cluster, buyer)

    assert LeaseEventDelivery.objects.count() == 0
    assert dispatch.lease_events_deliver_due() == 0


def test_events_are_posted_signed_and_marked_delivered(
    subscribed: Receiver, buyer: Organisation, east_operator: Organisation, east_cluster: Cluster
) -> None:
    lease = running_lease(east_cluster, buyer, cards=4)
    transitions = list(LeaseTransition.objects.filter(lease=lease).order_by("id"))
    assert LeaseEventDelivery.objects.filter(status="pending").count() == 2

    assert dispatch.lease_events_deliver_due() == 2

    lease = Lease.objects.get(pk=lease.pk)
    from broker.selectors import lease_get_for_operator

    document = dispatch.lease_document(
        lease=lease_get_for_operator(operator=east_operator, lease_id=lease.pk)
    )
    assert [r["signed"] for r in subscribed.received] == [True, True]
    assert subscribed.received[0] == {
        "path": "/cardhour/events",
        "event": "lease.reserved",
        "delivery": str(transitions[0].pk),
        "content_type": "application/json",
        "signed": True,
        "body": {
            "id": transitions[0].pk,
            "type": "lease.reserved",
            "lease": document,
            "from_state": None,
            "to_state": "reserved",
            "at": timezone.localtime(transitions[0].at).isoformat(),
            "reason": "",
        },
    }
    assert subscribed.received[1]["body"]["to_state"] == "running"
    assert subscribed.received[1]["body"]["from_state"] == "reserved"
    assert document["state"] == "running"
    deliveries = LeaseEventDelivery.objects.order_by("id")
    assert [(d.status, d.attempts, d.last_error) for d in deliveries] == [
        ("delivered", 1, ""),
        ("delivered", 1, ""),
    ]
    assert all(d.delivered_at is not None for d in deliveries)
    assert dispatch.lease_events_deliver_due() == 0  # nothing is sent twice
    assert len(subscribed.received) == 2


def test_a_failing_endpoint_is_retried_with_backoff_then_given_up(
    subscribed: Receiver, buyer: Organisation, east_cluster: Cluster
) -> None:
    subscribed.status = 500
    make_lease(job=make_job(buyer=buyer), cluster=east_cluster)
    delivery = LeaseEventDelivery.objects.get()
    now = timezone.now()

    assert dispatch.lease_events_deliver_due(now=now) == 0
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.last_error) == ("pending", 1, "HTTP 500")
    assert delivery.next_attempt_at == now + timedelta(seconds=5)

    assert dispatch.lease_events_deliver_due(now=now + timedelta(seconds=4)) == 0  # not due yet
    assert len(subscribed.received) == 1

    later = now + timedelta(seconds=5)
    dispatch.lease_events_deliver_due(now=later)
    delivery.refresh_from_db()
    assert (delivery.attempts, delivery.next_attempt_at) == (2, later + timedelta(seconds=10))

    waits = []
    at = delivery.next_attempt_at
    while delivery.status == "pending":
        dispatch.lease_events_deliver_due(now=at)
        delivery.refresh_from_db()
        waits.append(int((delivery.next_attempt_at - at).total_seconds()))
        at = delivery.next_attempt_at
    assert delivery.status == "gave_up" and delivery.attempts == 12 and delivery.last_error == "HTTP 500"
    assert waits[:-1] == [20, 40, 80, 160, 320, 640, 1280, 2560, 3600]
    assert len(subscribed.received) == 12
    assert all(r["signed"] for r in subscribed.received)


def test_a_recovered_endpoint_gets_the_event_on_the_next_attempt(
    subscribed: Receiver, buyer: Organisation, east_cluster: Cluster
) -> None:
    subscribed.status = 503
    make_lease(job=make_job(buyer=buyer), cluster=east_cluster)
    now = timezone.now()
    dispatch.lease_events_deliver_due(now=now)

    subscribed.status = 200
    assert dispatch.lease_events_deliver_due(now=now + timedelta(seconds=5)) == 1
    delivery = LeaseEventDelivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.last_error) == ("delivered", 2, "")


def test_an_unreachable_endpoint_is_a_failed_attempt(
    subscribed: Receiver, buyer: Organisation, east_cluster: Cluster
) -> None:
    Cluster.objects.filter(pk=east_cluster.pk).update(endpoint_url="http://127.0.0.1:9/events")
    make_lease(job=make_job(buyer=buyer), cluster=east_cluster)

    assert dispatch.lease_events_deliver_due() == 0
    delivery = LeaseEventDelivery.objects.get()
    assert delivery.attempts == 1 and delivery.status == "pending"
    assert delivery.last_error.startswith("ConnectionRefusedError")


def test_rotating_the_secret_signs_with_the_new_one_and_delete_disables(
    east: APIClient,
    subscribed: Receiver,
    buyer: Organisation,
    east_operator: Organisation,
    east_cluster: Cluster,
) -> None:
    old = subscribed.secret
    rotated = east.post("/api/v1/operator/endpoint-secret").json()
    assert rotated["enabled"] is True and rotated["secret"] != old and rotated["secret"].startswith("chw_")
    assert OperatorEndpoint.objects.get(operator=east_operator).secret == rotated["secret"]

    make_lease(job=make_job(buyer=buyer), cluster=east_cluster)
    dispatch.lease_events_deliver_due()
    assert [r["signed"] for r in subscribed.received] == [False]  # the receiver still holds the old secret

    assert east.delete("/api/v1/operator/endpoint-secret").status_code == 204
    endpoint = OperatorEndpoint.objects.get(operator=east_operator)
    assert (endpoint.enabled, endpoint.secret) == (False, "")
    pending = LeaseEventDelivery.objects.get()
    LeaseEventDelivery.objects.filter(pk=pending.pk).update(status="pending", next_attempt_at=timezone.now())
    make_lease(job=make_job(buyer=buyer), cluster=east_cluster, island="isl-02")
    assert LeaseEventDelivery.objects.count() == 1  # nothing new is queued

    assert dispatch.lease_events_deliver_due() == 0  # and what was queued is given up
    pending.refresh_from_db()
    assert pending.status == "gave_up" and pending.last_error == "lease events are disabled for this operator"
    assert len(subscribed.received) == 1
