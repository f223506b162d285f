"""The usage table's parent checks (0015) probe each parent by its primary key instead of reading its table
(issue 14, items 2 and 4).

0015's statement-level check found the rows a batch names with ``WHERE id IN (SELECT … FROM new_rows)``. The
transition table has no statistics, so the planner costed 1,000 rows and read the whole parent table
with a hash join, then sorted the result for the lock:

- at 10,000 clusters and 10,000 price cards, ~2 ms each per statement, whatever the batch named (13
  clusters or 97);
- growing with the platform, not with the batch: every new cluster, and every new price-card version,
  made every usage batch dearer.

Here each parent table is checked the way ``broker.services.dispatch._usage_leases`` locks leases: the
distinct ids the rows name, sorted, are unnested and each is locked by its own primary-key probe (a
LATERAL subquery that the ``FOR KEY SHARE`` keeps apart, so a nested loop over the ids is the only plan).
The rule and the locks are unchanged:

- every operator, buyer, cluster and price card named must exist, or the statement fails with
  ``foreign_key_violation`` (SQLSTATE 23503, Django's IntegrityError) naming the missing ids;
- each row named is locked ``FOR KEY SHARE``, in id order, as a foreign key locks it.

The cost is now a probe per distinct parent a statement names. ``tests/metering/test_usage_parent_checks.py``
holds both the rule and the plan (no Seq Scan, Hash or Sort on a parent table).
"""

from importlib import import_module

from django.db import migrations

# NULL ids are left out, as a foreign key lets NULL through (the columns are NOT NULL in any case).
_CHECK = """
    ids := ARRAY(SELECT DISTINCT n.id FROM ({named}) AS n(id) WHERE n.id IS NOT NULL ORDER BY n.id);
    PERFORM 1 FROM unnest(ids) AS wanted(id)
     CROSS JOIN LATERAL (SELECT 1 FROM {table} p WHERE p.id = wanted.id FOR KEY SHARE) AS held;
    GET DIAGNOSTICS locked = ROW_COUNT;
    IF locked < cardinality(ids) THEN
        SELECT string_agg(w.id::text, ', ' ORDER BY w.id) INTO missing FROM unnest(ids) AS w(id)
         WHERE NOT EXISTS (SELECT 1 FROM {table} p WHERE p.id = w.id);
        RAISE EXCEPTION 'usage record names no {noun} %', missing
            USING ERRCODE = 'foreign_key_violation', TABLE = 'metering_usagerecord';
    END IF;
"""
_PARENTS = (
    (
        "SELECT operator_id FROM new_rows UNION ALL SELECT buyer_id FROM new_rows",
        "core_organisation",
        "organisation",
    ),
    ("SELECT cluster_id FROM new_rows", "federation_cluster", "cluster"),
    ("SELECT price_card_id FROM new_rows", "metering_pricecard", "price card"),
)
_BODY = "".join(_CHECK.format(named=named, table=table, noun=noun) for named, table, noun in _PARENTS)
# Fixed text: this schema's table and column names, no values.
BY_KEY = f"""
CREATE OR REPLACE FUNCTION metering_usage_parents_check() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[];
    locked bigint;
    missing text;
BEGIN{_BODY}
    RETURN NULL;
END
$$;
"""

# 0015's function (its text without the triggers, which stay), restored when this migration is reversed.
_0015 = import_module("metering.migrations.0015_usage_parent_checks_per_statement")
BY_SCAN = _0015.PARENTS_CHECK.split("CREATE TRIGGER", 1)[0].replace(
    "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1
)


def _by_key(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BY_KEY, params=None)


def _by_scan(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BY_SCAN, params=None)


class Migration(migrations.Migration):
    dependencies = [("metering", "0015_usage_parent_checks_per_statement")]

    operations = [migrations.RunPython(_by_key, _by_scan)]
