"""The heartbeat monitor's schedule, stored in django-celery-beat's tables so staff can edit it in admin.

It runs every 10 seconds: a cluster is noticed at most 10 s after its third missed 30 s interval.
"""

from django.db import migrations

TASK = "federation.clusters_mark_missed_heartbeats"


def create(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    schedule, _ = IntervalSchedule.objects.get_or_create(every=10, period="seconds")
    PeriodicTask.objects.get_or_create(
        name="Heartbeat monitor: take silent clusters offline",
        defaults={"task": TASK, "interval": schedule, "enabled": True,
                  "description": "federation: offline after CARDHOUR_HEARTBEAT_MISSED_LIMIT missed intervals"},
    )


def remove(apps, schema_editor):
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(task=TASK).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("federation", "0002_reference_data"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]
    operations = [migrations.RunPython(create, remove)]
