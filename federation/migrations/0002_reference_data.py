"""Hubs, the policy latency matrix, standard card v1 and the accelerator catalog."""

from datetime import UTC, datetime

from django.db import migrations


def load(apps, schema_editor):
    from federation import catalog

    Hub = apps.get_model("federation", "Hub")
    HubLatency = apps.get_model("federation", "HubLatency")
    StandardCard = apps.get_model("federation", "StandardCard")
    Accelerator = apps.get_model("federation", "Accelerator")

    hubs = []
    for order, spec in enumerate(catalog.HUBS):
        hub, _ = Hub.objects.update_or_create(code=spec["code"], defaults={**spec, "sort_order": order})
        hubs.append(hub)
    for source in hubs:
        for target in hubs:
            latency = catalog.LATENCY_SAME_HUB_MS if source == target else catalog.LATENCY_BETWEEN_HUBS_MS
            HubLatency.objects.get_or_create(
                source=source, target=target, defaults={"latency_ms": latency, "origin": "policy"}
            )
    StandardCard.objects.get_or_create(
        version=1,
        defaults={
            "dense_fp16_tflops": catalog.STANDARD_CARD_V1_TFLOPS,
            "effective_from": datetime(2026, 1, 1, tzinfo=UTC),
            "note": "400 TFLOPS dense FP16 (platform launch definition)",
        },
    )
    for row in catalog.accelerator_rows():
        Accelerator.objects.update_or_create(slug=row["slug"], defaults=row)


class Migration(migrations.Migration):
    dependencies = [("federation", "0001_initial")]
    operations = [migrations.RunPython(load, migrations.RunPython.noop)]
