"""Usage records and rated segments partitioned by month on PostgreSQL (issue 14, item 4).

- ``UsageKey``: the operator's idempotency key, unique in one narrow unpartitioned table (a unique index on a
  partitioned table must hold the partition column, which would make the key unique per month only); filled
  here from the existing records, and the usage table's own unique key goes.
- Segments carry their record's start (``record_start_at``, filled here): their partition column, so a record
  and its segments share a month; the unique (record, seq) key holds it.
- The pending-rating queue and exhaustion flags lose their database foreign keys to the usage table (none can
  point at a partitioned table without the partition column); reconciliation checks them.
- PostgreSQL only: both tables become ``PARTITION BY RANGE`` (records on ``start_at``, segments on
  ``record_start_at``), one partition per month of the billing zone from the oldest row to
  ``CARDHOUR_USAGE_PARTITIONS_AHEAD`` months ahead, plus a DEFAULT partition that catches what no month
  holds yet; existing rows are moved in one ``INSERT … SELECT`` (fine at today's size). The physical primary
  key becomes ``(id, partition column)``; ids keep coming from one sequence. Other databases keep plain
  tables (the model is the same).
- The daily beat that creates months ahead (metering.usage_partitions_ensure, 02:00 billing zone).

Reversible: the reverse moves the rows back into plain tables.
"""

from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models
from django.utils import timezone

# table -> partition column
PARTITIONED = {"metering_usagerecord": "start_at", "metering_ratedsegment": "record_start_at"}


def _backfill_keys(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "INSERT INTO metering_usagekey (usage_record_id, operator_id, idempotency_key, start_at)"
            " SELECT id, operator_id, idempotency_key, start_at FROM metering_usagerecord"
        )
        return
    UsageRecord = apps.get_model("metering", "UsageRecord")
    UsageKey = apps.get_model("metering", "UsageKey")
    batch = []
    for pk, operator_id, key, start_at in (
        UsageRecord.objects.order_by("pk").values_list("pk", "operator_id", "idempotency_key", "start_at").iterator()
    ):
        batch.append(UsageKey(usage_record_id=pk, operator_id=operator_id, idempotency_key=key, start_at=start_at))
        if len(batch) == 5000:
            UsageKey.objects.bulk_create(batch)
            batch = []
    UsageKey.objects.bulk_create(batch)


def _backfill_record_start(apps, schema_editor):
    UsageRecord = apps.get_model("metering", "UsageRecord")
    RatedSegment = apps.get_model("metering", "RatedSegment")
    RatedSegment.objects.update(
        record_start_at=models.Subquery(
            UsageRecord.objects.filter(pk=models.OuterRef("usage_record_id")).values("start_at")[:1]
        )
    )


def _months(first: date, last: date) -> list[date]:
    months, month = [], first.replace(day=1)
    while month <= last:
        months.append(month)
        month = (month.replace(day=28) + timedelta(days=4)).replace(day=1)
    return months


def _bound(month: date, zone: ZoneInfo) -> str:
    return datetime(month.year, month.month, 1, tzinfo=zone).isoformat()


def _next(month: date) -> date:
    return (month.replace(day=28) + timedelta(days=4)).replace(day=1)


def _partition(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    zone = ZoneInfo(getattr(settings, "CARDHOUR_BILLING_TIME_ZONE", "Asia/Shanghai"))
    now = timezone.now().astimezone(zone)
    late = now - timedelta(days=getattr(settings, "CARDHOUR_LATE_USAGE_DAYS", 35))
    last = now.date().replace(day=1)
    for _ in range(getattr(settings, "CARDHOUR_USAGE_PARTITIONS_AHEAD", 3)):
        last = _next(last)
    with schema_editor.connection.cursor() as cursor:
        for table, column in PARTITIONED.items():
            old = f"{table}_unpartitioned"
            cursor.execute(f"SELECT min({column}) FROM {table}")  # noqa: S608
            oldest = cursor.fetchone()[0]
            first = min(oldest.astimezone(zone), late) if oldest else late
            # What to recreate on the new table: unique and foreign keys, and plain indexes (the primary key
            # is rebuilt with the partition column; CHECKs and NOT NULLs come with LIKE).
            cursor.execute(
                "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
                " WHERE conrelid = %s::regclass AND contype IN ('u', 'f') ORDER BY conname",
                [table],
            )
            constraints = cursor.fetchall()
            cursor.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema()"
                " AND tablename = %s AND indexname NOT IN (SELECT conname FROM pg_constraint"
                " WHERE conrelid = %s::regclass) ORDER BY indexname",
                [table, table],
            )
            indexes = cursor.fetchall()
            cursor.execute(f"ALTER TABLE {table} RENAME TO {old}")
            cursor.execute(
                f"CREATE TABLE {table} (LIKE {old} INCLUDING CONSTRAINTS)"
                f" PARTITION BY RANGE ({column})"
            )
            for month in _months(first.date(), last):
                cursor.execute(
                    f"CREATE TABLE {table}_p{month:%Y%m} PARTITION OF {table}"
                    f" FOR VALUES FROM ('{_bound(month, zone)}') TO ('{_bound(_next(month), zone)}')"
                )
            cursor.execute(f"CREATE TABLE {table}_default PARTITION OF {table} DEFAULT")
            cursor.execute(f"INSERT INTO {table} SELECT * FROM {old}")  # noqa: S608
            cursor.execute(f"DROP TABLE {old}")
            _own_sequence(cursor, table)
            cursor.execute(f"ALTER TABLE {table} ADD CONSTRAINT {table}_pkey PRIMARY KEY (id, {column})")
            for name, definition in constraints:
                cursor.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} {definition}")
            for _name, definition in indexes:  # read before the rename: they name the new table
                cursor.execute(definition)
            cursor.execute(f"ANALYZE {table}")
        # The key table's only index is the key itself (see metering.models.UsageKey).
        cursor.execute(
            "ALTER TABLE metering_usagekey DROP CONSTRAINT metering_usagekey_pkey,"
            " DROP CONSTRAINT usage_key_unique,"
            " ADD CONSTRAINT usage_key_unique PRIMARY KEY (operator_id, idempotency_key)"
        )


def _own_sequence(cursor, table: str) -> None:
    """Ids from a sequence owned by the column (identity columns cannot be declared on a partitioned table
    before PostgreSQL 17); Django finds it by pg_get_serial_sequence like an identity's."""
    cursor.execute(f"CREATE SEQUENCE {table}_id_seq OWNED BY {table}.id")
    cursor.execute(f"SELECT setval('{table}_id_seq', COALESCE(max(id), 0) + 1, false) FROM {table}")  # noqa: S608
    cursor.execute(f"ALTER TABLE {table} ALTER COLUMN id SET DEFAULT nextval('{table}_id_seq')")


def _unpartition(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "ALTER TABLE metering_usagekey DROP CONSTRAINT usage_key_unique,"
            " ADD CONSTRAINT metering_usagekey_pkey PRIMARY KEY (usage_record_id),"
            " ADD CONSTRAINT usage_key_unique UNIQUE (operator_id, idempotency_key)"
        )
        for table in PARTITIONED:
            old = f"{table}_partitioned"
            cursor.execute(
                "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
                " WHERE conrelid = %s::regclass AND contype IN ('u', 'f') ORDER BY conname",
                [table],
            )
            constraints = cursor.fetchall()
            cursor.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema()"
                " AND tablename = %s AND indexname NOT IN (SELECT conname FROM pg_constraint"
                " WHERE conrelid = %s::regclass) ORDER BY indexname",
                [table, table],
            )
            indexes = cursor.fetchall()
            cursor.execute(f"ALTER TABLE {table} RENAME TO {old}")
            cursor.execute(f"CREATE TABLE {table} (LIKE {old} INCLUDING CONSTRAINTS)")
            cursor.execute(f"INSERT INTO {table} SELECT * FROM {old}")  # noqa: S608
            cursor.execute(f"DROP TABLE {old} CASCADE")
            _own_sequence(cursor, table)
            cursor.execute(f"ALTER TABLE {table} ADD CONSTRAINT {table}_pkey PRIMARY KEY (id)")
            for name, definition in constraints:
                cursor.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} {definition}")
            for _name, definition in indexes:  # a partitioned table's index is "ON ONLY" the parent
                cursor.execute(definition.replace(" ON ONLY ", " ON ", 1))


SCHEDULE = (
    "Usage: create partitions ahead",
    "metering.usage_partitions_ensure",
    {"minute": "0", "hour": "2"},
    "metering: create the coming months' usage and segment partitions (PostgreSQL; idempotent)",
)


def _schedule(apps, schema_editor):
    CrontabSchedule = apps.get_model("django_celery_beat", "CrontabSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    zone = ZoneInfo(getattr(settings, "CARDHOUR_BILLING_TIME_ZONE", "Asia/Shanghai"))
    name, task, when, description = SCHEDULE
    fields = {"minute": "*", "hour": "*", "day_of_week": "*", "day_of_month": "*", "month_of_year": "*", **when}
    crontab = CrontabSchedule.objects.filter(**fields, timezone=zone).first()
    if crontab is None:
        crontab = CrontabSchedule.objects.create(**fields, timezone=zone)
    PeriodicTask.objects.get_or_create(
        name=name, defaults={"task": task, "enabled": True, "description": description, "crontab": crontab}
    )


def _unschedule(apps, schema_editor):
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(task=SCHEDULE[1]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("core", "0005_demo_record"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
        ("metering", "0013_sla_credits"),
    ]

    operations = [
        migrations.CreateModel(
            name="UsageKey",
            fields=[
                (
                    "usage_record",
                    models.OneToOneField(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="key",
                        serialize=False,
                        to="metering.usagerecord",
                    ),
                ),
                ("idempotency_key", models.CharField(max_length=200)),
                ("start_at", models.DateTimeField()),
                (
                    "operator",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="core.organisation",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("operator", "idempotency_key"), name="usage_key_unique")
                ],
            },
        ),
        migrations.RunPython(_backfill_keys, migrations.RunPython.noop),
        migrations.RemoveConstraint(
            model_name="usagerecord",
            name="usage_record_unique_key",
        ),
        migrations.AlterField(
            model_name="buyerexhaustion",
            name="usage_record",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                to="metering.usagerecord",
            ),
        ),
        migrations.AlterField(
            model_name="usagepending",
            name="usage_record",
            field=models.OneToOneField(
                db_constraint=False,
                on_delete=django.db.models.deletion.CASCADE,
                primary_key=True,
                related_name="rating_pending",
                serialize=False,
                to="metering.usagerecord",
            ),
        ),
        migrations.AddField(
            model_name="ratedsegment",
            name="record_start_at",
            field=models.DateTimeField(null=True),
        ),
        migrations.RunPython(_backfill_record_start, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="ratedsegment",
            name="record_start_at",
            field=models.DateTimeField(),
        ),
        migrations.RemoveConstraint(
            model_name="ratedsegment",
            name="rated_segment_unique_seq",
        ),
        migrations.AddConstraint(
            model_name="ratedsegment",
            constraint=models.UniqueConstraint(
                fields=("usage_record", "seq", "record_start_at"), name="rated_segment_unique_seq"
            ),
        ),
        migrations.RunPython(_partition, _unpartition),
        migrations.RunPython(_schedule, _unschedule),
    ]
