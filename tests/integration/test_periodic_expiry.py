"""Periodic tasks of a few seconds expire after one interval (no pile of stale copies after an outage);
daily and monthly ones never expire (each must run, even late)."""

from __future__ import annotations

import pytest
from django_celery_beat.models import PeriodicTask

pytestmark = pytest.mark.django_db


def test_short_interval_tasks_expire_after_one_interval_and_crontab_tasks_never() -> None:
    tasks = {t.task: t for t in PeriodicTask.objects.select_related("interval", "crontab")}

    assert tasks["broker.leases_fail_over"].expire_seconds == tasks["broker.leases_fail_over"].interval.every
    assert tasks["federation.clusters_mark_missed_heartbeats"].expire_seconds == 10
    assert tasks["metering.usage_rate_pending"].expire_seconds == 60
    for task in tasks.values():
        if task.crontab_id is not None:
            assert task.expire_seconds is None, task.name
        else:
            assert task.expire_seconds is not None, task.name
