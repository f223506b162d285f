"""Usage records' foreign keys checked once per statement instead of once per row (issue 14, item 2).

A foreign key's check is a query per inserted row and key: four per usage record (operator, cluster, buyer,
price card), run at commit, ~35 µs of PostgreSQL CPU per record in a batch of 1,000 — more than the insert
itself. On PostgreSQL the four constraints become statement-level triggers with the same rule and the same
locks, each distinct row named checked and locked once per statement:

- ``metering_usage_parents_check`` (AFTER INSERT OR UPDATE on the usage table, every partition's rows in its
  transition table): every operator, buyer, cluster and price card the statement's rows name exists, or the
  statement fails with ``foreign_key_violation`` (SQLSTATE 23503, Django's IntegrityError, as before); the
  rows are locked ``FOR KEY SHARE`` in id order, as a foreign key locks them, so a concurrent delete of one
  waits for this transaction and then finds the records.
- ``metering_usage_parent_delete_check`` (AFTER DELETE on organisations, clusters and price cards): a delete
  of a row that usage records name fails with ``foreign_key_violation`` (a foreign key's NO ACTION; Django's
  PROTECT refuses it before that). Its queries are the ones the foreign keys' own checks ran.

Django keeps the relations (``db_constraint=False``): joins, PROTECT and admin links are unchanged. SQLite (the
embedded default, one writer) keeps no constraint for them.
"""

from django.db import migrations, models

import django.db.models.deletion

PARENTS_CHECK = """
CREATE FUNCTION metering_usage_parents_check() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    wanted bigint;
    locked bigint;
    missing text;
BEGIN
    SELECT count(*) INTO wanted FROM (SELECT operator_id FROM new_rows UNION SELECT buyer_id FROM new_rows) ids;
    PERFORM 1 FROM core_organisation
      WHERE id IN (SELECT operator_id FROM new_rows UNION SELECT buyer_id FROM new_rows)
      ORDER BY id FOR KEY SHARE;
    GET DIAGNOSTICS locked = ROW_COUNT;
    IF locked < wanted THEN
        SELECT string_agg(DISTINCT id::text, ', ') INTO missing
          FROM (SELECT operator_id AS id FROM new_rows UNION SELECT buyer_id FROM new_rows) ids
         WHERE NOT EXISTS (SELECT 1 FROM core_organisation o WHERE o.id = ids.id);
        RAISE EXCEPTION 'usage record names no organisation %', missing
            USING ERRCODE = 'foreign_key_violation', TABLE = 'metering_usagerecord';
    END IF;

    SELECT count(DISTINCT cluster_id) INTO wanted FROM new_rows;
    PERFORM 1 FROM federation_cluster WHERE id IN (SELECT cluster_id FROM new_rows) ORDER BY id FOR KEY SHARE;
    GET DIAGNOSTICS locked = ROW_COUNT;
    IF locked < wanted THEN
        SELECT string_agg(DISTINCT n.cluster_id::text, ', ') INTO missing FROM new_rows n
         WHERE NOT EXISTS (SELECT 1 FROM federation_cluster c WHERE c.id = n.cluster_id);
        RAISE EXCEPTION 'usage record names no cluster %', missing
            USING ERRCODE = 'foreign_key_violation', TABLE = 'metering_usagerecord';
    END IF;

    SELECT count(DISTINCT price_card_id) INTO wanted FROM new_rows;
    PERFORM 1 FROM metering_pricecard WHERE id IN (SELECT price_card_id FROM new_rows) ORDER BY id FOR KEY SHARE;
    GET DIAGNOSTICS locked = ROW_COUNT;
    IF locked < wanted THEN
        SELECT string_agg(DISTINCT n.price_card_id::text, ', ') INTO missing FROM new_rows n
         WHERE NOT EXISTS (SELECT 1 FROM metering_pricecard p WHERE p.id = n.price_card_id);
        RAISE EXCEPTION 'usage record names no price card %', missing
            USING ERRCODE = 'foreign_key_violation', TABLE = 'metering_usagerecord';
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER usage_parents_insert AFTER INSERT ON metering_usagerecord
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION metering_usage_parents_check();
CREATE TRIGGER usage_parents_update AFTER UPDATE ON metering_usagerecord
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION metering_usage_parents_check();
"""

DELETE_CHECK = """
CREATE FUNCTION metering_usage_parent_delete_check() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    named bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM old_rows) THEN
        RETURN NULL;
    END IF;
    IF TG_TABLE_NAME = 'core_organisation' THEN
        SELECT u.buyer_id INTO named FROM metering_usagerecord u WHERE u.buyer_id IN (SELECT id FROM old_rows)
         LIMIT 1;
        IF named IS NULL THEN
            SELECT u.operator_id INTO named FROM metering_usagerecord u
             WHERE u.operator_id IN (SELECT id FROM old_rows) LIMIT 1;
        END IF;
    ELSIF TG_TABLE_NAME = 'federation_cluster' THEN
        SELECT u.cluster_id INTO named FROM metering_usagerecord u WHERE u.cluster_id IN (SELECT id FROM old_rows)
         LIMIT 1;
    ELSE
        SELECT u.price_card_id INTO named FROM metering_usagerecord u
         WHERE u.price_card_id IN (SELECT id FROM old_rows) LIMIT 1;
    END IF;
    IF named IS NOT NULL THEN
        RAISE EXCEPTION '% % is still named by usage records', TG_TABLE_NAME, named
            USING ERRCODE = 'foreign_key_violation', TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER usage_parent_delete AFTER DELETE ON core_organisation
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION metering_usage_parent_delete_check();
CREATE TRIGGER usage_parent_delete AFTER DELETE ON federation_cluster
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION metering_usage_parent_delete_check();
CREATE TRIGGER usage_parent_delete AFTER DELETE ON metering_pricecard
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION metering_usage_parent_delete_check();
"""

DROP = """
DROP TRIGGER IF EXISTS usage_parents_insert ON metering_usagerecord;
DROP TRIGGER IF EXISTS usage_parents_update ON metering_usagerecord;
DROP TRIGGER IF EXISTS usage_parent_delete ON core_organisation;
DROP TRIGGER IF EXISTS usage_parent_delete ON federation_cluster;
DROP TRIGGER IF EXISTS usage_parent_delete ON metering_pricecard;
DROP FUNCTION IF EXISTS metering_usage_parents_check();
DROP FUNCTION IF EXISTS metering_usage_parent_delete_check();
"""


def _create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PARENTS_CHECK, params=None)
        schema_editor.execute(DELETE_CHECK, params=None)


def _drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


def _field(to: str, related_name: str) -> models.ForeignKey:
    return models.ForeignKey(
        db_constraint=False,
        db_index=False,
        on_delete=django.db.models.deletion.PROTECT,
        related_name=related_name,
        to=to,
    )


class Migration(migrations.Migration):
    dependencies = [
        ("core", "0005_demo_record"),
        ("federation", "0008_cluster_offline_at"),
        ("metering", "0014_usage_partitions"),
    ]

    operations = [
        migrations.AlterField(
            model_name="usagerecord", name="buyer", field=_field("core.organisation", "usage_records")
        ),
        migrations.AlterField(
            model_name="usagerecord", name="cluster", field=_field("federation.cluster", "usage_records")
        ),
        migrations.AlterField(
            model_name="usagerecord", name="operator", field=_field("core.organisation", "+")
        ),
        migrations.AlterField(
            model_name="usagerecord", name="price_card", field=_field("metering.pricecard", "usage_records")
        ),
        migrations.RunPython(_create, _drop),
    ]
