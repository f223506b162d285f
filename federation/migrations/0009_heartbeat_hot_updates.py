"""Heartbeats update their cluster and island rows in place (PostgreSQL HOT updates).

At design load 10,000 clusters beat every 30 s (333 a second), and each beat updates its cluster row and its
islands' rows. PostgreSQL can update a row "HOT" — a new version on the same page, no new index entries —
only when no indexed column changes and the page has room. Two things stopped that:

- the index ``cluster_status_heartbeat`` (status, last_heartbeat_at): every beat changes
  ``last_heartbeat_at``, so every beat wrote a new entry into each of the cluster table's eight indexes.
  Nothing needs it: the heartbeat monitor's assessment (federation.selectors.heartbeat_monitor_assess)
  counts every live cluster per hub anyway, one pass over 10,000 rows, and so does the overdue gauge;
- full pages: the tables' fillfactor is now 80 for clusters and 85 for islands, so a beat's new row version
  finds room on its page. It applies to pages written from now on (existing pages fill as rows move);
  ``VACUUM FULL`` or ``pg_repack`` of the two tables applies it at once.
"""

from django.db import migrations, models


def _fillfactor(table_factors: dict[str, int]):
    def apply(apps, schema_editor):
        if schema_editor.connection.vendor != "postgresql":
            return
        for table, factor in table_factors.items():
            schema_editor.execute(f"ALTER TABLE {schema_editor.quote_name(table)} SET (fillfactor = {int(factor)})")

    return apply


class Migration(migrations.Migration):
    dependencies = [("federation", "0008_cluster_offline_at")]

    operations = [
        migrations.RemoveIndex(model_name="cluster", name="cluster_status_heartbeat"),
        migrations.RunPython(
            _fillfactor({"federation_cluster": 80, "federation_island": 85}),
            _fillfactor({"federation_cluster": 100, "federation_island": 100}),
        ),
    ]
