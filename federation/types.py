"""Frozen values that cross federation's boundary (service inputs, resolution results)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal


@dataclass(frozen=True)
class IslandSpec:
    name: str
    cards: int
    fabric: str


@dataclass(frozen=True)
class IslandReport:
    """One island's line in a heartbeat: K2 (free) cards and cards out of service."""

    name: str
    available_cards: int
    unhealthy_cards: int = 0


@dataclass(frozen=True)
class HeartbeatResult:
    cluster_cpi: str
    status: str
    applied: bool
    detail: str = ""


@dataclass(frozen=True)
class LatencyMeasurement:
    source: str
    target: str
    latency_ms: Decimal
    measured_at: datetime


@dataclass(frozen=True)
class OperatorRef:
    """An operator as a resolution names it."""

    slug: str
    name: str


@dataclass(frozen=True)
class ChipSpec:
    slug: str
    vendor: str
    model: str
    spec_status: str
    dense_fp16_tflops: Decimal | None
    memory_gb: Decimal | None
    memory_bandwidth_gbps: Decimal | None
    interconnect: str
    standard_card_factor: Decimal | None


@dataclass(frozen=True)
class IslandDescription:
    cpi: str
    name: str
    fabric: str
    cards: int
    available_cards: int
    unhealthy_cards: int
    standard_cards: Decimal | None
    reported_at: datetime | None


@dataclass(frozen=True)
class ClusterDescription:
    """The full resource description of a cluster (resolution of a cluster or island identifier)."""

    cpi: str
    operator: str
    operator_name: str
    hub: str
    site: str
    chip: ChipSpec
    status: str
    health: str
    total_cards: int
    available_cards: int
    total_standard_cards: Decimal | None
    available_standard_cards: Decimal | None
    last_heartbeat_at: datetime | None
    endpoint_url: str | None
    islands: list[IslandDescription] = field(default_factory=list)
