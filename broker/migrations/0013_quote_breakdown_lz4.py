"""Quote breakdowns compressed with lz4 instead of pglz (issue 14, item 1).

A quote request stores ten quotes, each with a breakdown of ~1.6 KB of JSON (bands, draw plan, islands and
alternatives). Rows that size are over PostgreSQL's TOAST threshold (~2 KB with the rest of the row), so each
breakdown is compressed as it is written: with the default pglz that cost ~0.13 ms of PostgreSQL CPU per
quote request of the ~0.7 ms its insert takes (measured on the benchmark's market: 0.67 against 0.53 ms per
ten-row insert); lz4 compresses about as well (1,096 against 1,034 bytes per breakdown) at that lower cost.
Only the breakdowns written from now on are compressed with lz4 (PostgreSQL reads either). PostgreSQL 14+
built with lz4 only (Debian's and the official images are); elsewhere, and on SQLite, nothing changes.
"""

from django.db import migrations


def _lz4_available(schema_editor) -> bool:
    if schema_editor.connection.vendor != "postgresql":
        return False
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
        )
        row = cursor.fetchone()
    return bool(row and row[0])


def _set_compression(apps, schema_editor, method: str) -> None:
    if not _lz4_available(schema_editor):
        return
    model = apps.get_model("broker", "Quote")
    table = schema_editor.quote_name(model._meta.db_table)
    column = schema_editor.quote_name(model._meta.get_field("breakdown").column)
    schema_editor.execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET COMPRESSION {method}")


def to_lz4(apps, schema_editor):
    _set_compression(apps, schema_editor, "lz4")


def to_default(apps, schema_editor):
    _set_compression(apps, schema_editor, "default")


class Migration(migrations.Migration):
    dependencies = [("broker", "0012_catalogue_deletions")]

    operations = [migrations.RunPython(to_lz4, to_default)]
