"""Reference data with sources: PCIe parts, ambiguous aliases refused alike in REST and fleet import,
honest spec_status, the latency seed estimated from distance and replaced by measurements."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.apps import apps as django_apps

from core.types import Actor
from federation import catalog
from federation.catalog import hub_latency_seed, load_reference_data
from federation.errors import AcceleratorAmbiguousError, FleetImportError, UnknownAcceleratorError
from federation.fleet_import import fleet_import
from federation.models import Accelerator, Cluster, HubLatency
from federation.selectors import accelerator_resolve, standard_card_current, standard_card_factor
from tests.factories import BuyerFactory, make_cluster

pytestmark = pytest.mark.django_db

H100_BOTH = ["nvidia-h100-pcie-80gb", "nvidia-h100-sxm5-80gb"]


def register_body(accelerator: str) -> dict[str, object]:
    return {
        "cpi": "cpi:cucc:nx:zw-ai01",
        "site": "Zhongwei",
        "accelerator": accelerator,
        "islands": [{"name": "isl-01", "cards": 8, "fabric": "nvlink"}],
    }


# --- Chips -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("slug", "tflops", "memory", "bandwidth", "fabric", "factor"),
    [
        ("nvidia-h100-pcie-80gb", "756.500", "80.0", "2000.0", "pcie", "1.8912"),
        ("nvidia-h100-sxm5-80gb", "989.400", "80.0", "3350.0", "nvlink", "2.4735"),
        ("nvidia-h800-pcie-80gb", "756.500", "80.0", "2000.0", "pcie", "1.8912"),
        ("nvidia-a100-pcie-80gb", "312.000", "80.0", "1935.0", "pcie", "0.7800"),
        ("nvidia-a800-pcie-80gb", "312.000", "80.0", "1935.0", "pcie", "0.7800"),
    ],
)
def test_pcie_parts_carry_dense_datasheet_figures(slug, tflops, memory, bandwidth, fabric, factor):
    chip = Accelerator.objects.get(slug=slug)
    assert (chip.dense_fp16_tflops, chip.memory_gb, chip.memory_bandwidth_gbps, chip.default_fabric) == (
        Decimal(tflops),
        Decimal(memory),
        Decimal(bandwidth),
        fabric,
    )
    assert chip.spec_status == "published"
    assert "datasheet" in chip.source and "sparsity" in chip.source
    assert standard_card_factor(tflops=chip.dense_fp16_tflops, standard=standard_card_current()) == Decimal(
        factor
    )


def test_spec_status_is_honest_for_every_chip():
    for chip in Accelerator.objects.all():
        assert chip.spec_status in {"published", "reported", "unknown"}, chip.slug
        assert (chip.spec_status == "unknown") == (chip.dense_fp16_tflops is None), chip.slug
    bins = Accelerator.objects.filter(slug__startswith="huawei-ascend-910b").order_by("slug")
    assert [(b.slug, b.spec_status) for b in bins] == [
        ("huawei-ascend-910b1", "reported"),
        ("huawei-ascend-910b2", "reported"),
        ("huawei-ascend-910b3", "reported"),
        ("huawei-ascend-910b4", "reported"),
    ]
    assert all("does not publish per-bin figures" in b.source for b in bins)
    for slug in ("cambricon-mlu590", "biren-br100"):
        chip = Accelerator.objects.get(slug=slug)
        assert (chip.spec_status, chip.dense_fp16_tflops, chip.memory_gb) == ("unknown", None, None)


@pytest.mark.parametrize(
    ("name", "candidates"),
    [
        ("H100", H100_BOTH),
        (" h100 ", H100_BOTH),
        ("H100-80G", H100_BOTH),
        ("A100", ["nvidia-a100-pcie-80gb", "nvidia-a100-sxm4-80gb"]),
        ("A800", ["nvidia-a800-pcie-80gb", "nvidia-a800-sxm4-80gb"]),
        ("H800", ["nvidia-h800-pcie-80gb", "nvidia-h800-sxm5-80gb"]),
        (
            "910B",
            ["huawei-ascend-910b1", "huawei-ascend-910b2", "huawei-ascend-910b3", "huawei-ascend-910b4"],
        ),
    ],
)
def test_an_ambiguous_alias_is_refused_with_its_candidates(name, candidates):
    with pytest.raises(AcceleratorAmbiguousError) as excinfo:
        accelerator_resolve(name=name)
    assert excinfo.value.code == "accelerator_ambiguous"
    assert excinfo.value.extra == {"accelerator": name, "candidates": candidates}


@pytest.mark.parametrize(
    ("name", "slug"),
    [
        ("H20", "nvidia-h20"),
        ("h100-sxm5-80gb", "nvidia-h100-sxm5-80gb"),
        ("H100 PCIe 80GB", "nvidia-h100-pcie-80gb"),
        ("nvidia-h100-pcie-80gb", "nvidia-h100-pcie-80gb"),
        ("MLU590", "cambricon-mlu590"),
        ("910B3", "huawei-ascend-910b3"),
    ],
)
def test_a_specific_name_resolves_to_one_model(name, slug):
    assert accelerator_resolve(name=name).slug == slug


def test_an_unknown_name_is_unknown_accelerator():
    with pytest.raises(UnknownAcceleratorError) as excinfo:
        accelerator_resolve(name="H300")
    assert (excinfo.value.code, excinfo.value.extra) == ("unknown_accelerator", {"accelerator": "H300"})


def test_rest_registration_refuses_an_ambiguous_alias_listing_the_candidates(api, operator):
    response = api.post("/api/v1/clusters", register_body("H100"), format="json")

    assert response.status_code == 400
    data = response.json()
    assert data["code"] == "accelerator_ambiguous"
    assert data["extra"] == {"accelerator": "H100", "candidates": H100_BOTH}
    assert not Cluster.objects.exists()


def test_rest_registration_accepts_h20_as_fleet_import_does(api, operator):
    response = api.post("/api/v1/clusters", register_body("H20"), format="json")

    assert response.status_code == 201, response.json()
    assert response.json()["accelerator"] == "nvidia-h20"
    assert Cluster.objects.get().accelerator.slug == "nvidia-h20"


def test_fleet_import_refuses_an_ambiguous_alias_listing_the_candidates(operator):
    content = "gpu_model,gpu_capacity_num,node_name\nH20,8,n1\nH100,8,n2\n"
    with pytest.raises(FleetImportError) as excinfo:
        fleet_import(
            actor=Actor(organisation=operator, system_label="test"),
            operator=operator,
            content=content,
            hub="nx",
            site="Zhongwei",
        )
    assert excinfo.value.extra["errors"] == [
        {
            "line": 3,
            "code": "accelerator_ambiguous",
            "message": "'H100' could be any of nvidia-h100-pcie-80gb, nvidia-h100-sxm5-80gb; give the slug or "
            "a specific alias.",
            "field": "model",
            "candidates": H100_BOTH,
        }
    ]
    assert not Cluster.objects.exists()


# --- Latency -----------------------------------------------------------------------------------------


def latency(source: str, target: str) -> tuple[Decimal, str]:
    row = HubLatency.objects.get(source__code=source, target__code=target)
    return row.latency_ms, row.origin


def test_the_seed_estimates_each_pair_from_distance_and_keeps_policy_where_it_cannot():
    assert latency("yrd", "yrd") == (Decimal("5.000"), "policy")
    assert latency("yrd", "gba") == (Decimal("15.300"), "estimated")
    assert latency("yrd", "jjj") == (Decimal("18.100"), "estimated")
    assert latency("yrd", "nx") == (Decimal("24.300"), "estimated")
    assert latency("nx", "yrd") == (Decimal("24.300"), "estimated")
    assert latency("gba", "jjj") == (Decimal("26.700"), "estimated")
    assert latency("cy", "gz") == (Decimal("7.700"), "estimated")
    # Zhangjiakou–Horinger is ~260 km: 3.9 ms by distance, floored at the same-hub tier.
    assert latency("jjj", "nmg") == (Decimal("5.000"), "estimated")
    assert latency("ext", "nx") == (Decimal("20.000"), "policy")
    assert HubLatency.objects.count() == 81


def test_the_method_is_two_way_fibre_time_over_the_stated_route_factor():
    km = catalog.great_circle_km(catalog.HUB_SITES["yrd"][1:], catalog.HUB_SITES["nx"][1:])
    assert round(km, 1) == 1621.4
    # 2 × 1621.4 km × 1.5 × 5 µs = 24.321 ms → 24.3
    assert hub_latency_seed("yrd", "nx") == (Decimal("24.3"), "estimated")


def test_a_latency_budget_now_separates_near_hubs_from_far_ones():
    under_20_ms = set(
        HubLatency.objects.filter(source__code="yrd", latency_ms__lt=20).values_list(
            "target__code", flat=True
        )
    )
    assert under_20_ms == {"yrd", "gba", "jjj", "nmg"}


def test_reloading_refreshes_seeded_rows_and_never_a_measurement():
    measured_at = datetime(2026, 11, 20, 8, tzinfo=UTC)
    HubLatency.objects.filter(source__code="yrd", target__code="nx").update(
        latency_ms=Decimal("31.5"), origin="measured", measured_at=measured_at
    )
    HubLatency.objects.filter(source__code="yrd", target__code="gba").update(
        latency_ms=Decimal("20"), origin="policy"
    )

    load_reference_data(django_apps)
    load_reference_data(django_apps)

    assert latency("yrd", "nx") == (Decimal("31.500"), "measured")
    assert latency("yrd", "gba") == (Decimal("15.300"), "estimated")


def measurement(source: str, target: str, ms: str = "22.5") -> dict[str, object]:
    return {"source": source, "target": target, "latency_ms": ms, "measured_at": "2026-11-21T10:00:00Z"}


def test_an_operator_reports_latencies_from_the_hubs_it_runs_clusters_in(api, operator):
    make_cluster(operator=operator, hub="nx")

    response = api.post(
        "/api/v1/hub-latencies/measurements",
        {"measurements": [measurement("nx", "yrd")], "symmetric": False},
        format="json",
    )

    assert response.status_code == 200, response.json()
    assert latency("nx", "yrd") == (Decimal("22.500"), "measured")
    assert latency("yrd", "nx") == (Decimal("24.300"), "estimated")


def test_an_operator_cannot_report_from_a_hub_it_does_not_run(api, operator):
    make_cluster(operator=operator, hub="nx")

    response = api.post(
        "/api/v1/hub-latencies/measurements",
        {"measurements": [measurement("nx", "yrd"), measurement("gba", "yrd")]},
        format="json",
    )

    assert response.status_code == 403
    assert response.json()["code"] == "latency_source_not_operated"
    assert latency("nx", "yrd") == (Decimal("24.300"), "estimated")
    assert latency("gba", "yrd") == (Decimal("15.300"), "estimated")


def test_a_buyer_cannot_report_latencies(token_client):
    response = token_client(BuyerFactory(slug="acme")).post(
        "/api/v1/hub-latencies/measurements", {"measurements": [measurement("nx", "yrd")]}, format="json"
    )

    assert response.status_code == 403
    assert response.json()["code"] == "not_an_operator"


def test_the_estimates_are_checked_against_caicts_published_aggregates():
    located = list(catalog.HUB_SITES)
    pairs = [(a, b) for i, a in enumerate(located) for b in located[i + 1 :]]
    one_way = [hub_latency_seed(a, b)[0] / 2 for a, b in pairs]
    assert len(pairs) == 28
    mean = (sum(one_way) / len(one_way)).quantize(Decimal("0.1"))
    published = catalog.PUBLISHED_HUB_LATENCY
    # The seeded estimates are no more pessimistic than the measured optical layer (mean 9.7 ms one-way).
    assert mean == Decimal("8.6") < published["optical_one_way_mean_ms"]
    # CAICT's figures are one-way: the longest cluster pair cannot make 17.1 ms round trip in fibre.
    km = catalog.great_circle_km(catalog.HUB_SITES["jjj"][1:], catalog.HUB_SITES["gba"][1:])
    fibre_round_trip_ms = Decimal(str(round(2 * km, 1))) * catalog.FIBRE_US_PER_KM / 1000
    assert fibre_round_trip_ms == Decimal("17.7865") > published["optical_one_way_max_ms"]
    assert "信通院" in catalog.PUBLISHED_HUB_LATENCY_SOURCE
