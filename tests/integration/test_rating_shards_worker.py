"""A real Celery worker runs the minute's rating fanned out over two parts of the buyers: the beat's task
queues the other part's task through the configured broker (memory:// locally, Redis in CI) and rates its
own part; between them every record is rated once and the ledger reconciles."""

from __future__ import annotations

from datetime import timedelta

import pytest
from celery.contrib.testing.worker import start_worker
from django.utils import timezone

from config.celery_app import app as celery_app
from metering import tasks
from metering.models import RatedSegment, UsageRecord
from metering.services.maintenance import ledger_reconcile
from metering.services.usage import usage_record_create_batch
from metering.types import UsageRecordInput
from tests.celery_watch import TaskWatcher
from tests.factories import BuyerFactory, OperatorFactory, make_cluster
from tests.metering.factories import make_paid_pack, make_price_card

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

TASK = "metering.usage_rate_pending"
TASK_TIMEOUT_SECONDS = 30


def test_the_minutes_rating_fans_out_over_two_parts_and_rates_everything_once(
    task_watcher: TaskWatcher,
) -> None:
    from metering.services.tariffs import tariff_presets_install

    assert celery_app.conf.task_always_eager is False
    tariff_presets_install()
    operator = OperatorFactory(slug="ctyun")
    cluster = make_cluster(operator=operator, hub="yrd", name="sh-ai01", islands=[("isl-01", 8)])
    make_price_card(cluster=cluster, rate="10.0000", tariff_code="flat")
    now = timezone.now().replace(microsecond=0)
    buyers = [BuyerFactory(slug=f"b{n}") for n in range(4)]
    for buyer in buyers:
        make_paid_pack(
            buyer=buyer,
            accelerator=cluster.accelerator.slug,
            card_hours=1,
            price="10",
            paid_at=now - timedelta(hours=1),
            key=buyer.slug,
        )
        usage_record_create_batch(
            operator=operator,
            records=[
                UsageRecordInput(
                    f"{buyer.slug}-{n}",
                    cluster.cpi,
                    buyer.slug,
                    2,
                    now - timedelta(minutes=40 - 5 * n),
                    now - timedelta(minutes=35 - 5 * n),
                    1,
                )
                for n in range(5)
            ],
            now=now,
        )
    parts = {b.pk % 2 for b in buyers}
    assert parts == {0, 1}  # both parts have buyers

    with start_worker(celery_app, pool="solo", perform_ping_check=False, shutdown_timeout=30):
        tasks.usage_rate_pending.delay(shards=2)
        assert task_watcher.wait_named(TASK, 2, TASK_TIMEOUT_SECONDS), f"finished: {task_watcher.names()}"

    by_shard = {run.kwargs.get("shard"): run.retval for run in task_watcher.named(TASK)}
    assert set(by_shard) == {None, 1}  # the beat's task (part 0 itself) and the part it queued
    assert by_shard[1] == 5 * sum(1 for b in buyers if b.pk % 2 == 1)
    assert by_shard[None] == 20 - by_shard[1]
    assert UsageRecord.objects.unrated().count() == 0
    assert RatedSegment.objects.values("usage_record_id").distinct().count() == 20
    assert ledger_reconcile().ok
