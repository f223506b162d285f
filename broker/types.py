"""Frozen values that cross the broker's boundary: a job's matching constraints and a placement."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal


@dataclass(frozen=True)
class JobSpec:
    """What the matcher needs of a job. Exactly one of ``cards`` / ``standard_cards`` is set."""

    cards: int | None
    standard_cards: Decimal | None
    accelerators: tuple[str, ...]
    min_fp16_tflops: Decimal | None
    min_memory_gb: Decimal | None
    fabrics: tuple[str, ...]
    gang: str  # "island" | "cluster"
    origin_hub: str
    latency_budget_ms: int
    earliest_start_at: datetime
    deadline_at: datetime
    duration_seconds: int
    max_price_per_card_hour: Decimal | None
    preference: str  # "price" | "latency" | "weighted"
    price_weight: Decimal = Decimal(1)
    exclude_clusters: frozenset[int] = field(default_factory=frozenset)


@dataclass(frozen=True)
class BandCost:
    band: str
    multiplier: Decimal
    card_seconds: int
    card_hours: Decimal
    cost: Decimal


@dataclass(frozen=True)
class Placement:
    """One feasible (island, start) — or (cluster, start) when spanning — with its exact cost."""

    cluster_id: int
    cluster_cpi: str
    operator_id: int
    hub: str
    accelerator: str
    allocation: tuple[tuple[int, int], ...]  # (island_id, cards)
    island_cpis: tuple[str, ...]
    cards: int
    start_at: datetime
    end_at: datetime
    price_card_id: int
    price_card_version: int
    rate_per_card_hour: Decimal
    tariff: str
    cost: Decimal
    bands: tuple[BandCost, ...]
    latency_ms: Decimal
    saving: Decimal
    earliest_feasible_cost: Decimal
    standard_card_factor: Decimal | None
    expected_draw: Decimal  # card-hours × multiplier of the chip's class
    expected_standard_draw: Decimal | None  # the same, in standard card-hours


@dataclass(frozen=True)
class MatchResult:
    placements: tuple[Placement, ...]
    rejections: dict[str, int]
    considered: int
    feasible: int
    window_start_at: datetime
    window_end_at: datetime
