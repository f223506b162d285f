"""Fewer indexes to write per registration (issue 14: ≥ 200 clusters/s with 10 islands each).

A registration inserts 11 issued identifiers, a cluster, 10 islands and a history row; each index on those
tables is one more insert per row. Dropped here, because another index already serves their lookups or
nothing looks them up:

- the single-column foreign-key indexes on cluster.operator, cluster.hub, island.cluster and
  clusterstatuschange.cluster: composite indexes lead with the same column (cluster_operator_hub,
  cluster_hub_chip_status, island_unique_name, status_change_cluster_time);
- on PostgreSQL, the ``varchar_pattern_ops`` ("_like") indexes Django adds beside every unique CharField, here
  on the three ``cpi`` columns: they serve only LIKE 'prefix%' queries, and nothing queries identifiers that
  way (resolution matches segments by equality); the unique indexes still serve equality.

Together about a third of the index entries a registration wrote, and about a fifth of PostgreSQL's CPU
per registration.
"""

import django.db.models.deletion
from django.db import migrations, models

LIKE_INDEXED = (
    ("federation_cluster", "cpi"),
    ("federation_island", "cpi"),
    ("federation_issuedidentifier", "cpi"),
)


def _like_index_name(schema_editor, table: str, column: str) -> str:
    # The name Django gave it (django.db.backends.postgresql.schema: _create_like_index_sql).
    return schema_editor._create_index_name(table, [column], suffix="_like")


def drop_like_indexes(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for table, column in LIKE_INDEXED:
        name = _like_index_name(schema_editor, table, column)
        schema_editor.execute(f"DROP INDEX IF EXISTS {schema_editor.quote_name(name)}")


def create_like_indexes(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for table, column in LIKE_INDEXED:
        name = _like_index_name(schema_editor, table, column)
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS {schema_editor.quote_name(name)} ON {schema_editor.quote_name(table)} "
            f"({schema_editor.quote_name(column)} varchar_pattern_ops)"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("core", "0005_demo_record"),
        ("federation", "0006_cluster_maintenance"),
    ]

    operations = [
        migrations.AlterField(
            model_name="cluster",
            name="hub",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="clusters",
                to="federation.hub",
            ),
        ),
        migrations.AlterField(
            model_name="cluster",
            name="operator",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="clusters",
                to="core.organisation",
            ),
        ),
        migrations.AlterField(
            model_name="clusterstatuschange",
            name="cluster",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="status_changes",
                to="federation.cluster",
            ),
        ),
        migrations.AlterField(
            model_name="island",
            name="cluster",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="islands",
                to="federation.cluster",
            ),
        ),
        migrations.RunPython(drop_like_indexes, create_like_indexes, elidable=False),
    ]
