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
    # A job pinned to one cluster: only that cluster's islands are considered (None: any cluster).
    only_cluster: int | None = None
    # The lowest reliability score accepted, in percent (None: any).
    min_reliability: Decimal | None = None


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
    # When the matcher groups identical islands into one offer: the other islands of the cluster that can
    # take the same placement (same start, cards, price and latency), (island_id, cards) in id order, and
    # their CPIs. Accepting the offer takes the first of allocation + alternatives still free.
    alternatives: tuple[tuple[int, int], ...] = ()
    alternative_cpis: tuple[str, ...] = ()
    # The earliest start any island of the offer could take the job at (``earliest_feasible_cost`` is the
    # cost there): what "starting at the earliest possible time" means for this offer.
    earliest_feasible_start_at: datetime | None = None
    # The cluster's reliability score (percent; the platform's prior when ``reliability_prior``: a new
    # cluster), its interruptions per 1,000 card-hours sold (None when nothing was sold), and the SLA
    # credit its price card would give at that availability (CNY, to the fen): ``cost`` less it is what
    # the ``adjusted`` preference ranks by.
    reliability_percent: Decimal | None = None
    reliability_prior: bool = True
    interruptions_per_1000_card_hours: Decimal | None = None
    expected_credit: Decimal = Decimal("0.00")

    @property
    def adjusted_cost(self) -> Decimal:
        """The cost less the expected SLA credit."""
        return self.cost - self.expected_credit

    @property
    def islands_available(self) -> int:
        """Islands that can take this offer: 1 + the alternatives (a spanning placement is one offer)."""
        return 1 + len(self.alternatives)


# What a relaxation may loosen, in the order the API declares them (the answer's ``kind``).
RELAXATION_KINDS = (
    "cluster",
    "latency",
    "chip",
    "memory",
    "fabric",
    "reliability",
    "price",
    "window",
    "gang",
    "cards",
)


@dataclass(frozen=True)
class Relaxation:
    """The nearest change to a job that would produce a quote, found by re-running the matcher.

    ``kind`` is one of RELAXATION_KINDS; ``changes`` maps job fields to their relaxed values (as the API
    spells them, in strings or lists); the placement found with the change is summarised by its cluster,
    chip, start and cost."""

    kind: str
    changes: dict[str, object]
    cluster_cpi: str
    accelerator: str
    start_at: datetime
    cost: Decimal


@dataclass(frozen=True)
class MatchResult:
    placements: tuple[Placement, ...]
    rejections: dict[str, int]
    considered: int
    feasible: int
    window_start_at: datetime
    window_end_at: datetime
