"""The usage batch's two statements on the lease table, on PostgreSQL: whatever the table's and the batch's
size, each reaches the leases by primary-key probes in id order (never a scan of the whole table, which
also locked in table order), and two batches naming the same leases in opposite orders both finish."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction

from broker.models import Lease
from broker.services import dispatch
from broker.services.dispatch import LeaseUsageInput
from core.models import Organisation
from core.types import Actor
from federation.models import Cluster
from metering.models import UsageRecord
from tests.broker.test_dispatch import priced_since, running_lease

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]

SYSTEM = Actor.system("test")


@pytest.fixture
def east_cluster(east_cluster: Cluster) -> Cluster:
    return priced_since(east_cluster)


def clones(lease: Lease, n: int) -> list[int]:
    """``n`` more running leases like ``lease`` (same operator, window and cards), inserted in one go: a
    table the size at which the planner used to prefer reading all of it."""
    fields = {
        f.attname: getattr(lease, f.attname)
        for f in Lease._meta.concrete_fields
        if f.attname not in ("id", "quote_id", "replaces_id")
    }
    made = Lease.objects.bulk_create([Lease(**fields) for _ in range(n)])
    return [lease.pk, *(m.pk for m in made)]


def minute(lease_ids: Sequence[int], start: Any, key: str) -> list[LeaseUsageInput]:
    return [
        LeaseUsageInput(
            lease_id=lease_id,
            idempotency_key=f"{key}-{lease_id}",
            start_at=start,
            end_at=start + timedelta(minutes=1),
            cards=1,
        )
        for lease_id in lease_ids
    ]


class _Statements:
    """The statements (with their parameters) that touch the lease table."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if Lease._meta.db_table in sql and ("FOR NO KEY UPDATE" in sql or sql.lstrip().startswith("UPDATE")):
            self.seen.append((sql, params))
        return execute(sql, params, many, context)


def plan(sql: str, params: Any) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (COSTS OFF) " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


def test_the_lock_and_the_frontier_update_probe_the_primary_key_whatever_the_batch_size(
    buyer: Organisation, east_cluster: Cluster, east_operator: Organisation
) -> None:
    lease = running_lease(east_cluster, buyer, cards=1)
    ids = clones(lease, 3_199)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Lease._meta.db_table}")  # the model's table
    start = lease.start_at + timedelta(minutes=5)

    for named in (10, 400, 3_000):
        statements = _Statements()
        with transaction.atomic():
            with connection.execute_wrapper(statements):
                result = dispatch.lease_usage_report(
                    operator=east_operator, records=minute(ids[:named], start, f"n{named}"), actor=SYSTEM
                )
            # Explained inside the batch's transaction, on the statistics the batch itself was planned on.
            plans = [plan(sql, params) for sql, params in statements.seen]
        assert [o.status for o in result.outcomes] == ["created"] * named
        assert len(plans) == 2, plans  # the lock, then the frontier update
        for text in plans:
            assert "Seq Scan" not in text and "Bitmap" not in text and "Hash" not in text, text
            assert "Merge" not in text and "Sort" not in text, text
            assert "Index Scan using broker_lease_pkey" in text, text
            assert text.splitlines()[0].startswith(("Nested Loop", "Update")), text
        assert plans[0].index("Function Scan") < plans[0].index("LockRows"), plans[
            0
        ]  # locks follow the array
        start += timedelta(minutes=1)

    frontier = {lease.start_at + timedelta(minutes=8)}  # the last batch's end, for every lease it named
    assert (
        set(Lease.objects.filter(pk__in=ids[:3_000]).values_list("last_usage_end_at", flat=True)) == frontier
    )


def test_the_lock_returns_the_named_leases_of_the_operator_in_id_order(
    buyer: Organisation, east_cluster: Cluster, east_operator: Organisation, west_cluster: Cluster
) -> None:
    mine = clones(running_lease(east_cluster, buyer, cards=1), 4)
    other = running_lease(priced_since(west_cluster), buyer, cards=1)
    named = {*mine[::-1], other.pk, 2**62}
    recorded: list[int] = []

    def order(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        if "FOR NO KEY UPDATE" in sql:
            recorded.extend(int(v) for v in params[0].strip("{}").split(","))
        return result

    with connection.execute_wrapper(order), transaction.atomic():
        rows = dispatch._usage_leases(operator=east_operator, lease_ids=named)
    assert list(rows) == sorted(mine)  # another operator's lease and an unknown id are simply absent
    assert recorded == sorted(named)


@pytest.mark.django_db(transaction=True)
def test_batches_naming_the_same_leases_in_opposite_orders_both_finish(
    buyer: Organisation, east_cluster: Cluster, east_operator: Organisation
) -> None:
    ids = clones(running_lease(east_cluster, buyer, cards=1), 59)
    t0 = Lease.objects.get(pk=ids[0]).start_at
    rounds, n = 4, 2
    results: list[list[object]] = [[None] * n for _ in range(rounds)]

    for r in range(rounds):
        barrier = threading.Barrier(n)

        def report(index: int, r: int = r, barrier: threading.Barrier = barrier) -> None:
            try:
                order = ids if index == 0 else ids[::-1]
                # Each batch its own minute of every lease: both fit, neither waits on a fault.
                records = minute(order, t0 + timedelta(minutes=2 * r + index), f"r{r}-{index}")
                barrier.wait()
                results[r][index] = dispatch.lease_usage_report(
                    operator=east_operator, records=records, actor=SYSTEM
                )
            except Exception as exc:
                results[r][index] = exc
            finally:
                connection.close()

        threads = [threading.Thread(target=report, args=(i,)) for i in range(n)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)

    assert all(isinstance(r, dispatch.UsageBatchResult) for row in results for r in row), results
    assert UsageRecord.objects.filter(reference__in=[f"lease:{i}" for i in ids]).count() == rounds * n * len(
        ids
    )
    last = t0 + timedelta(minutes=2 * (rounds - 1) + 2)
    assert set(Lease.objects.filter(pk__in=ids).values_list("last_usage_end_at", flat=True)) == {last}
