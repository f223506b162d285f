"""Accepting quotes: leases hold cards, never oversubscribe an island (64 concurrent acceptances on
PostgreSQL), refuse what the buyer cannot pay, expire; the lease state machine and cancellation."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from broker.models import CapacityHold, Job, Lease, LeaseState, LeaseTransition, Quote
from broker.services.leases import TRANSITIONS, lease_lock, lease_transition, peak_occupancy
from core.models import Organisation
from core.services import api_token_create
from core.types import Actor
from federation.models import Cluster
from tests.broker.conftest import A800
from tests.broker.factories import make_job, make_lease
from tests.factories import BuyerFactory, make_cluster
from tests.metering.factories import make_paid_pack, make_price_card


def submit(client: APIClient, **overrides: object) -> dict:
    now = timezone.now()
    body = {
        "name": "train",
        "cards": 8,
        "origin_hub": "yrd",
        "latency_budget_ms": 100,
        "deadline_at": (now + timedelta(hours=6)).isoformat(),
        "duration_seconds": 3600,
        **overrides,
    }
    response = client.post("/api/v1/jobs", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def quote(client: APIClient, job_id: int, **body: object) -> dict:
    response = client.post(f"/api/v1/jobs/{job_id}/quotes", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def test_accepting_a_quote_holds_its_cards_and_repeating_it_returns_the_lease(
    funded_buyer: Organisation, east_cluster: Cluster, token_client
) -> None:
    client = token_client(funded_buyer)
    job = submit(client)
    first = quote(client, job["id"])["quotes"][0]
    response = client.post(f"/api/v1/quotes/{first['id']}/accept")
    assert response.status_code == 201
    lease = response.json()
    assert lease["state"] == "reserved"
    assert lease["islands"] == first["islands"]
    assert (lease["start_at"], lease["end_at"]) == (first["start_at"], first["end_at"])
    assert lease["price_card"] == first["price_card"]
    assert lease["expected_cost"] == first["cost"]
    hold = CapacityHold.objects.get(lease_id=lease["id"])
    assert (hold.cards, hold.active) == (8, True)
    assert Job.objects.get(pk=job["id"]).state == Job.State.PLACED
    again = client.post(f"/api/v1/quotes/{first['id']}/accept")
    assert again.status_code == 200 and again.json()["id"] == lease["id"]
    assert Lease.objects.count() == 1
    # The island it took is full for that window now: another job may be offered it only before or after
    # the lease (which of the two depends on the hour the test runs at, through the tariff's bands).
    other = submit(client)
    taken_from, taken_to = datetime.fromisoformat(first["start_at"]), datetime.fromisoformat(first["end_at"])
    for offered in quote(client, other["id"])["quotes"]:
        if offered["islands"][0]["cpi"] == first["islands"][0]["cpi"]:
            start, end = (
                datetime.fromisoformat(offered["start_at"]),
                datetime.fromisoformat(offered["end_at"]),
            )
            assert end <= taken_from or start >= taken_to, (offered, first)


def test_a_second_quote_of_a_placed_job_is_superseded(
    funded_buyer: Organisation, east_cluster: Cluster, token_client
) -> None:
    client = token_client(funded_buyer)
    job = submit(client)
    quotes = quote(client, job["id"])["quotes"]
    later = quote(client, job["id"])["quotes"]  # a second request: its quotes are live too
    accepted = client.post(f"/api/v1/quotes/{quotes[0]['id']}/accept")
    assert accepted.status_code == 201, accepted.json()
    response = client.post(f"/api/v1/quotes/{later[0]['id']}/accept")
    assert response.status_code == 409
    assert response.json()["code"] == "quote_superseded"


def test_an_expired_quote_cannot_be_accepted(
    funded_buyer: Organisation, east_cluster: Cluster, token_client
) -> None:
    client = token_client(funded_buyer)
    job = submit(client)
    body = quote(client, job["id"])
    expires = timezone.datetime.fromisoformat(body["expires_at"])
    assert timedelta(seconds=59) < expires - timezone.now() <= timedelta(seconds=60)
    Quote.objects.filter(job_id=job["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    response = client.post(f"/api/v1/quotes/{body['quotes'][0]['id']}/accept")
    assert response.status_code == 409
    assert response.json()["code"] == "quote_expired"
    assert not Lease.objects.exists() and not CapacityHold.objects.exists()


def test_a_buyer_who_cannot_pay_is_told_in_the_quote_and_refused_with_402(
    buyer: Organisation, east_cluster: Cluster, token_client
) -> None:
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=1, price="10.00", key="tiny")
    client = token_client(buyer)
    job = submit(client)
    first = quote(client, job["id"])["quotes"][0]
    assert first["balance_sufficient"] is False
    response = client.post(f"/api/v1/quotes/{first['id']}/accept")
    assert response.status_code == 402
    body = response.json()
    assert body["code"] == "insufficient_balance"
    assert body["extra"]["pack_class"] == A800
    assert Decimal(body["extra"]["expected_draw"]) == Decimal(first["expected_draw"])
    # Named in the unit of the pack that would pay (the A800 pack), to two places; exact in ``extra``.
    draw = Decimal(first["expected_draw"])
    assert (
        f"expected draw of {draw.quantize(Decimal('0.01'))} {A800} card-hours; your packs have 1.00 of it free"
        in (body["message"])
    )
    plan = body["extra"]["draw_plan"]
    assert [(p["pack_class"], p["unit"], p["card_hours"]) for p in plan["paid_by"]] == [
        (A800, "chip_card_hours", "1.000000")
    ]
    assert Decimal(plan["uncovered_chip_card_hours"]) == draw - 1
    assert first["draw_plan"]["paid_by"][0]["card_hours"] == "1.000000"
    assert (
        not Lease.objects.exists()
        and not CapacityHold.objects.exists()
        and not LeaseTransition.objects.exists()
    )


def test_live_leases_count_against_the_balance(
    buyer: Organisation, east_cluster: Cluster, token_client
) -> None:
    # 8 cards × 1 h at most 1.7 → ≤ 13.6 card-hours each; 20 card-hours pay for one, not two.
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=20, price="200.00", key="twenty")
    client = token_client(buyer)
    start = (timezone.now() + timedelta(hours=1)).isoformat()
    first = quote(client, submit(client, earliest_start_at=start)["id"])["quotes"][0]
    assert client.post(f"/api/v1/quotes/{first['id']}/accept").status_code == 201
    second = quote(client, submit(client, earliest_start_at=start)["id"])["quotes"][0]
    if Decimal(first["expected_draw"]) + Decimal(second["expected_draw"]) > 20:
        assert second["balance_sufficient"] is False
        assert client.post(f"/api/v1/quotes/{second['id']}/accept").status_code == 402
    # A standard pack tops the A800 class up at the A800's factor.
    make_paid_pack(buyer=buyer, accelerator=None, card_hours=20, price="300.00", key="std")
    third = quote(client, submit(client, earliest_start_at=start)["id"])["quotes"][0]
    assert third["balance_sufficient"] is True


def test_cancelling_a_reserved_lease_releases_its_cards_at_once(
    funded_buyer: Organisation, east_cluster: Cluster, token_client
) -> None:
    client = token_client(funded_buyer)
    job = submit(client, deadline_at=(timezone.now() + timedelta(hours=1, minutes=1)).isoformat())
    accepted = []
    for _ in range(2):
        body = quote(client, submit(client, deadline_at=job["deadline_at"])["id"])
        accepted.append(client.post(f"/api/v1/quotes/{body['quotes'][0]['id']}/accept").json())
    full = quote(client, job["id"])
    assert full["quotes"] == [] and full["rejections"]["capacity"] == 2
    response = client.post(f"/api/v1/leases/{accepted[0]['id']}/cancel")
    assert response.status_code == 200 and response.json()["state"] == "cancelled"
    assert not CapacityHold.objects.filter(lease_id=accepted[0]["id"], active=True).exists()
    assert Job.objects.get(pk=accepted[0]["job"]).state == Job.State.OPEN
    freed = quote(client, job["id"])
    assert [q["islands"] for q in freed["quotes"]] == [accepted[0]["islands"]]
    again = client.post(f"/api/v1/leases/{accepted[0]['id']}/cancel")
    assert again.status_code == 409 and again.json()["code"] == "lease_invalid_transition"


def test_every_transition_is_recorded_and_the_state_machine_holds(
    buyer: Organisation, east_cluster: Cluster
) -> None:
    actor = Actor.system("test")
    for state, allowed in TRANSITIONS.items():
        for target in LeaseState.values:
            lease = make_lease(
                job=make_job(buyer=buyer),
                cluster=east_cluster,
                cards=1,
                start_at=timezone.now() + timedelta(days=1, minutes=len(allowed)),
            )
            path = {
                LeaseState.RESERVED: [],
                LeaseState.RUNNING: [LeaseState.RUNNING],
                LeaseState.STOP_REQUESTED: [LeaseState.RUNNING, LeaseState.STOP_REQUESTED],
                LeaseState.COMPLETED: [LeaseState.RUNNING, LeaseState.COMPLETED],
                LeaseState.CANCELLED: [LeaseState.CANCELLED],
                LeaseState.INTERRUPTED: [LeaseState.RUNNING, LeaseState.INTERRUPTED],
                LeaseState.FAILED: [LeaseState.FAILED],
            }[state]
            for step in path:
                lease_transition(lease=lease_lock(lease_id=lease.pk), to_state=step, actor=actor)
            lease = lease_lock(lease_id=lease.pk)
            before = LeaseTransition.objects.filter(lease=lease).count()
            if target in allowed:
                lease_transition(lease=lease, to_state=target, actor=actor, reason="why")
                assert LeaseTransition.objects.filter(lease=lease).count() == before + 1
                last = LeaseTransition.objects.filter(lease=lease).last()
                assert last is not None and (last.from_state, last.to_state, last.reason) == (
                    state,
                    target,
                    "why",
                )
            else:
                with pytest.raises(Exception) as raised:
                    lease_transition(lease=lease, to_state=target, actor=actor)
                assert getattr(raised.value, "code", "") == "lease_invalid_transition"
                assert LeaseTransition.objects.filter(lease=lease).count() == before
            Lease.objects.filter(pk=lease.pk).update(state=LeaseState.CANCELLED)  # free the cards
            CapacityHold.objects.filter(lease=lease).update(active=False)


def test_buyers_see_only_their_own_jobs_quotes_and_leases(
    funded_buyer: Organisation, east_cluster: Cluster, east_operator: Organisation, token_client
) -> None:
    mine = token_client(funded_buyer)
    job = submit(mine)
    first = quote(mine, job["id"])["quotes"][0]
    lease = mine.post(f"/api/v1/quotes/{first['id']}/accept").json()
    other = token_client(BuyerFactory(slug="rival"))
    for method, url in [
        ("get", f"/api/v1/jobs/{job['id']}"),
        ("post", f"/api/v1/jobs/{job['id']}/quotes"),
        ("post", f"/api/v1/jobs/{job['id']}/cancel"),
        ("post", f"/api/v1/quotes/{first['id']}/accept"),
        ("get", f"/api/v1/leases/{lease['id']}"),
        ("post", f"/api/v1/leases/{lease['id']}/cancel"),
    ]:
        response = getattr(other, method)(url)
        assert response.status_code == 404, (url, response.json())
    assert other.get("/api/v1/jobs").json()["results"] == []
    assert other.get("/api/v1/leases").json()["results"] == []
    operator = token_client(east_operator)
    response = operator.get("/api/v1/jobs")
    assert response.status_code == 403 and response.json()["code"] == "not_a_buyer"
    assert Lease.objects.get().state == LeaseState.RESERVED


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_64_concurrent_acceptances_for_the_last_cards(east_operator: Organisation, presets: None) -> None:
    """One island of 64 cards, 64 buyers' quotes for 8 cards each over the same hour: exactly 8 win, the
    other 56 get 409 capacity_taken, and the calendar never exceeds 64 cards."""
    cluster = make_cluster(operator=east_operator, hub="yrd", name="race", islands=[("isl-01", 64)])
    make_price_card(cluster=cluster, rate="10.0000", tariff_code="flat")
    start = timezone.now() + timedelta(hours=2)
    clients, quote_ids = [], []
    for i in range(64):
        buyer = BuyerFactory(slug=f"racer-{i:02d}")
        make_paid_pack(buyer=buyer, accelerator=A800, card_hours=100, price="1000.00", key=f"race-{i}")
        _, secret = api_token_create(organisation=buyer, name="race", scope="read_write")
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
        job = submit(
            client, earliest_start_at=start.isoformat(), deadline_at=(start + timedelta(hours=1)).isoformat()
        )
        (only,) = quote(client, job["id"])["quotes"]
        clients.append(client)
        quote_ids.append(only["id"])
    barrier = threading.Barrier(64)
    outcomes: list[tuple[int, str]] = []
    lock = threading.Lock()

    def accept(i: int) -> None:
        try:
            barrier.wait()
            response = clients[i].post(f"/api/v1/quotes/{quote_ids[i]}/accept")
            body = response.json()
            with lock:
                outcomes.append((response.status_code, body.get("code", body.get("state", ""))))
        finally:
            connection.close()

    threads = [threading.Thread(target=accept, args=(i,)) for i in range(64)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert Counter(outcomes) == Counter({(201, "reserved"): 8, (409, "capacity_taken"): 56})
    island = cluster.islands.get()
    assert CapacityHold.objects.filter(island=island, active=True).count() == 8
    assert (
        peak_occupancy(
            island_id=island.pk, start_at=start - timedelta(hours=1), end_at=start + timedelta(hours=3)
        )
        == 64
    )
    assert Lease.objects.count() == 8 == LeaseTransition.objects.count()


def test_a_lease_tells_how_a_standard_pack_pays_it(
    buyer: Organisation, east_cluster: Cluster, token_client
) -> None:
    """A standard pack only: the lease's expected draw is paid in standard card-hours (× 0.78, the A800's
    factor) and nothing has been drawn or spent yet."""
    make_paid_pack(buyer=buyer, accelerator=None, card_hours=1000, price="12000.00", key="std")
    client = token_client(buyer)
    job = submit(client)
    first = quote(client, job["id"])["quotes"][0]
    lease = client.post(f"/api/v1/quotes/{first['id']}/accept").json()
    detail = client.get(f"/api/v1/leases/{lease['id']}").json()
    draw = Decimal(first["expected_draw"])
    assert [
        (p["pack_class"], p["unit"], Decimal(p["card_hours"]), p["standard_card_factor"])
        for p in detail["draw_plan"]["paid_by"]
    ] == [("std", "standard_card_hours", (draw * Decimal("0.78")).quantize(Decimal("0.000001")), "0.7800")]
    assert (detail["draw_plan"]["uncovered_chip_card_hours"], detail["drawn"], detail["spend"]) == (
        "0.000000",
        [],
        "0.00",
    )


# --- Offers of several identical islands ----------------------------------------------------------------


def test_an_offer_of_two_islands_is_one_quote_and_acceptance_takes_a_free_one(
    funded_buyer: Organisation, east_cluster: Cluster, token_client
) -> None:
    """East's two islands of 8 are one offer; another lease takes isl-01 over the quoted hour after the
    quote: accepting holds isl-02 instead, at the quoted window and price."""
    client = token_client(funded_buyer)
    job = submit(client)
    (offer,) = quote(client, job["id"])["quotes"]
    assert offer["islands_available"] == 2
    assert offer["islands"] == [{"cpi": "cpi:ctyun:yrd:sh-ai01:isl-01", "cards": 8}]
    assert offer["alternatives"] == [{"cpi": "cpi:ctyun:yrd:sh-ai01:isl-02", "cards": 8}]
    start, end = datetime.fromisoformat(offer["start_at"]), datetime.fromisoformat(offer["end_at"])
    make_lease(job=make_job(buyer=funded_buyer), cluster=east_cluster, start_at=start, end_at=end)
    response = client.post(f"/api/v1/quotes/{offer['id']}/accept")
    assert response.status_code == 201, response.json()
    lease = response.json()
    assert lease["islands"] == [{"cpi": "cpi:ctyun:yrd:sh-ai01:isl-02", "cards": 8}]
    assert (lease["start_at"], lease["end_at"], lease["expected_cost"]) == (
        offer["start_at"],
        offer["end_at"],
        offer["cost"],
    )


def test_an_offer_whose_islands_were_all_taken_is_refused_and_writes_nothing(
    funded_buyer: Organisation, east_cluster: Cluster, token_client
) -> None:
    client = token_client(funded_buyer)
    job = submit(client)
    (offer,) = quote(client, job["id"])["quotes"]
    start, end = datetime.fromisoformat(offer["start_at"]), datetime.fromisoformat(offer["end_at"])
    for island in ("isl-01", "isl-02"):
        make_lease(
            job=make_job(buyer=funded_buyer), cluster=east_cluster, island=island, start_at=start, end_at=end
        )
    leases, transitions = Lease.objects.count(), LeaseTransition.objects.count()
    response = client.post(f"/api/v1/quotes/{offer['id']}/accept")
    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "capacity_taken"
    assert body["message"] == "Every one of the 2 islands of this offer was taken since the quote."
    assert body["extra"] == {
        "islands": ["cpi:ctyun:yrd:sh-ai01:isl-01", "cpi:ctyun:yrd:sh-ai01:isl-02"],
        "cards": 8,
    }
    assert (Lease.objects.count(), LeaseTransition.objects.count()) == (leases, transitions)
    assert Job.objects.get(pk=job["id"]).state == Job.State.OPEN


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_12_concurrent_acceptances_of_one_offer_of_4_islands(
    east_operator: Organisation, presets: None
) -> None:
    """Four identical islands of 16 cards, one offer; 12 buyers accept it for 16 cards at once: exactly 4
    win, each on a different island, the other 8 get 409 capacity_taken, and no island is oversubscribed
    (every try locks its island in id order, so racing acceptances cannot deadlock)."""
    cluster = make_cluster(
        operator=east_operator, hub="yrd", name="race4", islands=[(f"isl-0{i}", 16) for i in range(1, 5)]
    )
    make_price_card(cluster=cluster, rate="10.0000", tariff_code="flat")
    start = timezone.now() + timedelta(hours=2)
    clients, quote_ids = [], []
    for i in range(12):
        buyer = BuyerFactory(slug=f"offer-racer-{i:02d}")
        make_paid_pack(buyer=buyer, accelerator=A800, card_hours=100, price="1000.00", key=f"offer-{i}")
        _, secret = api_token_create(organisation=buyer, name="race", scope="read_write")
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
        job = submit(
            client,
            cards=16,
            earliest_start_at=start.isoformat(),
            deadline_at=(start + timedelta(hours=1)).isoformat(),
        )
        (only,) = quote(client, job["id"])["quotes"]
        assert only["islands_available"] == 4
        clients.append(client)
        quote_ids.append(only["id"])
    barrier = threading.Barrier(12)
    outcomes: list[tuple[int, str]] = []
    lock = threading.Lock()

    def accept(i: int) -> None:
        try:
            barrier.wait()
            response = clients[i].post(f"/api/v1/quotes/{quote_ids[i]}/accept")
            body = response.json()
            with lock:
                outcomes.append((response.status_code, body.get("code", body.get("state", ""))))
        finally:
            connection.close()

    threads = [threading.Thread(target=accept, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert Counter(outcomes) == Counter({(201, "reserved"): 4, (409, "capacity_taken"): 8})
    held = Counter(CapacityHold.objects.filter(active=True).values_list("island__name", flat=True))
    assert held == Counter({"isl-01": 1, "isl-02": 1, "isl-03": 1, "isl-04": 1})
