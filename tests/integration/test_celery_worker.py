"""A real Celery worker consumes the heartbeat monitor's task from the configured broker.

The unit tests call services directly; this one proves the wiring that production depends on: the task
is registered under its public name, survives serialisation through a real broker (memory:// locally,
Redis in CI via CELERY_BROKER_URL), runs in a worker thread with its own database connection and
commits what the monitor decided.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from celery.contrib.testing.worker import start_worker
from django.conf import settings
from django.utils import timezone

from config.celery_app import app as celery_app
from federation import tasks
from federation.models import Cluster, ClusterStatus, ClusterStatusChange
from tests.celery_watch import TaskWatcher
from tests.factories import OperatorFactory, make_cluster

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

TASK_TIMEOUT_SECONDS = 30


def test_worker_takes_a_silent_cluster_offline(task_watcher: TaskWatcher) -> None:
    # The point is a real round trip through the broker, never an eager call in-process.
    assert settings.CELERY_TASK_ALWAYS_EAGER is False
    assert celery_app.conf.task_always_eager is False
    operator = OperatorFactory(slug="cucc", name="China Unicom")
    silent = make_cluster(operator=operator, name="zw-ai01")
    alive = make_cluster(operator=operator, name="zw-ai02")
    now = timezone.now()
    long_ago = now - timedelta(hours=1)
    Cluster.objects.filter(pk=silent.pk).update(last_heartbeat_at=long_ago, last_heartbeat_sent_at=long_ago)
    Cluster.objects.filter(pk=alive.pk).update(last_heartbeat_at=now, last_heartbeat_sent_at=now)

    # No ping check: it needs a result backend, and the platform runs without one (tasks ignore results).
    with start_worker(celery_app, pool="solo", perform_ping_check=False, shutdown_timeout=30):
        result = tasks.clusters_mark_missed_heartbeats.delay()
        assert task_watcher.wait(result.id, TASK_TIMEOUT_SECONDS), (
            f"the worker did not run the task within {TASK_TIMEOUT_SECONDS} s "
            f"(broker {celery_app.conf.broker_url.split('@')[-1]})"
        )

    silent.refresh_from_db()
    alive.refresh_from_db()
    assert silent.status == ClusterStatus.OFFLINE
    assert silent.offline_cause == Cluster.OfflineCause.HEARTBEAT
    assert silent.status_before_offline == ClusterStatus.ACTIVE
    assert alive.status == ClusterStatus.ACTIVE
    change = ClusterStatusChange.objects.get(cluster=silent, to_status=ClusterStatus.OFFLINE)
    assert change.from_status == ClusterStatus.ACTIVE
    assert change.actor_label == "heartbeat monitor"
    assert change.actor_user is None and change.actor_token is None
    assert "missed" in change.reason
    assert not ClusterStatusChange.objects.filter(cluster=alive, to_status=ClusterStatus.OFFLINE).exists()
