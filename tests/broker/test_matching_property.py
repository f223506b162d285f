"""The matcher's sparse capacity arithmetic against a brute force over every (island, start, slot)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.catalog import Catalogue
from broker.matching import _blocked_starts, integrated_multiplier, match, window_of
from broker.types import JobSpec
from metering.selectors.tariffs import PriceCardRow
from metering.tariffs import PRESETS, tariff_compile

STEP = 900
NOW = datetime(2027, 3, 10, 1, 7, 13, tzinfo=UTC)  # not on a slot edge, on purpose
TARIFFS = {1: tariff_compile(PRESETS["cn-gd"].spec), 2: tariff_compile(PRESETS["cn-nx"].spec)}


def catalogue(capacities: list[int]) -> Catalogue:
    n = len(capacities)
    hubs = ["nx", "yrd"]
    return Catalogue(
        loaded_at=time.monotonic(),
        island_id=np.arange(1, n + 1),
        island_cpi=[f"cpi:op:yrd:c{i}:isl-01" for i in range(n)],
        island_cluster=np.arange(n),
        island_capacity=np.array(capacities, dtype=np.int64),
        island_fabric=np.zeros(n, dtype=np.int64),
        cluster_id=np.arange(1, n + 1),
        cluster_cpi=[f"cpi:op:yrd:c{i}" for i in range(n)],
        cluster_operator=np.ones(n, dtype=np.int64),
        cluster_hub=np.ones(n, dtype=np.int64),
        cluster_status=["active"] * n,
        cluster_active=np.ones(n, dtype=bool),
        cluster_chip=np.zeros(n, dtype=np.int64),
        cluster_price=[PriceCardRow(i + 1, 1, Decimal("10"), 1 + i % 2, "t") for i in range(n)],
        cluster_rate=np.full(n, 10.0),
        cluster_tariff=np.array([1 + i % 2 for i in range(n)], dtype=np.int64),
        chip_slugs=["a800"],
        chip_tflops=[Decimal(312)],
        chip_tflops_f=np.array([312.0]),
        chip_memory_f=np.array([80.0]),
        chip_factor_e4=np.array([7800]),
        hub_codes=hubs,
        latency_ms=np.array([[5.0, 20.0], [20.0, 5.0]]),
        latency_dec={(i, j): Decimal("5" if i == j else "20") for i in range(2) for j in range(2)},
    )


holds_strategy = st.lists(
    st.tuples(
        st.integers(0, 3),  # island
        st.integers(-3600, 30 * 3600),  # start offset from now, seconds
        st.integers(60, 10 * 3600),  # length
        st.integers(1, 8),  # cards
    ),
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(
    capacities=st.lists(st.integers(1, 16), min_size=4, max_size=4),
    holds=holds_strategy,
    cards=st.integers(1, 10),
    duration=st.integers(600, 6 * 3600),
)
def test_feasible_starts_and_best_start_match_a_brute_force(
    capacities: list[int], holds: list[tuple[int, int, int, int]], cards: int, duration: int
) -> None:
    cat = catalogue(capacities)
    t0 = int(NOW.timestamp())
    spec = JobSpec(
        cards=cards,
        standard_cards=None,
        accelerators=(),
        min_fp16_tflops=None,
        min_memory_gb=None,
        fabrics=(),
        gang="island",
        origin_hub="yrd",
        latency_budget_ms=50,
        earliest_start_at=NOW,
        deadline_at=NOW + timedelta(hours=24),
        duration_seconds=duration,
        max_price_per_card_hour=None,
        preference="price",
    )
    arrays = (
        np.array([h[0] + 1 for h in holds], dtype=np.int64),
        np.array([t0 + h[1] for h in holds], dtype=np.int64),
        np.array([t0 + h[1] + h[2] for h in holds], dtype=np.int64),
        np.array([h[3] for h in holds], dtype=np.int64),
    )
    result = match(
        spec=spec, catalogue=cat, holds=arrays, now=NOW, step=STEP, limit=10, tariff_of=TARIFFS.__getitem__
    )
    window = window_of(spec, now=NOW, step=STEP)
    run = -(-duration // STEP)
    expected: dict[str, datetime] = {}
    candidates = np.array([i for i, capacity in enumerate(capacities) if capacity >= cards], dtype=np.int64)
    blocked = _blocked_starts(cat, arrays, window, candidates, np.full(4, cards, dtype=np.int64))
    for island, capacity in enumerate(capacities):
        values = integrated_multiplier(TARIFFS[1 + island % 2], window)
        best = None
        feasible = blocked.feasible(island) if blocked.has(island) else np.ones(window.starts, dtype=bool)
        for k in range(window.starts):
            fits = capacity >= cards
            for slot in range(k, k + run):
                lo, hi = window.t0 + slot * STEP, window.t0 + (slot + 1) * STEP
                used = sum(
                    c
                    for i, s, length, c in holds
                    if i == island
                    and _slot_floor(t0 + s, window.t0) < hi
                    and _slot_ceil(t0 + s + length, window.t0) > lo
                )
                if used > capacity - cards:
                    fits = False
                    break
            if capacity >= cards:
                assert bool(feasible[k]) == fits, (island, k)
            if fits and (best is None or values[k] < values[best]):
                best = k
        if best is not None:
            expected[cat.island_cpi[island]] = datetime.fromtimestamp(window.t0 + best * STEP, tz=UTC)
    assert {p.island_cpis[0]: p.start_at for p in result.placements} == expected
    assert result.feasible == len(expected)
    assert result.rejections["capacity"] == 4 - len(expected)


def _slot_floor(at: int, t0: int) -> int:
    return t0 + max((at - t0) // STEP, 0) * STEP


def _slot_ceil(at: int, t0: int) -> int:
    return t0 + max(-(-(at - t0) // STEP), 0) * STEP
