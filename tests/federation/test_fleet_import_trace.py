"""The real fleet: import Alibaba's production GPU inventories (opt in: CARDHOUR_TRACES=1).

Reads ../shared/data/traces (relative to the project root), which a fresh checkout does not have, so the
test is marked ``trace`` and skipped unless asked for. It prints how long the import took.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile

from core.types import Actor
from federation.errors import FleetImportError
from federation.fleet_import import fleet_import
from federation.models import Accelerator, Cluster, Island, IssuedIdentifier

pytestmark = [pytest.mark.trace, pytest.mark.django_db]

TRACES = Path(settings.BASE_DIR) / ".." / "shared" / "data" / "traces"
SPOT = TRACES / "alibaba-spot-gpu-nodes.csv"
OPENB = TRACES / "alibaba-openb-gpu-nodes.csv"


def spot_inventory() -> bytes:
    """The spot fleet as its operator would upload it: the trace says bare "H800", which the catalog
    refuses as ambiguous (SXM5 or PCIe), so the 8-card H800 nodes are spelled out as SXM5 parts, the
    reading the import used to guess. The trace itself does not say which."""
    content = SPOT.read_bytes()
    assert content.count(b"\nH800,") == 219
    return content.replace(b"\nH800,", b"\nH800-SXM5-80GB,")


def test_the_real_spot_fleet_with_bare_h800_is_refused_as_ambiguous(operator):
    with pytest.raises(FleetImportError) as excinfo:
        fleet_import(
            actor=Actor(organisation=operator, system_label="trace test"),
            operator=operator,
            content=SPOT.read_bytes(),
            hub="nmg",
            site="Alibaba spot",
            allow_unknown_models=True,
        )
    errors = excinfo.value.extra["errors"]
    assert excinfo.value.extra["error_count"] == 219
    assert {(e["code"], tuple(e["candidates"])) for e in errors} == {
        ("accelerator_ambiguous", ("nvidia-h800-pcie-80gb", "nvidia-h800-sxm5-80gb"))
    }


def test_import_the_real_spot_fleet(operator, capsys):
    content = spot_inventory()
    actor = Actor(organisation=operator, system_label="trace test")

    started = time.perf_counter()
    result = fleet_import(
        actor=actor,
        operator=operator,
        content=content,
        hub="nmg",
        site="Alibaba spot",
        allow_unknown_models=True,
    )
    seconds = time.perf_counter() - started
    with capsys.disabled():
        print(
            f"\nspot fleet: {result.nodes} nodes, {result.cards} cards, {result.clusters_created} clusters, "
            f"{result.islands_created} islands imported in {seconds:.3f} s"
        )

    assert (result.rows, result.nodes, result.cards, result.skipped_nodes) == (4278, 4278, 10412, 0)
    assert {m.accelerator: (m.nodes, m.cards) for m in result.models} == {
        "gpu-series-1": (989, 1558),
        "gpu-series-2": (122, 976),
        "nvidia-a10": (2494, 2494),
        "nvidia-a100-sxm4-80gb": (432, 3456),
        "nvidia-a800-sxm4-80gb": (22, 176),
        "nvidia-h800-sxm5-80gb": (219, 1752),
    }
    assert set(result.accelerators_created) == {"gpu-series-1", "gpu-series-2"}
    assert Accelerator.objects.filter(spec_status="unknown", slug__startswith="gpu-series-").count() == 2
    assert result.clusters_created == Cluster.objects.filter(operator=operator).count() == 6
    assert sum(Cluster.objects.filter(operator=operator).values_list("total_cards", flat=True)) == 10412
    islands = Island.objects.filter(cluster__operator=operator)
    assert sum(islands.values_list("cards", flat=True)) == 10412
    # 32 nodes per island: ceil(nodes / 32) per model.
    assert (
        islands.count()
        == result.islands_created
        == sum(math.ceil(n / 32) for n in (989, 122, 2494, 432, 22, 219))
    )
    assert IssuedIdentifier.objects.filter(operator=operator).count() == 6 + islands.count()
    assert seconds < 10

    # Importing the same inventory again changes nothing.
    again = fleet_import(
        actor=actor,
        operator=operator,
        content=content,
        hub="nmg",
        site="Alibaba spot",
        allow_unknown_models=True,
    )
    assert (again.clusters_created, again.clusters_unchanged, again.cards) == (0, 6, 10412)


def test_import_the_real_openb_fleet(operator):
    result = fleet_import(
        actor=Actor(organisation=operator, system_label="trace test"),
        operator=operator,
        content=OPENB.read_bytes(),
        hub="yrd",
        site="Alibaba openb",
        allow_unknown_models=True,
    )
    assert (result.nodes, result.cards) == (1213, 6212)
    # P100, T4 and V100 match the catalog by alias; only the undisclosed G2/G3 series are added, as
    # unknown, never with figures.
    assert set(result.accelerators_created) == {"g2", "g3"}
    assert not Accelerator.objects.filter(
        slug__in=result.accelerators_created, dense_fp16_tflops__isnull=False
    )


def test_upload_the_real_spot_fleet_through_the_api(api, capsys):
    started = time.perf_counter()
    inventory = SimpleUploadedFile("alibaba-spot-gpu-nodes.csv", spot_inventory(), content_type="text/csv")
    response = api.post(
        "/api/v1/fleet-imports",
        {"file": inventory, "hub": "nmg", "site": "Alibaba spot", "allow_unknown_models": "true"},
        format="multipart",
    )
    seconds = time.perf_counter() - started
    with capsys.disabled():
        print(f"\nspot fleet over the API: {seconds:.3f} s")

    assert response.status_code == 201, response.json()
    assert (response.json()["nodes"], response.json()["cards"]) == (4278, 10412)
