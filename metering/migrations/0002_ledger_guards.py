"""PostgreSQL guards on the ledger: entries and transfers are append-only, and every transfer's entries sum
to zero per unit when the transaction commits (a deferred constraint trigger, once per transfer). SQLite relies on the posting
service and the reconciliation task for the same rules."""

from django.db import migrations

APPEND_ONLY = """
CREATE OR REPLACE FUNCTION metering_ledger_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'ledger rows are append-only (% on %)', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'integrity_constraint_violation';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER metering_ledgerentry_append_only
    BEFORE UPDATE OR DELETE ON metering_ledgerentry
    FOR EACH ROW EXECUTE FUNCTION metering_ledger_append_only();
CREATE TRIGGER metering_ledgertransfer_append_only
    BEFORE UPDATE OR DELETE ON metering_ledgertransfer
    FOR EACH ROW EXECUTE FUNCTION metering_ledger_append_only();

CREATE OR REPLACE FUNCTION metering_ledger_transfer_balanced() RETURNS trigger AS $$
DECLARE
    bad_unit text;
BEGIN
    SELECT unit INTO bad_unit FROM metering_ledgerentry
     WHERE transfer_id = NEW.id
     GROUP BY unit HAVING SUM(amount) <> 0
     LIMIT 1;
    IF bad_unit IS NOT NULL THEN
        RAISE EXCEPTION 'ledger transfer % does not balance in %', NEW.id, bad_unit
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

-- Once per transfer, at commit, when all of its entries are in.
CREATE CONSTRAINT TRIGGER metering_ledgertransfer_balanced
    AFTER INSERT ON metering_ledgertransfer
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION metering_ledger_transfer_balanced();
"""

DROP = """
DROP TRIGGER IF EXISTS metering_ledgertransfer_balanced ON metering_ledgertransfer;
DROP TRIGGER IF EXISTS metering_ledgerentry_append_only ON metering_ledgerentry;
DROP TRIGGER IF EXISTS metering_ledgertransfer_append_only ON metering_ledgertransfer;
DROP FUNCTION IF EXISTS metering_ledger_transfer_balanced();
DROP FUNCTION IF EXISTS metering_ledger_append_only();
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(APPEND_ONLY, params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [("metering", "0001_initial")]
    operations = [migrations.RunPython(forwards, backwards)]
