"""A quote's cluster and price card without a database constraint or index; its ``replaces`` indexed where
set (issue 14, item 1).

A quote request inserts ten quotes in one statement. Each row's foreign keys were checked at commit: a
``SELECT … FOR KEY SHARE`` of the cluster and of the price card per row, twenty row locks per request. The
ten cheapest offers of a market are the same for most of its quotes, so concurrent requests lock the same
rows, and a row locked by two transactions at once gets a MultiXact (written to its own log), beside the
heartbeats' updates of the same cluster rows. Measured on the design-load market in one process: the
insert's PostgreSQL CPU per request went from 0.96 to 0.84 ms without the two constraints and to 0.81 ms
without the three indexes as well; more under concurrency (see the closing note of issue 14).

What the constraints guarded still holds: clusters and price cards are never deleted (no code path deletes
one, the admin refuses it, and PROTECT still refuses it through the ORM), and a quote's ids come from the
catalogue the platform read from those tables. Accepting a quote inserts a lease, whose cluster and price
card keep their constraints. ``replaces`` is null for nearly every quote: its index keeps the others only.

On PostgreSQL the new index is built with ``CREATE INDEX CONCURRENTLY`` (so the migration is not atomic), before
the old one is dropped: the quote table can be large (a day of quotes), and a plain build would hold its
inserts — every quote request — for as long as it reads the table. Dropping the constraints and the old
indexes only takes the table's lock for a moment.
"""

import django.db.models.deletion
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models
from django.db.migrations.operations import AddIndex


class _AddIndexConcurrentlyOnPostgres(AddIndexConcurrently):
    """AddIndexConcurrently on PostgreSQL; a plain AddIndex on any other database (SQLite in development)."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)
        else:
            AddIndex.database_forwards(self, app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)
        else:
            AddIndex.database_backwards(self, app_label, schema_editor, from_state, to_state)


class Migration(migrations.Migration):
    atomic = False
    dependencies = [
        ("broker", "0013_quote_breakdown_lz4"),
        ("federation", "0009_heartbeat_hot_updates"),
        ("metering", "0016_usage_parent_checks_by_key"),
    ]

    operations = [
        migrations.AlterField(
            model_name="quote",
            name="cluster",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="federation.cluster",
            ),
        ),
        migrations.AlterField(
            model_name="quote",
            name="price_card",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="metering.pricecard",
            ),
        ),
        # The new index first, concurrently; then the old one goes with the field's db_index.
        _AddIndexConcurrentlyOnPostgres(
            model_name="quote",
            index=models.Index(
                condition=models.Q(("replaces__isnull", False)), fields=["replaces"], name="quote_replaces"
            ),
        ),
        migrations.AlterField(
            model_name="quote",
            name="replaces",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="broker.lease",
            ),
        ),
    ]
