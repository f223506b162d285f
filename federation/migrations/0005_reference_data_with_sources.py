"""Reference data with sources: the "reported" chip status and "estimated" latency origin, then a refresh
of the catalog (PCIe parts, MLU590, BR100, honest spec_status, ambiguous bare aliases) and of the latency
seed (distance estimates between hubs; measured rows are left alone)."""

from django.db import migrations, models


def refresh(apps, schema_editor):
    from federation.catalog import load_reference_data

    load_reference_data(apps)


class Migration(migrations.Migration):

    dependencies = [
        ('federation', '0004_cluster_operator_cpi_index'),
    ]

    operations = [
        migrations.AlterField(
            model_name='accelerator',
            name='spec_status',
            field=models.CharField(choices=[('published', 'Published specification'), ('reported', 'Reported by others, not the chip vendor'), ('unknown', 'Not public (unknown)')], default='published', max_length=12),
        ),
        migrations.AlterField(
            model_name='hublatency',
            name='origin',
            field=models.CharField(choices=[('policy', 'Policy tier (seed)'), ('estimated', 'Estimated from distance (seed)'), ('measured', 'Measured')], default='policy', max_length=12),
        ),
        migrations.RunPython(refresh, migrations.RunPython.noop),
    ]
