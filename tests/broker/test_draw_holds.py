"""Pending draws (broker.services.draw_holds): each live lease holds its expected draw less what rating has
posted for it, the buyer's sum per class is kept in the same transactions, and a quote reads the sum. The
kept figure must equal a recomputation from the live leases and the rated segments after any sequence of
acceptances, starts, usage, rating, cancellations, ends and failovers; and one buyer's racing acceptances
cannot together spend the same balance."""

from __future__ import annotations

import itertools
import random
import threading
from collections import Counter
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from broker.draws import buyer_packs_after_leases
from broker.errors import CapacityTakenError
from broker.models import HOLDING_STATES, DrawHold, DrawPending, Lease, LeaseState
from broker.selectors import draw_pending_for, draw_pending_recompute
from broker.services.failover import leases_fail_over
from broker.services.leases import lease_cancel, lease_lock, lease_transition
from core.models import Organisation
from core.money import to_micros
from core.services import api_token_create
from core.types import Actor
from federation.models import Cluster
from metering.selectors.spend import usage_chip_draws
from metering.services.rating import usage_rate_pending
from tests.broker.conftest import A800
from tests.broker.factories import make_job, make_lease
from tests.broker.test_failover import (  # noqa: F401  (market is a fixture)
    backdate_price_cards,
    market,
    report_usage,
    start,
    take_offline,
)
from tests.broker.test_leases import quote, submit
from tests.factories import make_cluster
from tests.metering.factories import make_paid_pack, make_price_card

pytestmark = pytest.mark.django_db
TEST = Actor.system("test")


def assert_pending_is_recomputed(buyer: Organisation) -> None:
    """The kept figure is the from-scratch one, and each hold is open exactly while its lease is live,
    with what rating posted for its usage."""
    assert draw_pending_for(buyer_id=buyer.pk) == draw_pending_recompute(buyer_id=buyer.pk)
    holds = list(DrawHold.objects.filter(buyer=buyer).select_related("lease"))
    assert {hold.lease_id for hold in holds} == set(
        Lease.objects.filter(buyer=buyer).values_list("pk", flat=True)
    )
    posted = usage_chip_draws(references=[hold.lease.reference for hold in holds])
    for hold in holds:
        live = hold.lease.state in HOLDING_STATES
        assert (hold.voided_at is None) == live, hold.lease.state
        assert hold.expected_micros == to_micros(hold.lease.expected_draw)
        if live:
            assert hold.posted_micros == posted.get(hold.lease.reference, 0)
    rows = dict(DrawPending.objects.filter(buyer=buyer).values_list("draw_class", "open_micros"))
    sums: Counter[str] = Counter()
    for hold in holds:
        sums[hold.draw_class] += hold.open_micros
    assert {k: v for k, v in rows.items() if v} == {k: v for k, v in sums.items() if v}


@pytest.mark.parametrize("seed", [7, 11, 23])
def test_the_kept_pending_draws_equal_a_recomputation_after_any_sequence(
    seed: int,
    market: dict[str, Cluster],  # noqa: F811
    buyer: Organisation,
) -> None:
    rng = random.Random(seed)
    now = timezone.now().replace(microsecond=0)
    paid_at = now - timedelta(hours=3)
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=6, price="54.00", key="a800", paid_at=paid_at)
    make_paid_pack(buyer=buyer, accelerator=None, card_hours=50, price="600.00", key="std", paid_at=paid_at)
    keys = itertools.count()
    usage_end: dict[int, object] = {}
    failed_over = False
    seen: Counter[str] = Counter()

    def live(*states: str) -> list[Lease]:
        return list(Lease.objects.filter(buyer=buyer, state__in=states).order_by("pk"))

    for step in range(40):
        op = rng.choice(["accept", "accept", "start", "usage", "usage", "rate", "cancel", "end", "failover"])
        if op == "accept":
            cluster = market["west"] if failed_over or rng.random() < 0.3 else market["east"]
            start_at = now + timedelta(minutes=rng.choice([-110, -60, -30, 45]))
            try:
                lease = make_lease(
                    job=make_job(buyer=buyer, accelerators=[A800], duration_seconds=2 * 3600),
                    cluster=cluster,
                    cards=rng.choice([1, 2]),
                    start_at=start_at,
                    island=rng.choice(["isl-01", "isl-02"]),
                    expected_draw=f"{rng.randint(0, 4000) / 1000:.3f}",
                )
            except CapacityTakenError:
                continue
            if start_at <= now and rng.random() < 0.6:  # most leases that began are running
                start(lease_lock(lease_id=lease.pk), at=start_at)
                seen["start"] += 1
        elif op == "start":
            due = [lease for lease in live(LeaseState.RESERVED) if lease.start_at <= timezone.now()]
            if not due:
                continue
            lease = rng.choice(due)
            start(lease_lock(lease_id=lease.pk), at=lease.start_at)
        elif op == "usage":
            running = live(LeaseState.RUNNING)
            if not running:
                continue
            lease = rng.choice(running)
            begin = usage_end.get(lease.pk, lease.start_at)
            end = min(
                begin + timedelta(minutes=rng.choice([10, 25, 40])),  # type: ignore[operator]
                timezone.now().replace(microsecond=0),
                lease.end_at,
            )  # type: ignore[operator]
            if end <= begin:  # type: ignore[operator]
                continue
            report_usage(lease, start_at=begin, end_at=end, key=f"u-{next(keys)}")  # type: ignore[arg-type]
            usage_end[lease.pk] = end
        elif op == "rate":
            usage_rate_pending()
        elif op == "cancel":
            cancellable = live(LeaseState.RESERVED, LeaseState.RUNNING)
            if not cancellable:
                continue
            lease_cancel(lease_id=rng.choice(cancellable).pk, actor=TEST)
        elif op == "end":
            ending = live(LeaseState.RUNNING, LeaseState.STOP_REQUESTED)
            if not ending:
                continue
            lease_transition(
                lease=lease_lock(lease_id=rng.choice(ending).pk), to_state=LeaseState.COMPLETED, actor=TEST
            )
        elif op == "failover":
            if failed_over or step < 18 or not live(*HOLDING_STATES):
                continue
            take_offline(market["east"])
            leases_fail_over()
            failed_over = True
        seen[op] += 1
        assert_pending_is_recomputed(buyer)
    usage_rate_pending()
    assert_pending_is_recomputed(buyer)
    assert all(seen[op] for op in ("accept", "start", "usage", "rate")), seen


@pytest.fixture
def flat_cluster(east_operator: Organisation, presets: None) -> Cluster:
    """16 A800 cards priced 10 CNY/card-hour on the flat tariff (multiplier 1 at every hour)."""
    cluster = make_cluster(operator=east_operator, hub="yrd", name="flat", islands=[("isl-01", 16)])
    make_price_card(cluster=cluster, rate="10.0000", tariff_code="flat")
    backdate_price_cards(cluster)
    return cluster


def test_rating_moves_a_lease_s_draw_from_its_hold_to_the_pack(
    buyer: Organisation, flat_cluster: Cluster
) -> None:
    """Pack 10 A800 card-hours, a running lease expected to draw 7: 3 are free. One card-hour of usage,
    rated, leaves the pack 9 and the hold 6 — still 3 free (expected less posted, not counted twice);
    usage past the expected draw takes the hold to zero, never below; the lease's end frees the rest."""
    now = timezone.now().replace(microsecond=0)
    began = now - timedelta(hours=2)
    # Paid before the usage: rating draws a pack only while it is valid.
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=10, price="90.00", key="ten", paid_at=began)
    lease = make_lease(
        job=make_job(buyer=buyer, accelerators=[A800], duration_seconds=3 * 3600),
        cluster=flat_cluster,
        cards=2,
        start_at=began,
        expected_draw="7",
    )
    start(lease_lock(lease_id=lease.pk), at=began)

    def free() -> list[Decimal]:
        return [slot.remaining for slot in buyer_packs_after_leases(buyer=buyer).slots]

    assert free() == [Decimal("3.000000")]
    report_usage(lease, start_at=began, end_at=began + timedelta(minutes=30), key="half-hour")
    assert free() == [Decimal("3.000000")]  # reported, not yet rated: the hold is whole, the pack too
    assert usage_rate_pending() == 1
    assert DrawHold.objects.get(pk=lease.pk).posted_micros == 1_000_000
    assert draw_pending_for(buyer_id=buyer.pk) == {A800: Decimal("6.000000")}
    assert free() == [Decimal("3.000000")]
    report_usage(lease, start_at=began + timedelta(minutes=30), end_at=now, key="the-rest")  # 3 card-hours
    usage_rate_pending()
    assert draw_pending_for(buyer_id=buyer.pk) == {A800: Decimal("3.000000")}
    assert free() == [Decimal("3.000000")]
    assert_pending_is_recomputed(buyer)
    lease_transition(lease=lease_lock(lease_id=lease.pk), to_state=LeaseState.COMPLETED, actor=TEST)
    assert draw_pending_for(buyer_id=buyer.pk) == {}
    assert free() == [Decimal("6.000000")]
    assert_pending_is_recomputed(buyer)


def test_usage_over_the_expected_draw_takes_the_hold_to_zero_not_below(
    buyer: Organisation, flat_cluster: Cluster
) -> None:
    now = timezone.now().replace(microsecond=0)
    began = now - timedelta(hours=2)
    # Paid before the usage: rating draws a pack only while it is valid.
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=10, price="90.00", key="ten", paid_at=began)
    small = make_lease(
        job=make_job(buyer=buyer, accelerators=[A800], duration_seconds=3 * 3600),
        cluster=flat_cluster,
        cards=2,
        start_at=began,
        expected_draw="1.5",
    )
    other = make_lease(
        job=make_job(buyer=buyer, accelerators=[A800], name="other"),
        cluster=flat_cluster,
        cards=1,
        start_at=now + timedelta(hours=1),
        expected_draw="2",
    )
    start(lease_lock(lease_id=small.pk), at=began)
    report_usage(small, start_at=began, end_at=began + timedelta(hours=1), key="two-card-hours")
    usage_rate_pending()
    assert DrawHold.objects.get(pk=small.pk).open_micros == 0
    assert draw_pending_for(buyer_id=buyer.pk) == {A800: Decimal("2.000000")}  # the other lease's
    assert [slot.remaining for slot in buyer_packs_after_leases(buyer=buyer).slots] == [Decimal("6.000000")]
    lease_cancel(lease_id=other.pk, actor=TEST)
    assert draw_pending_for(buyer_id=buyer.pk) == {}
    assert_pending_is_recomputed(buyer)


def test_a_quote_s_affordability_reads_the_same_queries_however_many_live_leases(
    buyer: Organisation, east_cluster: Cluster
) -> None:
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=1000, price="9000.00", key="big")
    make_paid_pack(buyer=buyer, accelerator=None, card_hours=1000, price="12000.00", key="std")
    later = timezone.now().replace(microsecond=0) + timedelta(hours=3)

    def queries() -> int:
        buyer_packs_after_leases(buyer=buyer)
        with CaptureQueriesContext(connection) as captured:
            packs = buyer_packs_after_leases(buyer=buyer)
        assert sum(slot.remaining for slot in packs.slots) < 2000
        return len(captured.captured_queries)

    make_lease(job=make_job(buyer=buyer), cluster=east_cluster, cards=1, start_at=later, expected_draw="1")
    one = queries()
    for i in range(12):
        make_lease(
            job=make_job(buyer=buyer, name=f"j{i}"),
            cluster=east_cluster,
            cards=1,
            start_at=later + timedelta(hours=2 * i),
            expected_draw="1",
            island="isl-02",
        )
    assert queries() == one
    assert draw_pending_for(buyer_id=buyer.pk) == {A800: Decimal("13.000000")}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_one_buyer_s_concurrent_acceptances_cannot_spend_the_same_balance(
    east_operator: Organisation, presets: None
) -> None:
    """One buyer, a pack of 30 A800 card-hours, 8 quotes of 8 cards × 1 h (8 card-hours each, flat
    tariff), each covered when quoted, accepted at once: exactly 3 win, 5 get 402 insufficient_balance,
    and the pending sum is the three leases' draws."""
    from tests.factories import BuyerFactory

    cluster = make_cluster(operator=east_operator, hub="yrd", name="spend", islands=[("isl-01", 64)])
    make_price_card(cluster=cluster, rate="10.0000", tariff_code="flat")
    buyer = BuyerFactory(slug="spender")
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=30, price="300.00", key="thirty")
    _, secret = api_token_create(organisation=buyer, name="race", scope="read_write")
    start_at = timezone.now() + timedelta(hours=2)
    clients, quote_ids = [], []
    for _ in range(8):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
        job = submit(
            client,
            earliest_start_at=start_at.isoformat(),
            deadline_at=(start_at + timedelta(hours=1)).isoformat(),
        )
        (only,) = quote(client, job["id"])["quotes"]
        assert only["balance_sufficient"] is True and Decimal(only["expected_draw"]) == 8
        clients.append(client)
        quote_ids.append(only["id"])
    barrier = threading.Barrier(8)
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

    threads = [threading.Thread(target=accept, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert Counter(outcomes) == Counter({(201, "reserved"): 3, (402, "insufficient_balance"): 5})
    assert draw_pending_for(buyer_id=buyer.pk) == {A800: Decimal("24.000000")}
    assert_pending_is_recomputed(buyer)
