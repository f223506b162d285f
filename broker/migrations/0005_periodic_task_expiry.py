"""Periodic tasks that run every few seconds expire after one interval.

After a worker outage, beat has gone on sending the 5–60 s tasks (failover, lease events, the heartbeat
monitor, rating…): without an expiry hundreds of stale copies would run back to back when a worker
returns, each doing what the next one does anyway. A copy not started within its own interval is
discarded — the next one is already on its way. Daily and monthly tasks (pack expiry, reconciliation, the
month-end close) keep no expiry: each must run even if late.
"""

from django.db import migrations

SHORT = 3600  # interval tasks of at most an hour


def _expire_after_one_interval(apps, schema_editor):
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    factor = {"microseconds": 1e-6, "seconds": 1, "minutes": 60, "hours": 3600, "days": 86400}
    for task in PeriodicTask.objects.filter(interval__isnull=False, expires__isnull=True).select_related("interval"):
        seconds = int(task.interval.every * factor.get(task.interval.period, 1))
        if 0 < seconds <= SHORT:
            task.expire_seconds = max(seconds, 1)
            task.save(update_fields=["expire_seconds"])


def _no_expiry(apps, schema_editor):
    apps.get_model("django_celery_beat", "PeriodicTask").objects.update(expire_seconds=None)


class Migration(migrations.Migration):
    dependencies = [
        ("broker", "0004_buyer_preference"),
        ("federation", "0003_heartbeat_monitor_schedule"),
        ("metering", "0004_billing_schedules"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(_expire_after_one_interval, _no_expiry)]
