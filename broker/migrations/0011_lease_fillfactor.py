"""Room on every lease page for the usage report's frontier update (issue 14, item 2).

Each usage batch moves ``last_usage_end_at`` of every lease it names. That column is in no index, so the
update can be HOT (the new row version on the same page, no index touched) — but only if the page has room.
Lease pages filled to 100 % (the default) send the first update of every lease to another page, with an
entry in each of the table's eleven indexes (and a full-page image of each index page in the WAL): work per
lease, so a batch naming 400 leases costs ~30× one naming 12. Leaving a fifth of each page free keeps the
frontier update on the page. PostgreSQL only (SQLite has no fillfactor); existing pages get the room as
they are rewritten (VACUUM FULL, or pruning as rows are updated).
"""

from django.db import migrations

FILLFACTOR = 80


def set_fillfactor(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        table = schema_editor.quote_name(apps.get_model("broker", "Lease")._meta.db_table)
        schema_editor.execute(f"ALTER TABLE {table} SET (fillfactor = {FILLFACTOR})")


def reset_fillfactor(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        table = schema_editor.quote_name(apps.get_model("broker", "Lease")._meta.db_table)
        schema_editor.execute(f"ALTER TABLE {table} RESET (fillfactor)")


class Migration(migrations.Migration):
    dependencies = [("broker", "0010_draw_holds")]

    operations = [migrations.RunPython(set_fillfactor, reset_fillfactor)]
