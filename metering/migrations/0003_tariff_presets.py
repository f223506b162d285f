"""The platform's preset tariffs (Guangdong, Ningxia, flat) from metering.tariffs.PRESETS."""

from django.db import migrations


def load(apps, schema_editor):
    from metering.services.tariffs import tariff_presets_load

    tariff_presets_load(apps)


class Migration(migrations.Migration):
    dependencies = [("metering", "0002_ledger_guards")]
    operations = [migrations.RunPython(load, migrations.RunPython.noop)]
