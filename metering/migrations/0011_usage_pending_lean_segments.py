"""Rating without touching the wide usage row (issue 14, item 3).

- ``UsagePending``: the narrow pending-rating queue, filled here with every record not yet rated (then
  ``rated_at`` / ``rating_transfer`` go: "rated" is "not pending", the time and transfer are the segments').
- Rated segments carry their record's buyer and operator (filled here from the records), for statements and
  month partitions that need not go through the usage records.
- Segments' references to record, pack and transfer lose their database foreign keys (each cost a lookup
  and a parent-row lock per segment written); the reconciliation task checks them instead
  (``segment_dangling_reference``).
- The queue is vacuumed often: it is all inserts and deletes.
"""

import django.db.models.deletion
from django.db import migrations, models


def _queue_unrated(apps, schema_editor):
    UsageRecord = apps.get_model("metering", "UsageRecord")
    UsagePending = apps.get_model("metering", "UsagePending")
    unrated = UsageRecord.objects.filter(rated_at__isnull=True).order_by("pk")
    batch = []
    for record in unrated.iterator(chunk_size=5000):
        batch.append(
            UsagePending(
                usage_record_id=record.pk,
                operator_id=record.operator_id,
                cluster_id=record.cluster_id,
                buyer_id=record.buyer_id,
                price_card_id=record.price_card_id,
                cards=record.cards,
                start_at=record.start_at,
                end_at=record.end_at,
            )
        )
        if len(batch) == 5000:
            UsagePending.objects.bulk_create(batch)
            batch = []
    UsagePending.objects.bulk_create(batch)


def _unqueue(apps, schema_editor):
    UsageRecord = apps.get_model("metering", "UsageRecord")
    LedgerTransfer = apps.get_model("metering", "LedgerTransfer")
    RatedSegment = apps.get_model("metering", "RatedSegment")
    first = RatedSegment.objects.filter(usage_record_id=models.OuterRef("pk")).order_by("seq")
    rated = UsageRecord.objects.filter(rating_pending__isnull=True)
    rated.update(rating_transfer_id=models.Subquery(first.values("transfer_id")[:1]))
    rated.update(
        rated_at=models.Subquery(
            LedgerTransfer.objects.filter(pk=models.OuterRef("rating_transfer_id")).values("posted_at")[:1]
        )
    )


def _segment_parties(apps, schema_editor):
    UsageRecord = apps.get_model("metering", "UsageRecord")
    RatedSegment = apps.get_model("metering", "RatedSegment")
    record = UsageRecord.objects.filter(pk=models.OuterRef("usage_record_id"))
    RatedSegment.objects.update(
        buyer_id=models.Subquery(record.values("buyer_id")[:1]),
        operator_id=models.Subquery(record.values("operator_id")[:1]),
    )


def _vacuum_queue_often(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "ALTER TABLE metering_usagepending SET (autovacuum_vacuum_scale_factor = 0.0,"
            " autovacuum_vacuum_threshold = 50000, autovacuum_vacuum_insert_scale_factor = 0.0,"
            " autovacuum_vacuum_insert_threshold = 50000)"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("core", "0005_demo_record"),
        ("metering", "0010_tariff_presets_hub_provinces"),
    ]

    operations = [
        migrations.CreateModel(
            name="UsagePending",
            fields=[
                (
                    "usage_record",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="rating_pending",
                        serialize=False,
                        to="metering.usagerecord",
                    ),
                ),
                ("operator_id", models.BigIntegerField()),
                ("cluster_id", models.BigIntegerField()),
                ("buyer_id", models.BigIntegerField()),
                ("price_card_id", models.BigIntegerField()),
                ("cards", models.PositiveIntegerField()),
                ("start_at", models.DateTimeField()),
                ("end_at", models.DateTimeField()),
            ],
            options={
                "ordering": ["usage_record_id"],
            },
        ),
        migrations.RunPython(_vacuum_queue_often, migrations.RunPython.noop),
        migrations.RunPython(_queue_unrated, _unqueue),
        migrations.RemoveIndex(
            model_name="usagerecord",
            name="usage_record_unrated",
        ),
        migrations.RemoveField(
            model_name="usagerecord",
            name="rated_at",
        ),
        migrations.RemoveField(
            model_name="usagerecord",
            name="rating_transfer",
        ),
        migrations.AddField(
            model_name="ratedsegment",
            name="buyer",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="core.organisation",
            ),
        ),
        migrations.AddField(
            model_name="ratedsegment",
            name="operator",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="core.organisation",
            ),
        ),
        migrations.RunPython(_segment_parties, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="ratedsegment",
            name="buyer",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="core.organisation",
            ),
        ),
        migrations.AlterField(
            model_name="ratedsegment",
            name="operator",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="core.organisation",
            ),
        ),
        migrations.AlterField(
            model_name="ratedsegment",
            name="pack",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="segments",
                to="metering.pack",
            ),
        ),
        migrations.AlterField(
            model_name="ratedsegment",
            name="transfer",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="segments",
                to="metering.ledgertransfer",
            ),
        ),
        migrations.AlterField(
            model_name="ratedsegment",
            name="usage_record",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="segments",
                to="metering.usagerecord",
            ),
        ),
    ]
