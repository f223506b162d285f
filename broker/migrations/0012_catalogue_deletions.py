"""A deletion from any table the broker's catalogue is read from is recorded in one row (issue 14, item 1).

The catalogue (broker.catalog) is brought up to date by reading only the rows written since its last read,
found by their ``xmin``. A deleted row leaves no row behind to find, so each of those tables has a
statement-level trigger, after DELETE or TRUNCATE, that writes the one row of
``broker_catalogue_deletions``: a catalogue that finds that row written since its read is read whole.

Deletions from these tables are rare (the admin refuses most; islands and clusters are retired, not
deleted), so the row costs the operators' hot writes (heartbeats: updates) nothing. The row is upserted:
the first deletion creates it.

``tests/broker/test_catalogue_refresh.py`` holds that every table in ``broker.catalog._WATCHED`` has the
trigger. PostgreSQL only: elsewhere the catalogue is always read whole.
"""

from django.db import migrations

# The tables of broker.catalog._WATCHED when this migration was written (fixed here: a migration must not
# change with the code).
TABLES = (
    "federation_island",
    "federation_cluster",
    "metering_pricecard",
    "metering_tariffversion",
    "metering_tariff",
    "federation_accelerator",
    "federation_hub",
    "federation_hublatency",
    "federation_standardcard",
    "broker_clusterreliability",
)

CREATE = """
CREATE TABLE broker_catalogue_deletions (
    id smallint PRIMARY KEY CHECK (id = 1),
    deletions bigint NOT NULL
);
CREATE FUNCTION broker_catalogue_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO broker_catalogue_deletions AS d (id, deletions) VALUES (1, 1)
    ON CONFLICT (id) DO UPDATE SET deletions = d.deletions + 1;
    RETURN NULL;
END
$$;
""" + "".join(
    f"CREATE TRIGGER broker_catalogue_deleted AFTER DELETE OR TRUNCATE ON {table} "
    "FOR EACH STATEMENT EXECUTE FUNCTION broker_catalogue_deleted();\n"
    for table in TABLES
)

DROP = (
    "".join(f"DROP TRIGGER broker_catalogue_deleted ON {table};\n" for table in TABLES)
    + "DROP FUNCTION broker_catalogue_deleted();\nDROP TABLE broker_catalogue_deletions;\n"
)


def _create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE, params=None)


def _drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("broker", "0011_lease_fillfactor"),
        ("federation", "0009_heartbeat_hot_updates"),
        ("metering", "0016_usage_parent_checks_by_key"),
    ]

    operations = [migrations.RunPython(_create, _drop)]
