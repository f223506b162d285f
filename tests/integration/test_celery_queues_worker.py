"""A worker for the control queue runs the heartbeat monitor while rating waits in its own queue, over the
configured broker (memory:// locally, Redis and RabbitMQ in CI): production runs the two workers apart
(README: Celery workers and queues), so a rating backlog can delay billing but never the safety work."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from amqp.exceptions import ChannelError
from celery.contrib.testing.worker import start_worker
from django.utils import timezone

from config.celery_app import app as celery_app
from federation import tasks as federation_tasks
from federation.models import Cluster, ClusterStatus
from metering import tasks as metering_tasks
from tests.celery_watch import TaskWatcher
from tests.factories import OperatorFactory, make_cluster

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

TASK_TIMEOUT_SECONDS = 30
ALL_QUEUES = ["control", "rating", "celery"]


def waiting(queue: str) -> int:
    """Messages waiting in ``queue``; Redis forgets an emptied queue, which counts as none."""
    with celery_app.connection_for_write() as conn:
        try:
            return int(conn.default_channel.queue_declare(queue=queue, passive=True).message_count)
        except ChannelError as exc:
            if "NOT_FOUND" not in str(exc):
                raise
            return 0


@pytest.fixture
def queues_restored() -> Iterator[None]:
    """A worker started with ``queues`` narrows the app's consume set (Celery keeps it on the app): put it
    back, and leave no message behind."""
    celery_app.control.purge()
    try:
        yield
    finally:
        celery_app.amqp.queues.select(ALL_QUEUES)
        celery_app.control.purge()


def test_the_control_worker_takes_a_silent_cluster_offline_while_rating_waits(
    task_watcher: TaskWatcher, queues_restored: None
) -> None:
    silent = make_cluster(operator=OperatorFactory(slug="cucc"), name="zw-ai01")
    long_ago = timezone.now() - timedelta(hours=1)
    Cluster.objects.filter(pk=silent.pk).update(last_heartbeat_at=long_ago, last_heartbeat_sent_at=long_ago)

    rating = metering_tasks.usage_rate_pending.delay()  # queued first: with one queue it would go first
    assert waiting("rating") == 1
    with start_worker(
        celery_app, pool="solo", perform_ping_check=False, shutdown_timeout=30, queues=["control"]
    ):
        monitor = federation_tasks.clusters_mark_missed_heartbeats.delay()
        assert task_watcher.wait(monitor.id, TASK_TIMEOUT_SECONDS), (
            "the control worker did not run the monitor"
        )
    silent.refresh_from_db()
    assert silent.status == ClusterStatus.OFFLINE
    assert waiting("rating") == 1, "the control worker must not take rating"
    assert rating.id not in {task.id for task in task_watcher.finished}

    # The other worker (rating and the long jobs) takes it.
    with start_worker(
        celery_app, pool="solo", perform_ping_check=False, shutdown_timeout=30, queues=["rating", "celery"]
    ):
        assert task_watcher.wait(rating.id, TASK_TIMEOUT_SECONDS), "the rating worker did not run rating"
    assert waiting("rating") == 0
