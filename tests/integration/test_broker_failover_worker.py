"""A real Celery worker, fed the failover task every 5 s as beat would, re-places a running checkpointable
lease within 10 s of its cluster being marked offline.

The test takes the worst phase: the cluster is marked offline just after a failover run finished, so the
next run is a whole beat interval away. The delay measured (mark → replacement lease committed) is printed.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from celery.contrib.testing.worker import start_worker
from django.conf import settings
from django.utils import timezone

from broker import tasks
from broker.models import Lease, LeaseState
from broker.services.leases import lease_transition
from config.celery_app import app as celery_app
from core.types import Actor
from federation.models import Cluster, ClusterStatus
from federation.services import clusters_mark_missed_heartbeats
from metering.models import PriceCard
from tests.broker.factories import make_job, make_lease
from tests.celery_watch import TaskWatcher, worker_pool
from tests.factories import BuyerFactory, OperatorFactory, make_cluster
from tests.metering.factories import make_paid_pack, make_price_card

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

A800 = "nvidia-a800-sxm4-80gb"
BEAT_INTERVAL_SECONDS = 5.0  # broker/migrations/0002_broker_schedules.py
FAILOVER_BUDGET_SECONDS = 10.0
TASK_TIMEOUT_SECONDS = 30


class Beat:
    """Sends broker.leases_fail_over every BEAT_INTERVAL_SECONDS from a thread, like celery beat."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sent.append(tasks.leases_fail_over.delay().id)
            self._stop.wait(BEAT_INTERVAL_SECONDS)

    def start(self) -> None:
        self._thread.start()

    def sent_at_least(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.sent) < count:
            assert time.monotonic() < deadline, f"beat sent {len(self.sent)} tasks, not {count}"
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def first_sent(beat: Beat) -> str:
    return nth_sent(beat, 0)


def nth_sent(beat: Beat, n: int) -> str:
    beat.sent_at_least(n + 1, timeout=BEAT_INTERVAL_SECONDS * 2)
    return beat.sent[n]


def test_a_worker_re_places_a_lease_within_10_s_of_its_cluster_going_offline(
    task_watcher: TaskWatcher,
) -> None:
    assert settings.CELERY_TASK_ALWAYS_EAGER is False
    from metering.services.tariffs import tariff_presets_install

    tariff_presets_install()
    east = make_cluster(
        operator=OperatorFactory(slug="ctyun", name="China Telecom Cloud"),
        hub="yrd",
        name="sh-ai01",
        islands=[("isl-01", 8)],
        site="Shanghai",
    )
    west = make_cluster(
        operator=OperatorFactory(slug="cucc", name="China Unicom"),
        hub="nx",
        name="zw-ai01",
        islands=[("isl-01", 32)],
    )
    make_price_card(cluster=east, rate="12.0000", tariff_code="cn-gd")
    make_price_card(cluster=west, rate="9.0000", tariff_code="cn-nx")
    now = timezone.now().replace(microsecond=0)
    PriceCard.objects.update(effective_from=now - timedelta(hours=6))
    buyer = BuyerFactory(slug="acme", name="Acme AI")
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=1000, price="9000.00", key="a800")
    job = make_job(
        buyer=buyer,
        accelerators=[A800],
        origin_hub="yrd",
        latency_budget_ms=30,
        earliest_start_at=now - timedelta(hours=1),
        deadline_at=now + timedelta(hours=24),
        checkpointable=True,
    )
    lease = make_lease(job=job, cluster=east, start_at=now - timedelta(hours=1))
    lease_transition(lease=lease, to_state=LeaseState.RUNNING, actor=Actor.system("test"), at=lease.start_at)
    Cluster.objects.update(last_heartbeat_at=now, last_heartbeat_sent_at=now)

    beat = Beat()
    with start_worker(
        celery_app, pool=worker_pool(), concurrency=1, perform_ping_check=False, shutdown_timeout=30
    ):
        beat.start()
        try:
            # Worst phase: the cluster goes offline just after a failover run found nothing to do, so the
            # next run is a whole beat interval away. The test reads the database only between runs (after
            # a run's task_postrun): SQLite's shared in-memory database locks whole tables.
            assert task_watcher.wait(first_sent(beat), TASK_TIMEOUT_SECONDS), "the worker never ran the task"
            assert not Lease.objects.filter(replaces=lease).exists()
            long_ago = timezone.now() - timedelta(hours=1)
            Cluster.objects.filter(pk=east.pk).update(
                last_heartbeat_at=long_ago, last_heartbeat_sent_at=long_ago
            )
            marked_at = time.monotonic()
            assert clusters_mark_missed_heartbeats() == [east.cpi]

            replacement, delay, run = None, float("inf"), 1
            while replacement is None and time.monotonic() - marked_at < FAILOVER_BUDGET_SECONDS + 5:
                task_id = nth_sent(beat, run)
                assert task_watcher.wait(task_id, TASK_TIMEOUT_SECONDS), f"run {run} never finished"
                replacement = Lease.objects.filter(replaces=lease).first()
                delay = task_watcher.get(task_id).finished_at - marked_at
                run += 1
        finally:
            beat.stop()
            for task_id in beat.sent:  # let the last run finish before the worker stops and the DB flushes
                task_watcher.wait(task_id, TASK_TIMEOUT_SECONDS)

    print(
        f"\nfailover delay: {delay:.2f} s from the cluster being marked offline to the run that committed "
        f"the replacement lease (beat every {BEAT_INTERVAL_SECONDS:.0f} s, worst phase)"
    )
    assert replacement is not None, "no replacement lease after the cluster went offline"
    assert delay < FAILOVER_BUDGET_SECONDS
    lease.refresh_from_db()
    east.refresh_from_db()
    assert east.status == ClusterStatus.OFFLINE
    assert lease.state == LeaseState.INTERRUPTED
    assert replacement.cluster_id == west.pk
    assert replacement.state == LeaseState.RESERVED
    assert replacement.end_at - replacement.start_at == timedelta(hours=2)
