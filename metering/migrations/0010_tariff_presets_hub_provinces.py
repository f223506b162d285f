"""Presets for more hub provinces: Beijing (京发改规〔2023〕11号), Hebei's Jibei grid (the Hebei DRC's notice
of 2025-11-26), Jiangsu (苏发改价格发〔2025〕426号), Sichuan (川发改价格〔2025〕185号) and Guizhou
(黔发改价格〔2023〕481号), every one ``unconfirmed`` (never a default); Ningxia's customer class restated.
Each edition is written at its notice's effective date (see tariff_presets_load); a version a price card
uses is never changed."""

from django.db import migrations


def refresh(apps, schema_editor):
    from metering.services.tariffs import tariff_presets_load

    tariff_presets_load(apps)


class Migration(migrations.Migration):
    dependencies = [("metering", "0009_tariff_presets_sourced")]
    operations = [migrations.RunPython(refresh, migrations.RunPython.noop)]
