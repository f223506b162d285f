"""Presets with their sources: Ningxia's windows from 宁发改价格(管理)〔2023〕7号 (marked unconfirmed), Guangdong
in force from 331号's effective date 2021-10-01. Existing databases get the corrected editions as new
versions; a version a price card uses is never changed (see tariff_presets_load)."""

from django.db import migrations


def refresh(apps, schema_editor):
    from metering.services.tariffs import tariff_presets_load

    tariff_presets_load(apps)


class Migration(migrations.Migration):
    dependencies = [("metering", "0008_tax_profiles_vat_lines_arrears_settlements")]
    operations = [migrations.RunPython(refresh, migrations.RunPython.noop)]
