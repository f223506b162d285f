"""The broker's periodic tasks, stored in django-celery-beat's tables so staff can edit them in admin.

- fail over offline clusters: every 5 seconds, so a lease is re-placed within 10 seconds of its cluster
  being marked offline (one interval of waiting at most, plus the re-placement itself);
- stop leases of exhausted buyers: every 10 seconds;
- deliver lease events to operators' endpoints: every 5 seconds;
- purge expired quotes: hourly.
"""

from django.db import migrations

SCHEDULES = [
    # (name, task, interval seconds, description)
    ("Broker: fail over offline clusters", "broker.leases_fail_over", 5,
     "broker: interrupt the leases of offline clusters; re-place checkpointable ones, fail the rest"),
    ("Broker: stop leases of exhausted buyers", "broker.leases_stop_exhausted", 10,
     "broker: ask operators to stop the running leases of buyers whose packs ran dry"),
    ("Broker: deliver lease events", "broker.lease_events_deliver", 5,
     "broker: POST due lease events to operators' endpoints, with backoff"),
    ("Broker: purge expired quotes", "broker.quotes_purge", 3600,
     "broker: delete quotes that expired more than a day ago and were never accepted"),
]


def create(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    for name, task, seconds, description in SCHEDULES:
        interval, _ = IntervalSchedule.objects.get_or_create(every=seconds, period="seconds")
        PeriodicTask.objects.get_or_create(
            name=name, defaults={"task": task, "enabled": True, "description": description, "interval": interval}
        )


def remove(apps, schema_editor):
    tasks = [task for _, task, _, _ in SCHEDULES]
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(task__in=tasks).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("broker", "0001_initial"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]
    operations = [migrations.RunPython(create, remove)]
