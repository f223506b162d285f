"""Billing tasks are thin (they call the services), retry only transient database errors, and their
schedules exist in django-celery-beat's tables after migrate."""

from __future__ import annotations

from datetime import date
from zoneinfo import ZoneInfo

import pytest
from django.db import OperationalError
from django_celery_beat.models import PeriodicTask

from metering import tasks
from metering.models import BillingCloseRun
from metering.services.maintenance import ReconciliationReport

pytestmark = pytest.mark.django_db


def test_tasks_call_the_services(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, dict]] = []
    monkeypatch.setattr(tasks.rating, "usage_rate_pending", lambda **kw: calls.append(("rate", kw)) or 7)
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
        ("rate", {"batch_size": 100, "max_batches": None}),
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
