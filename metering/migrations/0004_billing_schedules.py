"""The billing jobs' schedules, stored in django-celery-beat's tables so staff can edit them in admin.

- rate pending usage: every 60 seconds;
- expire packs: daily at 00:10, billing zone;
- reconcile the ledger: daily at 03:00, billing zone;
- month-end close: 00:30 on the 1st of each month, billing zone (Asia/Shanghai): thirty minutes after
  midnight leave the last minute's usage time to be reported and rated; later records go on next month's
  statements as prior-period lines.
"""

from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import migrations

SCHEDULES = [
    # (name, task, interval seconds or crontab fields, description)
    ("Billing: rate pending usage", "metering.usage_rate_pending", 60,
     "metering: price unrated usage records and post them to the ledger"),
    ("Billing: expire packs", "metering.packs_expire_due", {"minute": "10", "hour": "0"},
     "metering: expire packs past expires_at; unused value to breakage"),
    ("Billing: reconcile the ledger", "metering.ledger_reconcile", {"minute": "0", "hour": "3"},
     "metering: check the ledger's invariants; breaches logged at ERROR on cardhour.ledger"),
    ("Billing: month-end close", "metering.billing_close_previous_month",
     {"minute": "30", "hour": "0", "day_of_month": "1"},
     "metering: last month's invoices and settlements, once per period"),
]


def create(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    CrontabSchedule = apps.get_model("django_celery_beat", "CrontabSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    zone = ZoneInfo(getattr(settings, "CARDHOUR_BILLING_TIME_ZONE", "Asia/Shanghai"))
    for name, task, when, description in SCHEDULES:
        if isinstance(when, int):
            interval, _ = IntervalSchedule.objects.get_or_create(every=when, period="seconds")
            schedule = {"interval": interval}
        else:
            fields = {"minute": "*", "hour": "*", "day_of_week": "*", "day_of_month": "*",
                      "month_of_year": "*", **when}
            crontab = CrontabSchedule.objects.filter(**fields, timezone=zone).first()
            if crontab is None:
                crontab = CrontabSchedule.objects.create(**fields, timezone=zone)
            schedule = {"crontab": crontab}
        PeriodicTask.objects.get_or_create(
            name=name, defaults={"task": task, "enabled": True, "description": description, **schedule}
        )


def remove(apps, schema_editor):
    tasks = [task for _, task, _, _ in SCHEDULES]
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(task__in=tasks).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("metering", "0003_tariff_presets"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]
    operations = [migrations.RunPython(create, remove)]
