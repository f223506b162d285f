"""No card-second billed twice: usage against a lease (and its failover chain) never exceeds the lease's
cards at any instant, whatever the idempotency keys — over REST, in the service, against a brute force, and
under concurrent batches on PostgreSQL."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from broker.errors import LeaseUsageOverLeaseError
from broker.models import Lease
from broker.services import dispatch, usage_overlap
from broker.services.dispatch import LeaseUsageInput
from broker.services.usage_overlap import NewRecord, _fits_apart, over_capacity
from core.models import Organisation
from core.types import Actor
from federation.models import Cluster
from metering.models import LedgerTransfer, UsageRecord
from tests.broker.test_dispatch import now_s, post, priced_since, rec, running_lease

pytestmark = pytest.mark.django_db

Client = Callable[[Organisation], APIClient]
SYSTEM = Actor.system("test")


@pytest.fixture
def east_cluster(east_cluster: Cluster) -> Cluster:
    return priced_since(east_cluster)


@pytest.fixture
def east(token_client: Client, east_operator: Organisation) -> APIClient:
    return token_client(east_operator)


def over(response: Any) -> list[dict[str, Any]]:
    assert response.status_code == 409, response.json()
    body = response.json()
    assert body["code"] == "usage_over_lease"
    return body["extra"]["errors"]


def snapshot() -> tuple[int, int]:
    return UsageRecord.objects.count(), LedgerTransfer.objects.count()


def test_new_keys_over_seconds_already_reported_are_refused_whole(
    east: APIClient, buyer: Organisation, east_cluster: Cluster
) -> None:
    lease = running_lease(east_cluster, buyer, cards=4)
    t0 = lease.start_at
    assert post(east, rec(lease, "first", t0, minutes=1)).status_code == 201
    before = snapshot()

    # The same first minute again under new keys, beside a record that alone would be fine.
    response = post(
        east,
        rec(lease, "next", t0 + timedelta(minutes=2), minutes=1),
        rec(lease, "again", t0 + timedelta(seconds=30), minutes=1, cards=1),
    )

    errors = over(response)
    assert [(e["index"], e["idempotency_key"], e["code"], e["field"]) for e in errors] == [
        (1, "again", "usage_over_lease", "cards")
    ]
    assert (
        errors[0]["lease"] == lease.pk and errors[0]["lease_cards"] == 4 and errors[0]["reported_cards"] == 5
    )
    assert datetime.fromisoformat(errors[0]["overlap_start_at"]) == t0 + timedelta(seconds=30)
    assert datetime.fromisoformat(errors[0]["overlap_end_at"]) == t0 + timedelta(minutes=1)
    assert snapshot() == before
    lease.refresh_from_db()
    assert lease.last_usage_end_at == t0 + timedelta(minutes=1)


def test_more_cards_than_the_lease_at_once_within_one_batch_is_refused(
    east: APIClient, buyer: Organisation, east_cluster: Cluster
) -> None:
    lease = running_lease(east_cluster, buyer, cards=4)
    t0 = lease.start_at
    twenty = [
        {**rec(lease, f"k{i}", t0, cards=4), "end_at": (t0 + timedelta(seconds=10)).isoformat()}
        for i in range(20)
    ]

    errors = over(post(east, *twenty))

    # Every record taking part in the overrun is named, with the 10 s it overlaps.
    assert [e["index"] for e in errors] == list(range(20))
    assert {e["reported_cards"] for e in errors} == {80}
    assert UsageRecord.objects.count() == 0


def test_cards_shared_between_records_up_to_the_lease_and_back_to_back_records_are_fine(
    east: APIClient, buyer: Organisation, east_cluster: Cluster
) -> None:
    lease = running_lease(east_cluster, buyer, cards=4)
    t0 = lease.start_at

    response = post(
        east,
        rec(lease, "a", t0, minutes=2, cards=2),
        rec(lease, "b", t0, minutes=1, cards=2),
        rec(lease, "c", t0 + timedelta(minutes=1), minutes=1, cards=2),  # starts where b ends
        rec(lease, "d", t0 + timedelta(minutes=2), minutes=1, cards=4),  # starts where a and c end
    )

    assert response.status_code == 201, response.json()
    assert UsageRecord.objects.count() == 4
    # One card more anywhere in those three minutes is refused.
    errors = over(post(east, rec(lease, "e", t0 + timedelta(seconds=150), minutes=1, cards=1)))
    assert errors[0]["idempotency_key"] == "e" and errors[0]["reported_cards"] == 5


def test_a_replay_by_key_still_answers_the_original_and_is_not_counted_twice(
    east: APIClient, buyer: Organisation, east_cluster: Cluster
) -> None:
    lease = running_lease(east_cluster, buyer, cards=4)
    t0 = lease.start_at
    batch = [rec(lease, "one", t0, minutes=1), rec(lease, "two", t0 + timedelta(minutes=1), minutes=1)]
    assert post(east, *batch).status_code == 201

    replay = post(east, *batch, rec(lease, "three", t0 + timedelta(minutes=2), minutes=1))

    assert replay.status_code == 201, replay.json()
    assert [r["status"] for r in replay.json()["records"]] == ["duplicate", "duplicate", "created"]
    assert UsageRecord.objects.count() == 3


def test_usage_across_a_failover_chain_counts_together(
    east: APIClient, buyer: Organisation, east_cluster: Cluster
) -> None:
    first = running_lease(east_cluster, buyer, cards=4)
    t0 = first.start_at
    assert post(east, rec(first, "old", t0, minutes=10)).status_code == 201
    # A replacement on another island of the same operator whose window overlaps what the first reported.
    second = running_lease(east_cluster, buyer, cards=4, island="isl-02", start=t0)
    Lease.objects.filter(pk=second.pk).update(replaces=first)

    errors = over(post(east, rec(second, "new", t0 + timedelta(minutes=5), minutes=10)))

    assert errors[0]["idempotency_key"] == "new" and errors[0]["reported_cards"] == 8
    assert datetime.fromisoformat(errors[0]["overlap_end_at"]) == t0 + timedelta(minutes=10)
    # After what the first lease reported, the replacement may report its full cards.
    assert post(east, rec(second, "after", t0 + timedelta(minutes=10), minutes=10)).status_code == 201


def test_over_capacity_sweep_treats_intervals_as_half_open() -> None:
    assert over_capacity([(0, 10, 2), (10, 20, 2)], capacity=2) == []
    assert over_capacity([(0, 10, 2), (5, 20, 1), (8, 9, 1)], capacity=2) == [(5, 10, 4)]
    assert over_capacity([(0, 10, 3), (2, 4, 1), (6, 8, 1)], capacity=3) == [(2, 4, 4), (6, 8, 4)]


# --- Property: the service decides as a brute force over every second does ------------------------------


_examples = itertools.count()
Piece = tuple[int, int, int, int]  # key number, start second, length, cards

pieces = st.lists(
    st.tuples(st.integers(0, 7), st.integers(0, 20), st.integers(1, 8), st.integers(1, 3)),
    min_size=1,
    max_size=6,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(pieces, min_size=1, max_size=4))
def test_accepts_exactly_what_a_per_second_brute_force_accepts(
    batches: list[list[Piece]], buyer: Organisation, east_cluster: Cluster, east_operator: Organisation
) -> None:
    cards = 3
    # Examples share the test's transaction: one lease for all of them, each example in its own minute.
    lease = Lease.objects.filter(buyer=buyer, cards=cards).first() or running_lease(
        east_cluster, buyer, cards=cards
    )
    example = next(_examples)
    t0: datetime = lease.start_at + timedelta(minutes=example)
    prefix = f"p{example}-"
    stored: dict[str, Piece] = {}  # what the brute force believes is stored, by key
    for batch in batches:
        seconds = [0] * 40
        for piece in stored.values():
            for s in range(piece[1], piece[1] + piece[2]):
                seconds[s] += piece[3]
        fresh: dict[str, Piece] = {}
        for piece in batch:
            key = f"{prefix}{piece[0]}"
            if key in stored or key in fresh:
                continue  # a duplicate or a conflict: never written, never counted
            fresh[key] = piece
            for s in range(piece[1], piece[1] + piece[2]):
                seconds[s] += piece[3]
        fits = max(seconds) <= cards
        records = [
            LeaseUsageInput(
                lease_id=lease.pk,
                idempotency_key=f"{prefix}{p[0]}",
                start_at=t0 + timedelta(seconds=p[1]),
                end_at=t0 + timedelta(seconds=p[1] + p[2]),
                cards=p[3],
            )
            for p in batch
        ]
        count = UsageRecord.objects.count()
        try:
            dispatch.lease_usage_report(operator=east_operator, records=records, actor=SYSTEM)
        except LeaseUsageOverLeaseError:
            assert not fits, (batch, stored)
            assert UsageRecord.objects.count() == count
        else:
            assert fits, (batch, stored)
            stored.update(fresh)
            assert UsageRecord.objects.count() == count + len(fresh)


# --- Concurrency -----------------------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_batches_that_together_exceed_the_lease_cannot_both_pass(
    buyer: Organisation, east_cluster: Cluster, east_operator: Organisation
) -> None:
    lease = running_lease(east_cluster, buyer, cards=4)
    t0 = lease.start_at
    n = 6
    barrier = threading.Barrier(n)
    results: list[object] = [None] * n

    def report(index: int) -> None:
        try:
            record = LeaseUsageInput(
                lease_id=lease.pk,
                idempotency_key=f"race-{index}",
                start_at=t0,
                end_at=t0 + timedelta(minutes=1),
                cards=3,  # each fits alone; any two together are 6 cards on a 4-card lease
            )
            barrier.wait()
            results[index] = dispatch.lease_usage_report(
                operator=east_operator, records=[record], actor=SYSTEM
            )
        except Exception as exc:
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=report, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    refused = [r for r in results if isinstance(r, LeaseUsageOverLeaseError)]
    assert len(refused) == n - 1, results
    assert UsageRecord.objects.filter(reference=f"lease:{lease.pk}").count() == 1


def test_the_check_costs_no_query_for_in_order_reports(
    buyer: Organisation, east_cluster: Cluster, east_operator: Organisation
) -> None:
    leases = [running_lease(east_cluster, buyer, cards=1, island=f"isl-0{i + 1}") for i in range(2)]
    t0 = now_s() - timedelta(hours=1)

    def batch(minute: int) -> list[LeaseUsageInput]:
        return [
            LeaseUsageInput(
                lease_id=lease.pk,
                idempotency_key=f"{lease.pk}-{minute}",
                start_at=t0 + timedelta(minutes=minute),
                end_at=t0 + timedelta(minutes=minute + 1),
                cards=1,
            )
            for lease in leases
        ]

    dispatch.lease_usage_report(operator=east_operator, records=batch(0), actor=SYSTEM)
    recorder = _Recorder()
    with connection.execute_wrapper(recorder):
        dispatch.lease_usage_report(operator=east_operator, records=batch(1), actor=SYSTEM)
    assert not recorder.stored_usage_reads()


class _Recorder:
    def __init__(self) -> None:
        self.statements: list[str] = []

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        self.statements.append(sql)
        return execute(sql, params, many, context)

    def stored_usage_reads(self) -> list[str]:
        """Lookups of stored records by reference; not the ingest's own insert, which also fills the
        pending-rating queue (whose key column is usage_record_id)."""
        return [
            sql
            for sql in self.statements
            if "usage_record" in sql and "reference" in sql and "INSERT INTO metering_usagepending" not in sql
        ]


def test_several_in_order_records_of_a_lease_cost_no_query_of_stored_usage(
    buyer: Organisation, east_cluster: Cluster, east_operator: Organisation
) -> None:
    lease = running_lease(east_cluster, buyer, cards=2)
    t0 = now_s() - timedelta(hours=1)

    def minutes(first: int, n: int) -> list[LeaseUsageInput]:
        return [
            LeaseUsageInput(
                lease_id=lease.pk,
                idempotency_key=f"m{m}",
                start_at=t0 + timedelta(minutes=m),
                end_at=t0 + timedelta(minutes=m + 1),
                cards=2,
            )
            for m in range(first, first + n)
        ]

    dispatch.lease_usage_report(operator=east_operator, records=minutes(0, 3), actor=SYSTEM)
    recorder = _Recorder()
    with connection.execute_wrapper(recorder):
        result = dispatch.lease_usage_report(operator=east_operator, records=minutes(3, 5), actor=SYSTEM)

    assert result.created == 5
    assert not recorder.stored_usage_reads()
    lease.refresh_from_db()
    assert lease.last_usage_end_at == t0 + timedelta(minutes=8)


def test_an_in_order_batch_does_not_count_a_reused_key_it_will_not_write(
    east: APIClient, buyer: Organisation, east_cluster: Cluster
) -> None:
    """In order (after the frontier) and over the lease only if a conflicting record counted: the keys
    already stored are asked for, the conflict is not written and the other record is."""
    lease = running_lease(east_cluster, buyer, cards=4)
    t0 = lease.start_at
    assert post(east, rec(lease, "a", t0, minutes=1, cards=4)).status_code == 201

    response = post(
        east,
        rec(lease, "a", t0 + timedelta(minutes=1), minutes=1, cards=4),  # key reused, another body
        rec(lease, "b", t0 + timedelta(minutes=1), minutes=1, cards=4),
    )

    assert response.status_code == 409 and response.json()["code"] == "usage_conflict", response.json()
    assert [r["status"] for r in response.json()["extra"]["records"]] == ["conflict", "created"]
    assert UsageRecord.objects.count() == 2
    # Whereas two new keys over the same minute are over the lease, in order or not.
    errors = over(
        post(
            east,
            rec(lease, "c", t0 + timedelta(minutes=2), minutes=1, cards=4),
            rec(lease, "d", t0 + timedelta(minutes=2), minutes=1, cards=1),
        )
    )
    assert [e["idempotency_key"] for e in errors] == ["c", "d"]


def _new(index: int, start: int, end: int, cards: int) -> NewRecord:
    return NewRecord(index, f"k{index}", 1, cards, start, end)


def test_records_apart_in_time_are_passed_without_the_sweep_and_nothing_else_is() -> None:
    # In any order; back-to-back intervals are half-open, so they do not overlap.
    assert _fits_apart([_new(0, 20, 30, 4), _new(1, 0, 10, 4), _new(2, 10, 20, 4)], capacity=4)
    # Overlapping records, or one holding more than the capacity, go to the sweep.
    assert not _fits_apart([_new(0, 0, 10, 1), _new(1, 9, 20, 1)], capacity=4)
    assert not _fits_apart([_new(0, 0, 30, 1), _new(1, 10, 20, 1), _new(2, 40, 50, 1)], capacity=4)
    assert not _fits_apart([_new(0, 0, 10, 5), _new(1, 10, 20, 1)], capacity=4)


# The leases of their own a batch reports in order are decided without a chain object or the sweep:
# whatever the records, the answer is the general check's (each lease's group swept against its cards and
# what it stored: a record ending at its frontier), but for the lone in-order record the general check
# never sweeps either (cards_over_lease has refused it if it holds too many cards).
_group = st.lists(st.tuples(st.integers(0, 30), st.integers(1, 8), st.integers(1, 5)), min_size=1, max_size=5)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    groups=st.lists(
        st.tuples(
            st.sampled_from([None, 0, 5, 12]),
            st.sampled_from(["running", "ended"]),
            st.integers(1, 4),
            _group,
        ),
        min_size=1,
        max_size=6,
    ),
    interleave=st.booleans(),
)
def test_the_per_lease_shortcut_decides_as_the_general_check(
    groups: list[tuple[int | None, str, int, list[tuple[int, int, int]]]],
    interleave: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    capacity = 4
    leases = {
        lease_id: usage_overlap.LeaseFacts(lease_id, capacity, state, None, frontier)
        for lease_id, (frontier, state, _, _) in enumerate(groups, start=1)
    }
    stored = {
        lease_id: [] if frontier is None else [(lease_id, frontier - 10, frontier, cards)]
        for lease_id, (frontier, _, cards, _) in enumerate(groups, start=1)
    }
    pieces = [
        (lease_id, start, start + length, cards)
        for lease_id, (_, _, _, group) in enumerate(groups, start=1)
        for start, length, cards in group
    ]
    if interleave:  # leases reported turn about, as an agent batching many leases does
        pieces.sort(key=lambda p: (p[1], p[0]))
    records = [
        NewRecord(index, f"k{index}", lease_id, cards, start, end)
        for index, (lease_id, start, end, cards) in enumerate(pieces)
    ]
    # What the late leases read, without a database; no key is stored already.
    monkeypatch.setattr(
        usage_overlap, "_stored_intervals", lambda *, operator_id, spans, roots: {r: stored[r] for r in spans}
    )
    monkeypatch.setattr(usage_overlap, "_stored_keys", lambda *, operator_id, keys: set())

    expected = []
    for lease_id, facts in leases.items():
        group = [r for r in records if r.lease_id == lease_id]
        frontier = facts.last_usage_end_us
        if len(group) == 1 and (frontier is None or group[0].start_us >= frontier):
            continue
        chain = usage_overlap._Chain(root=lease_id, members=(facts,))
        expected += usage_overlap._chain_overruns(
            chain=chain, group=group, stored=stored[lease_id], stored_keys=set()
        )
    assert usage_overlap.usage_overruns(operator_id=1, leases=leases, records=records) == sorted(
        expected, key=lambda o: o.index
    )


@pytest.mark.postgres
def test_lease_pages_keep_room_for_the_frontier_update() -> None:
    """broker 0011: the usage report's frontier update stays on the lease's page (a HOT update, no index
    touched) only if lease pages are not filled to the brim."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = %s", [Lease._meta.db_table])
        (options,) = cursor.fetchone()
    assert "fillfactor=80" in (options or [])
