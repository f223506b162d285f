"""Clusters remember when they last went offline: the heartbeat monitor's mass-miss hold counts clusters
taken offline for missed beats within the last missed-beat window. Clusters offline now get the time of
their last move to offline from the status history."""

from django.db import migrations, models
from django.db.models import OuterRef, Subquery


def backfill(apps, schema_editor):  # type: ignore[no-untyped-def]
    Cluster = apps.get_model("federation", "Cluster")
    ClusterStatusChange = apps.get_model("federation", "ClusterStatusChange")
    last_offline = (
        ClusterStatusChange.objects.filter(cluster=OuterRef("pk"), to_status="offline")
        .order_by("-changed_at")
        .values("changed_at")[:1]
    )
    Cluster.objects.filter(status="offline").update(offline_at=Subquery(last_offline))


class Migration(migrations.Migration):
    dependencies = [("federation", "0007_fewer_indexes_per_registration")]

    operations = [
        migrations.AddField(
            model_name="cluster", name="offline_at", field=models.DateTimeField(blank=True, null=True)
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop, elidable=True),
    ]
