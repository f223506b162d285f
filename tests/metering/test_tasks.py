"""Billing tasks are thin (they call the services), retry only transient database errors, and their
schedules exist in django-celery-beat's tables after migrate."""

from __future__ import annotations

from datetime import date
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery.signals import after_task_publish
from django.core.cache import cache
from django.db import OperationalError
from django_celery_beat.models import PeriodicTask

from config.celery_app import app as celery_app
from core.models import Organisation
from federation.models import Cluster
from metering import tasks
from metering.models import BillingCloseRun, PriceCard, RatedSegment, UsagePending
from metering.services.maintenance import ReconciliationReport
from metering.services.rating import RatingRun
from metering.services.usage import usage_record_create_batch
from metering.types import UsageRecordInput
from tests.factories import BuyerFactory
from tests.metering.conftest import local

pytestmark = pytest.mark.django_db


def test_tasks_call_the_services(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, dict]] = []
    monkeypatch.setattr(
        tasks.rating,
        "usage_rate_run",
        lambda **kw: calls.append(("rate", kw)) or RatingRun(rated=7, more=False),
    )
    monkeypatch.setattr(tasks.maintenance, "packs_expire_due", lambda **kw: calls.append(("expire", kw)) or 2)
    monkeypatch.setattr(
        tasks.maintenance,
        "ledger_reconcile",
        lambda: calls.append(("reconcile", {})) or ReconciliationReport(ok=False),
    )
    run = BillingCloseRun(period_start=date(2026, 3, 1))
    monkeypatch.setattr(
        tasks.billing, "billing_close_previous_month", lambda **kw: calls.append(("close", kw)) or run
    )
    monkeypatch.setattr(
        tasks.billing, "billing_close_period", lambda **kw: calls.append(("period", kw)) or run
    )

    assert tasks.usage_rate_pending.apply(kwargs={"batch_size": 100, "shards": 1}).get() == 7
    assert tasks.packs_expire_due.apply().get() == 2
    assert tasks.ledger_reconcile.apply().get() is False
    assert tasks.billing_close_previous_month.apply().get() == "2026-03-01"
    assert tasks.billing_close_period.apply(args=["2026-03-01"]).get() == "2026-03-01"
    assert calls == [
        ("rate", {"seconds": 30.0, "batch_size": 100, "max_batches": None, "shard": None}),
        ("expire", {}),
        ("reconcile", {}),
        ("close", {}),
        ("period", {"period_start": date(2026, 3, 1)}),
    ]


def test_tasks_retry_only_transient_errors() -> None:
    for task in (
        tasks.usage_rate_pending,
        tasks.packs_expire_due,
        tasks.ledger_reconcile,
        tasks.billing_close_previous_month,
        tasks.billing_close_period,
        tasks.usage_partitions_ensure,
    ):
        assert tuple(task.autoretry_for) == (OperationalError,), task.name
        assert task.name.startswith("metering.")


def test_close_task_runs_for_real(db: None) -> None:
    assert tasks.billing_close_period.apply(args=["2026-03-01"]).get() == "2026-03-01"
    assert BillingCloseRun.objects.get().finished_at is not None


def test_beat_schedules_exist_after_migrate() -> None:
    by_task = {task.task: task for task in PeriodicTask.objects.select_related("interval", "crontab")}
    rate = by_task["metering.usage_rate_pending"]
    assert (rate.interval.every, rate.interval.period, rate.enabled) == (60, "seconds", True)

    shanghai = ZoneInfo("Asia/Shanghai")
    expected = {
        "metering.packs_expire_due": ("10", "0", "*"),
        "metering.ledger_reconcile": ("0", "3", "*"),
        "metering.billing_close_previous_month": ("30", "0", "1"),
        "metering.usage_partitions_ensure": ("0", "2", "*"),
    }
    for name, (minute, hour, day_of_month) in expected.items():
        crontab = by_task[name].crontab
        assert (
            crontab.minute,
            crontab.hour,
            crontab.day_of_month,
            crontab.month_of_year,
            crontab.day_of_week,
        ) == (
            minute,
            hour,
            day_of_month,
            "*",
            "*",
        ), name
        assert str(crontab.timezone) == str(shanghai)
        assert by_task[name].enabled


def test_the_fanned_out_task_returns_its_own_part_before_the_queued_parts_have_run(
    seller: Organisation, a800_cluster: Cluster, gd_price_card: PriceCard
) -> None:
    """With two parts, the beat's task rates part 0 and only queues part 1's task (through the real broker,
    memory:// here, no worker running): it returns part 0's count while part 1's records are still
    pending."""
    buyers = [BuyerFactory(slug=f"fan-{n}") for n in range(4)]
    assert {b.pk % 2 for b in buyers} == {0, 1}
    for buyer in buyers:
        usage_record_create_batch(
            operator=seller,
            records=[
                UsageRecordInput(
                    f"{buyer.slug}-{n}", a800_cluster.cpi, buyer.slug, 2, local(1, n), local(1, n + 1), 1
                )
                for n in range(3)
            ],
        )
    published: list[dict] = []

    def on_publish(
        sender: object = None, headers: dict | None = None, body: object = None, **_: object
    ) -> None:
        if sender == "metering.usage_rate_pending":
            published.append(body[1])  # (args, kwargs, embed)

    after_task_publish.connect(on_publish, weak=False)
    try:
        rated = tasks.usage_rate_pending.apply(kwargs={"shards": 2}).get()
    finally:
        after_task_publish.disconnect(on_publish)
        with celery_app.connection_for_write() as conn:
            conn.default_channel.queue_purge("rating")  # rating's own queue (CELERY_TASK_ROUTES)

    part_one = {b.pk for b in buyers if b.pk % 2 == 1}
    assert rated == 3 * (4 - len(part_one))
    assert published == [{"batch_size": None, "max_batches": None, "shard": 1, "shards": 2}]
    assert set(UsagePending.objects.values_list("buyer_id", flat=True)) == part_one
    assert set(RatedSegment.objects.values_list("buyer_id", flat=True)) == {b.pk for b in buyers} - part_one


def test_a_run_over_its_time_budget_queues_the_next_run_of_its_part(
    settings: Any, seller: Organisation, a800_cluster: Cluster, gd_price_card: PriceCard
) -> None:
    """A run claims no new batch once CARDHOUR_RATING_RUN_SECONDS have passed (0 here: one batch) and, its
    last batch being full, queues the next run at once (through the real broker, no worker running); the
    runs that follow rate the rest, and the one that finds less than a batch queues none."""
    settings.CARDHOUR_RATING_RUN_SECONDS = 0
    buyer = BuyerFactory(slug="backlog")
    usage_record_create_batch(
        operator=seller,
        records=[
            UsageRecordInput(f"b-{n}", a800_cluster.cpi, buyer.slug, 2, local(1, n), local(1, n + 1), 1)
            for n in range(5)
        ],
    )
    key = tasks.RATING_CONTINUE_KEY.format(part="all")
    cache.delete(key)
    published: list[dict] = []

    def on_publish(sender: object = None, body: object = None, **_: object) -> None:
        if sender == "metering.usage_rate_pending":
            published.append(body[1])  # type: ignore[index]

    after_task_publish.connect(on_publish, weak=False)
    try:
        rated = [tasks.usage_rate_pending.apply(kwargs={"batch_size": 2}).get() for _ in range(3)]
    finally:
        after_task_publish.disconnect(on_publish)
        with celery_app.connection_for_write() as conn:
            conn.default_channel.queue_purge("rating")
        cache.delete(key)
    assert rated == [2, 2, 1]
    assert not UsagePending.objects.exists()
    nxt = {"batch_size": 2, "max_batches": None, "shard": None, "shards": 1}
    assert published == [nxt, nxt]  # after the first two runs; the third drained the backlog


def test_at_most_one_next_run_waits_per_part() -> None:
    """However many runs stop for their budget while one is waiting, no second one is queued; a run that
    starts clears the marker (here: the delete)."""
    key = tasks.RATING_CONTINUE_KEY.format(part="0/2")
    cache.delete(key)
    published: list[object] = []

    def on_publish(sender: object = None, **_: object) -> None:
        published.append(sender)

    after_task_publish.connect(on_publish, weak=False)
    kwargs: dict[str, int | None] = {"batch_size": None, "max_batches": None, "shard": 0, "shards": 2}
    try:
        assert tasks._queue_next_run(key, kwargs) is True
        assert tasks._queue_next_run(key, kwargs) is False
        cache.delete(key)
        assert tasks._queue_next_run(key, kwargs) is True
    finally:
        after_task_publish.disconnect(on_publish)
        with celery_app.connection_for_write() as conn:
            conn.default_channel.queue_purge("rating")
        cache.delete(key)
    assert published == ["metering.usage_rate_pending", "metering.usage_rate_pending"]
