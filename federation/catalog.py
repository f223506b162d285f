"""Reference data the platform ships with: the hubs, the policy latency tiers, the first standard-card
definition and the accelerator catalog. Loaded by a data migration (so production has it too) and kept
here, importable, so tests and the demo can refer to the same figures.

Accelerator figures are *dense* FP16 tensor TFLOPS (no structured sparsity, FP32 accumulate), memory in
GB and memory bandwidth in GB/s, from the vendors' published datasheets unless ``source`` says otherwise.
``spec_status`` says how far to trust them: ``published`` (the chip vendor's own datasheet), ``reported``
(published by others, e.g. the server vendors that ship the chip, not by the chip vendor) or ``unknown``
(no public figure: the FP16 figure is NULL; we do not invent numbers). An alias may belong to several
models (bare "H100" is an SXM or a PCIe part): federation.selectors.accelerator_resolve refuses it as
ambiguous and lists the candidates.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

HUBS: list[dict[str, object]] = [
    {"code": "jjj", "name": "Beijing-Tianjin-Hebei", "name_zh": "京津冀", "region": "east"},
    {"code": "yrd", "name": "Yangtze River Delta", "name_zh": "长三角", "region": "east"},
    {
        "code": "gba",
        "name": "Guangdong-Hong Kong-Macao Greater Bay Area",
        "name_zh": "粤港澳大湾区",
        "region": "east",
    },
    {"code": "cy", "name": "Chengdu-Chongqing", "name_zh": "成渝", "region": "east"},
    {"code": "nmg", "name": "Inner Mongolia", "name_zh": "内蒙古", "region": "west"},
    {"code": "gz", "name": "Guizhou", "name_zh": "贵州", "region": "west"},
    {"code": "gs", "name": "Gansu", "name_zh": "甘肃", "region": "west"},
    {"code": "nx", "name": "Ningxia", "name_zh": "宁夏", "region": "west"},
    {"code": "ext", "name": "Outside the national hubs", "name_zh": "其他", "region": "other"},
]

# Policy tiers of the national computing network: 1 ms inside a city, 5 ms from a cluster to nearby
# cities, 20 ms between hubs. A hub spans several cities, so hub→same hub is seeded with the 5 ms policy
# tier (origin "policy"); ``ext`` has no location, so its pairs keep the 20 ms between-hubs tier.
LATENCY_SAME_HUB_MS = Decimal("5")
LATENCY_BETWEEN_HUBS_MS = Decimal("20")

# No published per-pair hub-to-hub measurement was found (searched: CAICT/信通院 算力网络 reports and
# briefs, "东数西算 时延" targets, carriers' figures for Zhongwei, Qingyang, Wuhu, Horinger, Gui'an, Shaoguan),
# so every pair between two located hubs is seeded with an *estimate* (origin "estimated"), replaced by
# measurements posted through the API. What is published is aggregate (PUBLISHED_HUB_LATENCY below), and
# it is the check on the method:
#   round trip = 2 × great-circle distance × ROUTE_FACTOR × FIBRE_US_PER_KM
# Light in fibre covers ~1 km in 5 µs (refractive index ~1.47); fibre routes are longer than the great
# circle, taken here as 1.5× (a common rule of thumb for long-haul terrestrial routes, not a measurement);
# switching and queueing are not counted, so real round trips will be somewhat higher. An estimate is never
# below the same-hub tier (two neighbouring hubs, e.g. Zhangjiakou and Horinger, are not taken to be nearer
# than a hub is to itself), so a buyer's home hub is never ranked behind its neighbour.
#
# CAICT's brief on the first quarter of 2024 (中国信通院技术与标准研究所 with the three carriers, 2024年一季度
# 我国算力网络质量监测工作简报, as reprinted by fromgeek.com and idcdaohang.com): between the cities of the
# national hubs' clusters the optical-layer latency is under 20 ms, mean 9.7 ms, max 17.1 ms; the IP private
# network's best mean 14.6 ms, max 23.9 ms; the public Internet's best mean 16.7 ms, max 28.7 ms. The
# per-pair figures are in a chart that was not available as text. These are one-way figures: the longest
# pair (Zhangjiakou–Shaoguan, ~1,780 km of great circle) needs ≥ 17.8 ms round trip in fibre, more than the
# 17.1 ms maximum. Half the seeded round trips average 8.6 ms over the 28 located pairs, under the 9.7 ms
# optical mean and well under the IP layers' means: the estimates are, if anything, optimistic.
PUBLISHED_HUB_LATENCY: dict[str, Decimal] = {
    "optical_one_way_mean_ms": Decimal("9.7"),
    "optical_one_way_max_ms": Decimal("17.1"),
    "ip_private_best_one_way_mean_ms": Decimal("14.6"),
    "ip_private_best_one_way_max_ms": Decimal("23.9"),
}
PUBLISHED_HUB_LATENCY_SOURCE = (
    "CAICT (中国信通院) 2024 Q1 算力网络质量监测工作简报: between hub cluster cities, optical layer mean "
    "9.7 ms, max 17.1 ms; IP private network best mean 14.6 ms, max 23.9 ms (aggregates, one-way)."
)
FIBRE_US_PER_KM = Decimal("5")
ROUTE_FACTOR = Decimal("1.5")
EARTH_RADIUS_KM = 6371.0
# Where each hub's distance is measured from: the national hub's designated data-centre cluster (the
# 2022 East Data West Computing plan), approximate city coordinates (latitude, longitude) in degrees.
# Chengdu-Chongqing has two clusters (Tianfu, Chongqing); Tianfu (Chengdu) stands for the hub.
HUB_SITES: dict[str, tuple[str, float, float]] = {
    "jjj": ("Zhangjiakou cluster", 40.77, 114.88),
    "yrd": ("Yangtze River Delta demonstration zone cluster (Qingpu, Shanghai)", 31.15, 121.12),
    "gba": ("Shaoguan cluster", 24.81, 113.60),
    "cy": ("Tianfu cluster (Chengdu)", 30.57, 104.07),
    "nmg": ("Horinger cluster (Hohhot)", 40.38, 111.82),
    "gz": ("Gui'an cluster", 26.43, 106.40),
    "gs": ("Qingyang cluster", 35.71, 107.64),
    "nx": ("Zhongwei cluster", 37.50, 105.19),
}


def great_circle_km(a: tuple[float, float], b: tuple[float, float]) -> float:
    """Haversine distance in km between two (latitude, longitude) points in degrees."""
    lat1, lon1, lat2, lon2 = map(math.radians, (*a, *b))
    h = math.sin((lat2 - lat1) / 2) ** 2 + math.cos(lat1) * math.cos(lat2) * math.sin((lon2 - lon1) / 2) ** 2
    return 2 * EARTH_RADIUS_KM * math.asin(math.sqrt(h))


def hub_latency_seed(source: str, target: str) -> tuple[Decimal, str]:
    """The seeded round-trip latency (ms) of ``source``→``target`` and its origin ("policy" or
    "estimated"); see the comments above for the method."""
    if source == target:
        return LATENCY_SAME_HUB_MS, "policy"
    if source not in HUB_SITES or target not in HUB_SITES:
        return LATENCY_BETWEEN_HUBS_MS, "policy"
    km = Decimal(str(round(great_circle_km(HUB_SITES[source][1:], HUB_SITES[target][1:]), 1)))
    round_trip_us = 2 * km * ROUTE_FACTOR * FIBRE_US_PER_KM
    return max((round_trip_us / 1000).quantize(Decimal("0.1")), LATENCY_SAME_HUB_MS), "estimated"


STANDARD_CARD_V1_TFLOPS = Decimal("400")

_NV = "NVIDIA datasheet"
ACCELERATORS: list[dict[str, object]] = [
    # NVIDIA data-centre
    {
        "slug": "nvidia-a100-sxm4-80gb",
        "vendor": "NVIDIA",
        "model": "A100 SXM4 80GB",
        # Bare "A100" and "A100-80G" name both form factors: the resolver refuses them as ambiguous.
        "aliases": ["A100", "A100-SXM4-80GB", "A100-80G", "A100 SXM4 80GB"],
        "tflops": "312",
        "memory_gb": "80",
        "bandwidth": "2039",
        "interconnect": "NVLink 3, 600 GB/s",
        "fabric": "nvlink",
        "source": "NVIDIA A100 Tensor Core GPU datasheet: FP16 Tensor Core 624 TFLOPS with sparsity (312 dense), A100 80GB SXM column",
    },
    {
        "slug": "nvidia-a800-sxm4-80gb",
        "vendor": "NVIDIA",
        "model": "A800 SXM4 80GB",
        "aliases": ["A800", "A800-SXM4-80GB", "A800-80G", "A800 SXM4 80GB"],
        "tflops": "312",
        "memory_gb": "80",
        "bandwidth": "2039",
        "interconnect": "NVLink 3, 400 GB/s",
        "fabric": "nvlink",
        "source": "NVIDIA A800 SXM4 80GB datasheet: FP16 Tensor Core 624 TFLOPS with sparsity (312 dense)",
    },
    {
        "slug": "nvidia-h100-sxm5-80gb",
        "vendor": "NVIDIA",
        "model": "H100 SXM5 80GB",
        "aliases": ["H100", "H100-SXM5-80GB", "H100-80G", "H100 SXM5 80GB"],
        "tflops": "989.4",
        "memory_gb": "80",
        "bandwidth": "3350",
        "interconnect": "NVLink 4, 900 GB/s",
        "fabric": "nvlink",
        "source": "NVIDIA H100 Tensor Core GPU datasheet: FP16 Tensor Core 1,979 TFLOPS with sparsity (989.4 dense), H100 SXM column",
    },
    {
        "slug": "nvidia-h800-sxm5-80gb",
        "vendor": "NVIDIA",
        "model": "H800 SXM5 80GB",
        "aliases": ["H800", "H800-SXM5-80GB", "H800-80G", "H800 SXM5 80GB"],
        "tflops": "989.4",
        "memory_gb": "80",
        "bandwidth": "3350",
        "interconnect": "NVLink 4, 400 GB/s",
        "fabric": "nvlink",
        "source": "NVIDIA H800 SXM5 80GB datasheet: FP16 Tensor Core 1,979 TFLOPS with sparsity (989.4 dense)",
    },
    # PCIe cards of the same chips. NVIDIA's datasheets quote FP16 Tensor throughput *with sparsity*; the
    # dense figure used here is half of it, the same convention as the SXM entries above.
    {
        "slug": "nvidia-a100-pcie-80gb",
        "vendor": "NVIDIA",
        "model": "A100 PCIe 80GB",
        "aliases": ["A100", "A100-80G", "A100-PCIE-80GB", "A100 PCIe 80GB"],
        "tflops": "312",
        "memory_gb": "80",
        "bandwidth": "1935",
        "interconnect": "NVLink bridge (2 GPUs), 600 GB/s; PCIe Gen4 x16",
        "fabric": "pcie",
        "source": "NVIDIA A100 Tensor Core GPU datasheet: FP16 Tensor Core 624 TFLOPS with sparsity "
        "(312 dense), A100 80GB PCIe column, 1,935 GB/s",
    },
    {
        "slug": "nvidia-a800-pcie-80gb",
        "vendor": "NVIDIA",
        "model": "A800 PCIe 80GB",
        "aliases": ["A800", "A800-80G", "A800-PCIE-80GB", "A800 PCIe 80GB"],
        "tflops": "312",
        "memory_gb": "80",
        "bandwidth": "1935",
        "interconnect": "NVLink bridge (2 GPUs), 400 GB/s; PCIe Gen4 x16",
        "fabric": "pcie",
        "source": "NVIDIA A800 PCIe 80GB datasheet: FP16 Tensor Core 624 TFLOPS with sparsity (312 dense), "
        "1,935 GB/s",
    },
    {
        "slug": "nvidia-h100-pcie-80gb",
        "vendor": "NVIDIA",
        "model": "H100 PCIe 80GB",
        "aliases": ["H100", "H100-80G", "H100-PCIE-80GB", "H100 PCIe 80GB"],
        "tflops": "756.5",
        "memory_gb": "80",
        "bandwidth": "2000",
        "interconnect": "NVLink bridge (2 GPUs), 600 GB/s; PCIe Gen5 x16",
        "fabric": "pcie",
        "source": "NVIDIA H100 Tensor Core GPU datasheet: FP16 Tensor Core 1,513 TFLOPS with sparsity "
        "(756.5 dense), H100 PCIe column, 2 TB/s",
    },
    {
        "slug": "nvidia-h800-pcie-80gb",
        "vendor": "NVIDIA",
        "model": "H800 PCIe 80GB",
        "aliases": ["H800", "H800-80G", "H800-PCIE-80GB", "H800 PCIe 80GB"],
        "tflops": "756.5",
        "memory_gb": "80",
        "bandwidth": "2000",
        "interconnect": "NVLink bridge (2 GPUs), 400 GB/s; PCIe Gen5 x16",
        "fabric": "pcie",
        "source": "NVIDIA H800 PCIe 80GB datasheet: FP16 Tensor Core 1,513 TFLOPS with sparsity "
        "(756.5 dense), 2 TB/s",
    },
    {
        "slug": "nvidia-h20",
        "vendor": "NVIDIA",
        "model": "H20 96GB",
        "aliases": ["H20", "H20-96G"],
        "tflops": "148",
        "memory_gb": "96",
        "bandwidth": "4000",
        "interconnect": "NVLink 4, 900 GB/s",
        "fabric": "nvlink",
        "source": _NV,
    },
    {
        "slug": "nvidia-h200-sxm-141gb",
        "vendor": "NVIDIA",
        "model": "H200 SXM 141GB",
        "aliases": ["H200", "H200-SXM-141GB"],
        "tflops": "989.4",
        "memory_gb": "141",
        "bandwidth": "4800",
        "interconnect": "NVLink 4, 900 GB/s",
        "fabric": "nvlink",
        "source": _NV,
    },
    {
        "slug": "nvidia-l20",
        "vendor": "NVIDIA",
        "model": "L20 48GB",
        "aliases": ["L20"],
        "tflops": "119.5",
        "memory_gb": "48",
        "bandwidth": "864",
        "interconnect": "PCIe Gen4 x16",
        "fabric": "pcie",
        "source": _NV,
    },
    {
        "slug": "nvidia-l40s",
        "vendor": "NVIDIA",
        "model": "L40S 48GB",
        "aliases": ["L40S"],
        "tflops": "362.05",
        "memory_gb": "48",
        "bandwidth": "864",
        "interconnect": "PCIe Gen4 x16",
        "fabric": "pcie",
        "source": _NV,
    },
    {
        "slug": "nvidia-a10",
        "vendor": "NVIDIA",
        "model": "A10 24GB",
        "aliases": ["A10"],
        "tflops": "125",
        "memory_gb": "24",
        "bandwidth": "600",
        "interconnect": "PCIe Gen4 x16",
        "fabric": "pcie",
        "source": _NV,
    },
    {
        "slug": "nvidia-rtx-4090",
        "vendor": "NVIDIA",
        "model": "GeForce RTX 4090",
        "aliases": ["RTX4090", "4090", "RTX-4090"],
        "tflops": "165.2",
        "memory_gb": "24",
        "bandwidth": "1008",
        "interconnect": "PCIe Gen4 x16",
        "fabric": "pcie",
        "source": "NVIDIA Ada Lovelace architecture whitepaper (FP16 tensor, FP32 accumulate, dense)",
    },
    # Older NVIDIA generations still common in fleets (e.g. the Alibaba openb trace).
    {
        "slug": "nvidia-v100-sxm2-32gb",
        "vendor": "NVIDIA",
        "model": "V100 SXM2 32GB",
        "aliases": ["V100M32", "V100-32G", "V100-SXM2-32GB"],
        "tflops": "125",
        "memory_gb": "32",
        "bandwidth": "900",
        "interconnect": "NVLink 2, 300 GB/s",
        "fabric": "nvlink",
        "source": _NV,
    },
    {
        "slug": "nvidia-v100-sxm2-16gb",
        "vendor": "NVIDIA",
        "model": "V100 SXM2 16GB",
        "aliases": ["V100M16", "V100-16G", "V100-SXM2-16GB"],
        "tflops": "125",
        "memory_gb": "16",
        "bandwidth": "900",
        "interconnect": "NVLink 2, 300 GB/s",
        "fabric": "nvlink",
        "source": _NV,
    },
    {
        "slug": "nvidia-t4",
        "vendor": "NVIDIA",
        "model": "T4 16GB",
        "aliases": ["T4"],
        "tflops": "65",
        "memory_gb": "16",
        "bandwidth": "320",
        "interconnect": "PCIe Gen3 x16",
        "fabric": "pcie",
        "source": _NV,
    },
    {
        "slug": "nvidia-p100-16gb",
        "vendor": "NVIDIA",
        "model": "Tesla P100 16GB",
        "aliases": ["P100"],
        "tflops": "18.7",
        "memory_gb": "16",
        "bandwidth": "732",
        "interconnect": "PCIe Gen3 x16",
        "fabric": "pcie",
        "source": "NVIDIA Tesla P100 datasheet (PCIe; FP16 without tensor cores)",
    },
    # Huawei Ascend: Huawei publishes the Atlas 800T A2 per-NPU figure (313 TFLOPS FP16), which server
    # vendors attribute to the 910B3 bin; Huawei publishes no per-bin figures, so the other bins' figures are
    # as reported by the server vendors that ship them: spec_status "reported", not "published". A bare
    # "910B" names any of the four bins, so it is an alias of each (the resolver refuses it as ambiguous).
    {
        "slug": "huawei-ascend-910b1",
        "vendor": "Huawei",
        "model": "Ascend 910B1",
        "aliases": ["910B1", "Ascend910B1", "910B"],
        "status": "reported",
        "tflops": "414",
        "memory_gb": "64",
        "bandwidth": "1600",
        "interconnect": "HCCS, 392 GB/s",
        "fabric": "hccs",
        "source": "server-vendor specifications (Huawei does not publish per-bin figures)",
    },
    {
        "slug": "huawei-ascend-910b2",
        "vendor": "Huawei",
        "model": "Ascend 910B2",
        "aliases": ["910B2", "Ascend910B2", "910B"],
        "status": "reported",
        "tflops": "376",
        "memory_gb": "64",
        "bandwidth": "1600",
        "interconnect": "HCCS, 392 GB/s",
        "fabric": "hccs",
        "source": "server-vendor specifications (Huawei does not publish per-bin figures)",
    },
    {
        "slug": "huawei-ascend-910b3",
        "vendor": "Huawei",
        "model": "Ascend 910B3",
        "aliases": ["910B3", "Ascend910B3", "910B"],
        "status": "reported",
        "tflops": "313",
        "memory_gb": "64",
        "bandwidth": "1600",
        "interconnect": "HCCS, 392 GB/s",
        "fabric": "hccs",
        "source": "Huawei Atlas 800T A2 datasheet (313 TFLOPS FP16 per NPU), attributed to the 910B3 bin by "
        "server vendors (Huawei does not publish per-bin figures)",
    },
    {
        "slug": "huawei-ascend-910b4",
        "vendor": "Huawei",
        "model": "Ascend 910B4",
        "aliases": ["910B4", "Ascend910B4", "910B"],
        "status": "reported",
        "tflops": "280",
        "memory_gb": "32",
        "bandwidth": "800",
        "interconnect": "HCCS, 392 GB/s",
        "fabric": "hccs",
        "source": "server-vendor specifications (Huawei does not publish per-bin figures)",
    },
    {
        "slug": "huawei-ascend-910c",
        "vendor": "Huawei",
        "model": "Ascend 910C",
        "aliases": ["910C", "Ascend910C"],
        "status": "unknown",
        "tflops": None,
        "memory_gb": None,
        "bandwidth": None,
        "interconnect": "HCCS",
        "fabric": "hccs",
        "source": "no vendor datasheet published; press estimates only, so figures are not recorded",
    },
    # Other domestic accelerators
    {
        "slug": "cambricon-mlu370-x8",
        "vendor": "Cambricon",
        "model": "MLU370-X8",
        "aliases": ["MLU370-X8", "MLU370"],
        "tflops": "96",
        "memory_gb": "48",
        "bandwidth": "614.4",
        "interconnect": "MLU-Link, 200 GB/s",
        "fabric": "pcie",
        "source": "Cambricon MLU370-X8 product page",
    },
    {
        "slug": "cambricon-mlu590",
        "vendor": "Cambricon",
        "model": "MLU590",
        "aliases": ["MLU590", "MLU590-M9"],
        "status": "unknown",
        "tflops": None,
        "memory_gb": None,
        "bandwidth": None,
        "interconnect": "MLU-Link",
        "fabric": "pcie",
        "source": "Cambricon publishes no datasheet for the MLU590 (press figures only), so none are recorded",
    },
    {
        "slug": "hygon-dcu-k100",
        "vendor": "Hygon",
        "model": "DCU K100",
        "aliases": ["K100", "DCU-K100"],
        "status": "unknown",
        "tflops": None,
        "memory_gb": None,
        "bandwidth": None,
        "interconnect": "xGMI",
        "fabric": "pcie",
        "source": "Hygon publishes no dense FP16 figure for the K100",
    },
    {
        "slug": "moorethreads-mtt-s4000",
        "vendor": "Moore Threads",
        "model": "MTT S4000",
        "aliases": ["S4000", "MTT-S4000"],
        "tflops": "100",
        "memory_gb": "48",
        "bandwidth": "768",
        "interconnect": "MTLink, 240 GB/s",
        "fabric": "pcie",
        "source": "Moore Threads MTT S4000 product page",
    },
    {
        "slug": "biren-br104",
        "vendor": "Biren",
        "model": "BR104",
        "aliases": ["BR104"],
        "status": "unknown",
        "tflops": None,
        "memory_gb": "32",
        "bandwidth": "819",
        "interconnect": "PCIe Gen5 x16",
        "fabric": "pcie",
        "source": "Biren publishes BF16 but not dense FP16 throughput for the BR104",
    },
    {
        "slug": "biren-br100",
        "vendor": "Biren",
        "model": "BR100",
        "aliases": ["BR100"],
        "status": "unknown",
        "tflops": None,
        "memory_gb": None,
        "bandwidth": None,
        "interconnect": "BLink",
        "fabric": "pcie",
        "source": "Biren's BR100 announcement (Hot Chips 34, 2022) gives BF16 peak throughput, not dense FP16; "
        "no datasheet figures are recorded",
    },
    {
        "slug": "kunlunxin-p800",
        "vendor": "Kunlunxin",
        "model": "P800",
        "aliases": ["P800", "Kunlun-P800"],
        "status": "unknown",
        "tflops": None,
        "memory_gb": None,
        "bandwidth": None,
        "interconnect": "XPU Link",
        "fabric": "pcie",
        "source": "Kunlunxin publishes no dense FP16 figure for the P800",
    },
]


def accelerator_rows() -> list[dict[str, object]]:
    """ACCELERATORS as model field values."""
    rows = []
    for spec in ACCELERATORS:

        def dec(key: str, spec: dict[str, object] = spec) -> Decimal | None:
            value = spec.get(key)
            return None if value is None else Decimal(str(value))

        rows.append(
            {
                "slug": spec["slug"],
                "vendor": spec["vendor"],
                "model": spec["model"],
                "aliases": spec["aliases"],
                "spec_status": spec.get("status", "published"),
                "dense_fp16_tflops": dec("tflops"),
                "memory_gb": dec("memory_gb"),
                "memory_bandwidth_gbps": dec("bandwidth"),
                "interconnect": spec["interconnect"],
                "default_fabric": spec["fabric"],
                "source": spec["source"],
            }
        )
    return rows


def load_reference_data(apps: Any) -> None:
    """Create or refresh the reference rows. ``apps`` is a migration's app registry, or django.apps.apps
    (tests that flush the database reload it this way). Idempotent."""
    Hub = apps.get_model("federation", "Hub")
    HubLatency = apps.get_model("federation", "HubLatency")
    StandardCard = apps.get_model("federation", "StandardCard")
    Accelerator = apps.get_model("federation", "Accelerator")

    hubs = []
    for order, spec in enumerate(HUBS):
        hub, _ = Hub.objects.update_or_create(code=spec["code"], defaults={**spec, "sort_order": order})
        hubs.append(hub)
    # Migration 0002 runs this with its historical models, before 0005 knew the "estimated" origin: there
    # the between-hubs pairs get the 20 ms policy tier, and 0005 (running this again) replaces them.
    origins = {value for value, _ in HubLatency._meta.get_field("origin").choices}
    for source in hubs:
        for target in hubs:
            latency, origin = hub_latency_seed(source.code, target.code)
            if origin not in origins:
                latency, origin = LATENCY_BETWEEN_HUBS_MS, "policy"
            row, created = HubLatency.objects.get_or_create(
                source=source, target=target, defaults={"latency_ms": latency, "origin": origin}
            )
            # A seed row never measured follows the seed; a measurement is never overwritten.
            if not created and row.measured_at is None and (row.latency_ms, row.origin) != (latency, origin):
                row.latency_ms, row.origin = latency, origin
                row.save(update_fields=["latency_ms", "origin", "updated_at"])
    StandardCard.objects.get_or_create(
        version=1,
        defaults={
            "dense_fp16_tflops": STANDARD_CARD_V1_TFLOPS,
            "effective_from": datetime(2026, 1, 1, tzinfo=UTC),
            "note": "400 TFLOPS dense FP16 (platform launch definition)",
        },
    )
    for row in accelerator_rows():
        Accelerator.objects.update_or_create(slug=row["slug"], defaults=row)
