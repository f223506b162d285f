"""Hubs, the policy latency matrix, standard card v1 and the accelerator catalog."""

from django.db import migrations


def load(apps, schema_editor):
    from federation.catalog import load_reference_data

    load_reference_data(apps)


class Migration(migrations.Migration):
    dependencies = [("federation", "0001_initial")]
    operations = [migrations.RunPython(load, migrations.RunPython.noop)]
