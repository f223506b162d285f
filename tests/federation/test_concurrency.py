"""Races on PostgreSQL: concurrent registrations of one identifier, concurrent monitor runs."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from core.types import Actor
from federation import services
from federation.errors import IdentifierTakenError
from federation.models import Cluster, ClusterStatusChange, Island, IssuedIdentifier
from federation.types import IslandSpec
from tests.factories import OperatorFactory, make_cluster

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def run_in_threads(n: int, target) -> list[object]:
    barrier = threading.Barrier(n)
    results: list[object] = [None] * n

    def work(index: int) -> None:
        try:
            barrier.wait()
            results[index] = target(index)
        except Exception as exc:
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


def test_concurrent_registrations_of_one_identifier_have_exactly_one_winner():
    operator = OperatorFactory(slug="cucc")

    def register(index: int) -> Cluster:
        return services.cluster_register(
            actor=Actor(organisation=operator, system_label=f"agent-{index}"),
            operator=operator,
            cpi="cpi:cucc:nx:zw-ai01",
            site=f"site-{index}",  # every body differs, so no call is an idempotent replay
            accelerator_slug="nvidia-a800-sxm4-80gb",
            islands=[IslandSpec("isl-01", 8, "nvlink")],
        )

    results = run_in_threads(16, register)

    kinds = Counter(type(r).__name__ for r in results)
    assert kinds == {"Cluster": 1, "IdentifierTakenError": 15}, results
    assert all(isinstance(r, Cluster | IdentifierTakenError) for r in results)
    assert Cluster.objects.count() == 1
    assert Island.objects.count() == 1
    assert IssuedIdentifier.objects.count() == 2
    assert ClusterStatusChange.objects.count() == 1


def test_concurrent_monitor_runs_record_each_offline_once():
    operator = OperatorFactory(slug="cucc")
    for n in range(20):
        make_cluster(operator=operator, name=f"c{n:02d}")
    later = timezone.now() + timedelta(hours=1)

    results = run_in_threads(4, lambda _: services.clusters_mark_missed_heartbeats(now=later))

    marked = [cpi for result in results for cpi in result]  # type: ignore[union-attr]
    assert sorted(marked) == sorted(Cluster.objects.values_list("cpi", flat=True))
    assert ClusterStatusChange.objects.filter(to_status="offline").count() == 20
    assert set(Cluster.objects.values_list("status", flat=True)) == {"offline"}


def test_a_heartbeat_locks_its_cluster_and_nothing_it_joins():
    """A heartbeat locks its cluster's row only: not its operator's, hub's or chip's row, which every other
    cluster of the operator, hub or chip shares (locking them queued an operator's heartbeats behind one
    another and deadlocked two that took them in different orders). Another transaction holds all three
    rows; the heartbeat must not wait for it."""
    from core.models import Organisation
    from federation.models import Accelerator, Hub
    from federation.types import IslandReport

    operator = OperatorFactory(slug="cucc")
    cluster = make_cluster(operator=operator, islands=[("isl-01", 8)])
    holding, release = threading.Event(), threading.Event()

    def hold_shared_rows() -> None:
        from django.db import transaction

        try:
            with transaction.atomic():
                Organisation.objects.select_for_update().filter(pk=operator.pk).exists()
                Hub.objects.select_for_update().filter(pk=cluster.hub_id).exists()
                Accelerator.objects.select_for_update().filter(pk=cluster.accelerator_id).exists()
                holding.set()
                release.wait(30)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_shared_rows)
    holder.start()
    assert holding.wait(10)
    try:
        from django.db import transaction

        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '2s'")
            result = services.heartbeat_record(
                actor=Actor(organisation=operator, system_label="agent"),
                cluster=cluster,
                sent_at=timezone.now(),
                health="ok",
                islands=[IslandReport(name="isl-01", available_cards=8, unhealthy_cards=0)],
            )
        assert result.applied
    finally:
        release.set()
        holder.join(30)


def test_concurrent_identical_registrations_create_one_cluster_and_answer_it_to_all():
    """Retries racing each other: the first creates, every other waits for it and is answered the same
    cluster as an idempotent replay (not 409)."""
    operator = OperatorFactory(slug="cucc")

    def register(index: int) -> tuple[int, bool]:
        cluster, created = services.cluster_register_idempotent(
            actor=Actor(organisation=operator, system_label=f"agent-{index}"),
            operator=operator,
            cpi="cpi:cucc:nx:zw-ai01",
            site="Zhongwei",
            accelerator_slug="nvidia-a800-sxm4-80gb",
            islands=[IslandSpec("isl-01", 8, "nvlink"), IslandSpec("isl-02", 16, "nvlink")],
        )
        return cluster.pk, created

    results = run_in_threads(8, register)

    assert all(isinstance(r, tuple) for r in results), results
    assert sorted(created for _, created in results) == [False] * 7 + [True]  # type: ignore[misc]
    assert len({pk for pk, _ in results}) == 1  # type: ignore[misc]
    assert (Cluster.objects.count(), Island.objects.count(), IssuedIdentifier.objects.count()) == (1, 2, 3)
    assert ClusterStatusChange.objects.count() == 1
