"""The matcher's sparse capacity arithmetic against a brute force over every (island, start, slot),
including the cards an operator's heartbeat withholds until the report expires (K2)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from broker.catalog import Catalogue
from broker.matching import _blocked_starts, binding_reports, integrated_multiplier, match, window_of
from broker.types import JobSpec, MatchResult
from metering.selectors.tariffs import PriceCardRow
from metering.tariffs import PRESETS, tariff_compile

STEP = 900
NOW = datetime(2027, 3, 10, 1, 7, 13, tzinfo=UTC)  # not on a slot edge, on purpose
TARIFFS = {1: tariff_compile(PRESETS["cn-gd"].spec), 2: tariff_compile(PRESETS["cn-nx"].spec)}


def catalogue(capacities: list[int], reports: list[tuple[int, int]] | None = None) -> Catalogue:
    """One single-island cluster per capacity; ``reports``: (cards withheld, expiry) per island."""
    n = len(capacities)
    hubs = ["nx", "yrd"]
    reported = [i for i, (cards, _) in enumerate(reports or []) if cards > 0]
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
        withheld_island=np.array(reported, dtype=np.int64),
        withheld_cards=np.array([(reports or [])[i][0] for i in reported], dtype=np.int64),
        withheld_until=np.array([(reports or [])[i][1] for i in reported], dtype=np.int64),
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


def _spec(
    *, cards: int, duration: int, preference: str = "price", min_reliability: Decimal | None = None
) -> JobSpec:
    """An island-gang job for ``cards`` cards over ``duration`` seconds within the next 24 h."""
    return JobSpec(
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
        preference=preference,
        min_reliability=min_reliability,
    )


def _hold_arrays(holds: list[tuple[int, int, int, int]], t0: int) -> tuple[np.ndarray, ...]:
    """The hold book's arrays (island position + 1, start, end, cards) of (island, offset, length, cards)."""
    return (
        np.array([h[0] + 1 for h in holds], dtype=np.int64),
        np.array([t0 + h[1] for h in holds], dtype=np.int64),
        np.array([t0 + h[1] + h[2] for h in holds], dtype=np.int64),
        np.array([h[3] for h in holds], dtype=np.int64),
    )


def _bounds(arrays: tuple[np.ndarray, ...]) -> list[np.ndarray]:
    """Bounds by island id of what each island's holds occupy at once, as the hold book keeps them
    (broker.catalog.HoldBook.held): the sum of its holds' cards (the tightest the book gives), and that
    plus some slack on some islands (a book also counts holds outside the quote's window)."""
    island, _start, _end, cards = arrays
    size = int(island.max()) + 1 if len(island) else 0
    tight = np.bincount(island, weights=cards, minlength=size).astype(np.int64)
    return [tight, tight + np.arange(size) % 3]


def _match_alike_bounded(arrays: tuple[np.ndarray, ...], **kwargs: Any) -> MatchResult:
    """``match`` over the holds ``arrays``, after checking that it answers alike with the hold book's
    bound (which skips the islands it leaves room on) and without it, and from the holds as the hold book
    hands them over (``HoldBook.rows``: dead rows among the live ones, which ``alive`` tells apart)."""
    result = match(holds=arrays, **kwargs)
    for held in _bounds(arrays):
        assert match(holds=arrays, held=held, **kwargs) == result
    book, alive = _as_book(arrays)
    assert match(holds=book, alive=alive, **kwargs) == result
    for held in _bounds(arrays):
        assert match(holds=book, alive=alive, held=held, **kwargs) == result
    return result


def _as_book(arrays: tuple[np.ndarray, ...]) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """The holds ``arrays`` as rows of a hold book: each followed by a dead row (the same hold with more
    cards, as a released or replaced lease leaves it), and which rows are alive."""
    n = len(arrays[0])
    island, start, end, cards = arrays
    dead = (island, start - 900, end + 900, cards + 3)
    book = tuple(
        np.stack([live, gone], axis=1).reshape(2 * n) for live, gone in zip(arrays, dead, strict=True)
    )
    return book, np.tile([True, False], n)


reports_strategy = st.lists(
    st.tuples(
        st.integers(0, 10),  # cards the operator's report withholds (0: none)
        # Its expiry, seconds from now (≤ 0: expired); mostly within the first 15-minute slot, as with
        # the default settings (a report binds for 90 s), sometimes further.
        st.one_of(st.integers(-600, 900), st.integers(901, 3 * 900), st.integers(-600, 3 * 3600)),
    ),
    min_size=4,
    max_size=4,
)


@settings(max_examples=150, deadline=None)
@example(  # the report binds only the first step: 8 free cards from 00:15 on, 2 before
    capacities=[8, 8, 8, 8],
    holds=[],
    cards=8,
    duration=3600,
    reports=[(6, 60), (0, 0), (8, -1), (1, 2 * 3600)],
)
@example(  # a report reaching into the second slot blocks the first two starts, not just the first
    capacities=[8, 8, 8, 8],
    holds=[],
    cards=5,
    duration=600,
    reports=[(4, 1000), (0, 0), (0, 0), (0, 0)],
)
@given(
    capacities=st.lists(st.integers(1, 16), min_size=4, max_size=4),
    holds=holds_strategy,
    cards=st.integers(1, 10),
    duration=st.integers(600, 6 * 3600),
    reports=reports_strategy,
)
def test_feasible_starts_and_best_start_match_a_brute_force(
    capacities: list[int],
    holds: list[tuple[int, int, int, int]],
    cards: int,
    duration: int,
    reports: list[tuple[int, int]],
) -> None:
    t0 = int(NOW.timestamp())
    window = window_of(_spec(cards=cards, duration=duration), now=NOW, step=STEP)
    # Withheld cards are at most the island's capacity (the heartbeat's own check).
    reports = [
        (min(withheld, capacity), window.t0 + offset)
        for (withheld, offset), capacity in zip(reports, capacities, strict=True)
    ]
    cat = catalogue(capacities, reports)
    spec = _spec(cards=cards, duration=duration)
    arrays = _hold_arrays(holds, t0)
    result = _match_alike_bounded(
        arrays, spec=spec, catalogue=cat, now=NOW, step=STEP, limit=10, tariff_of=TARIFFS.__getitem__
    )
    run = -(-duration // STEP)
    expected: dict[str, datetime] = {}
    candidates = np.array([i for i, capacity in enumerate(capacities) if capacity >= cards], dtype=np.int64)
    blocked = _blocked_starts(
        cat,
        arrays,
        window,
        candidates,
        np.full(4, cards, dtype=np.int64),
        binding_reports(cat, window, np.ones(4, dtype=bool)),
    )
    for island, capacity in enumerate(capacities):
        values = integrated_multiplier(TARIFFS[1 + island % 2], window)
        best = None
        feasible = blocked.feasible(island) if blocked.has(island) else np.ones(window.starts, dtype=bool)
        withheld, expiry = reports[island]
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
                # Before the report expires the operator's figure rules (the slot is rounded outward).
                limit = capacity - withheld if lo < expiry else capacity
                if used > limit - cards:
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


def clustered_catalogue(
    islands_per_cluster: list[int],
    capacity: list[int],
    rates: list[int],
    reports: list[tuple[int, int]] | None = None,
    reliability_e3: list[int] | None = None,
    credit: list[str] | None = None,
) -> Catalogue:
    """Clusters of several islands (the matcher ranks them a cluster at a time), on two hubs; ``reports``:
    (cards withheld, expiry) per island, as in ``catalogue``; per cluster, its reliability score (percent
    × 1000) and the fraction of a cost its SLA credit is expected to be."""
    m = len(islands_per_cluster)
    island_cluster = np.repeat(np.arange(m), islands_per_cluster)
    n = len(island_cluster)
    reports = (reports or [])[:n]
    reported = [i for i, (cards, _) in enumerate(reports) if cards > 0]
    return Catalogue(
        loaded_at=time.monotonic(),
        island_id=np.arange(1, n + 1),
        island_cpi=[f"isl-{i}" for i in range(n)],
        island_cluster=island_cluster,
        island_capacity=np.array(capacity[:n], dtype=np.int64),
        island_fabric=np.zeros(n, dtype=np.int64),
        cluster_id=np.arange(1, m + 1),
        cluster_cpi=[f"c{i}" for i in range(m)],
        cluster_operator=np.ones(m, dtype=np.int64),
        cluster_hub=np.array([i % 2 for i in range(m)], dtype=np.int64),
        cluster_status=["active"] * m,
        cluster_active=np.ones(m, dtype=bool),
        cluster_chip=np.zeros(m, dtype=np.int64),
        cluster_price=[PriceCardRow(i + 1, 1, Decimal(rates[i]), 1 + i % 2, "t") for i in range(m)],
        cluster_rate=np.array([float(rates[i]) for i in range(m)]),
        cluster_tariff=np.array([1 + i % 2 for i in range(m)], dtype=np.int64),
        chip_slugs=["a800"],
        chip_tflops=[Decimal(312)],
        chip_tflops_f=np.array([312.0]),
        chip_memory_f=np.array([80.0]),
        chip_factor_e4=np.array([7800]),
        hub_codes=["nx", "yrd"],
        latency_ms=np.array([[5.0, 20.0], [20.0, 5.0]]),
        latency_dec={(i, j): Decimal("5" if i == j else "20") for i in range(2) for j in range(2)},
        withheld_island=np.array(reported, dtype=np.int64),
        withheld_cards=np.array([reports[i][0] for i in reported], dtype=np.int64),
        withheld_until=np.array([reports[i][1] for i in reported], dtype=np.int64),
        cluster_reliability_e3=np.array((reliability_e3 or [99_000] * m)[:m], dtype=np.int64),
        cluster_credit=[Decimal(f) for f in (credit or ["0"] * m)[:m]],
        cluster_credit_fraction=np.array([float(f) for f in (credit or ["0"] * m)[:m]], dtype=np.float64),
    )


# Per cluster: reliability scores (percent × 1000) around the minimums tried, and expected credit fractions.
reliability_strategy = st.lists(st.sampled_from([97_000, 99_000, 99_500, 99_900]), min_size=5, max_size=5)
credit_strategy = st.lists(st.sampled_from(["0", "0", "0.1", "0.25"]), min_size=5, max_size=5)
minimum_strategy = st.sampled_from([None, Decimal("99"), Decimal("99.5")])


def _rank_cost(cat: Catalogue, cluster: int, cards: int, value: float, preference: str) -> float:
    """What the ranking compares: the list cost, or for ``adjusted`` the cost less the expected credit."""
    rate = cat.cluster_rate[cluster]
    if preference == "adjusted":
        rate = rate * (1.0 - cat.cluster_credit_fraction[cluster])
    return float(rate * cards * value)


def _reliable(cat: Catalogue, cluster: int, minimum: Decimal | None) -> bool:
    return minimum is None or int(cat.cluster_reliability_e3[cluster]) >= int(minimum * 1000)


@settings(max_examples=300, deadline=None)
@example(  # the cheapest (valley) start of the only island is held: its next best start wins
    islands_per_cluster=[1],
    capacity=[8] * 20,
    rates=[10] * 5,
    holds=[(0, 14 * 3600, 9 * 3600, 8)],
    cards=8,
    duration=3600,
    preference="price",
    limit=1,
    reports=[(0, 0)] * 20,
    reliability=[99_000] * 5,
    credit=["0"] * 5,
    minimum=None,
)
@given(
    islands_per_cluster=st.lists(st.integers(1, 4), min_size=1, max_size=5),
    capacity=st.lists(st.integers(1, 16), min_size=20, max_size=20),
    rates=st.lists(st.sampled_from([8, 10, 10, 12]), min_size=5, max_size=5),
    holds=st.lists(
        st.tuples(
            st.integers(0, 19), st.integers(-3600, 24 * 3600), st.integers(60, 12 * 3600), st.integers(1, 8)
        ),
        max_size=40,
    ),
    cards=st.integers(1, 8),
    duration=st.integers(600, 6 * 3600),
    preference=st.sampled_from(["price", "latency", "adjusted"]),
    limit=st.integers(1, 6),
    reliability=reliability_strategy,
    credit=credit_strategy,
    minimum=minimum_strategy,
    reports=st.lists(
        st.tuples(
            st.integers(0, 8),
            st.one_of(st.integers(-600, 900), st.integers(901, 3 * 900), st.integers(-600, 2 * 3600)),
        ),
        min_size=20,
        max_size=20,
    ),
)
def test_ranking_by_cluster_matches_ranking_every_island(
    islands_per_cluster: list[int],
    capacity: list[int],
    rates: list[int],
    holds: list[tuple[int, int, int, int]],
    cards: int,
    duration: int,
    preference: str,
    limit: int,
    reports: list[tuple[int, int]],
    reliability: list[int],
    credit: list[str],
    minimum: Decimal | None,
) -> None:
    """The matcher ranks whole clusters first; the answer must be the ranking of every island on its own
    at its exact cheapest feasible start (ties: earliest start, then island id), heartbeat reports
    included (their withheld cards move the starts they block, as holds do). Clusters below the job's
    minimum reliability are rejected under ``reliability``; ``adjusted`` ranks by cost less the expected
    credit."""
    t0 = int(NOW.timestamp())
    reports = [(min(w, c), t0 + offset) for (w, offset), c in zip(reports, capacity, strict=True)]
    cat = clustered_catalogue(islands_per_cluster, capacity, rates, reports, reliability, credit)
    n = cat.size
    spec = _spec(cards=cards, duration=duration, preference=preference, min_reliability=minimum)
    holds = [(h[0] % n, *h[1:]) for h in holds]
    arrays = _hold_arrays(holds, t0)
    result = _match_alike_bounded(
        arrays, spec=spec, catalogue=cat, now=NOW, step=STEP, limit=limit, tariff_of=TARIFFS.__getitem__
    )
    window = window_of(spec, now=NOW, step=STEP)
    unreliable = [i for i in range(n) if not _reliable(cat, int(cat.island_cluster[i]), minimum)]
    candidates = np.array(
        [i for i in range(n) if capacity[i] >= cards and i not in unreliable], dtype=np.int64
    )
    blocked = _blocked_starts(
        cat,
        arrays,
        window,
        candidates,
        np.full(n, cards, dtype=np.int64),
        binding_reports(cat, window, np.ones(n, dtype=bool)),
    )
    rows = []  # (latency, cost, island, start) of every island at its exact best feasible start
    for island in candidates:
        cluster = int(cat.island_cluster[island])
        values = integrated_multiplier(TARIFFS[int(cat.cluster_tariff[cluster])], window)
        ok = blocked.feasible(island) if blocked.has(island) else np.ones(window.starts, dtype=bool)
        if not ok.any():
            continue
        k = int(np.argmin(np.where(ok, values, np.iinfo(np.int64).max)))
        cost = _rank_cost(cat, cluster, cards, float(values[k]), preference)
        latency = float(cat.latency_ms[1][cat.cluster_hub[cluster]])
        rows.append((latency, cost, int(island), k))
    primary = (lambda r: (r[0], r[1], r[2])) if preference == "latency" else (lambda r: (r[1], r[0], r[2]))
    expected = [
        (cat.island_cpi[r[2]], datetime.fromtimestamp(window.t0 + r[3] * STEP, tz=UTC))
        for r in sorted(rows, key=primary)[:limit]
    ]
    assert [(p.island_cpis[0], p.start_at) for p in result.placements] == expected
    assert result.feasible == len(rows)
    assert result.rejections["reliability"] == len(unreliable)
    assert result.rejections["capacity"] == n - len(unreliable) - len(rows)


@settings(max_examples=300, deadline=None)
@example(  # three identical islands of one cluster, one of them held at the valley: two offers
    islands_per_cluster=[3, 1],
    capacity=[8] * 20,
    rates=[10] * 5,
    holds=[(1, 14 * 3600, 9 * 3600, 8)],
    cards=8,
    duration=3600,
    preference="price",
    limit=3,
    reliability=[99_000] * 5,
    credit=["0"] * 5,
    minimum=None,
)
@example(  # the dearer cluster is first after its expected credit; the third is below the minimum
    islands_per_cluster=[2, 1, 1],
    capacity=[8] * 25,
    rates=[10, 12, 8, 10, 10],
    holds=[],
    cards=8,
    duration=3600,
    preference="adjusted",
    limit=3,
    reliability=[99_900, 99_000, 97_000, 99_000, 99_000],
    credit=["0", "0.25", "0.25", "0", "0"],
    minimum=Decimal("99"),
)
@given(
    islands_per_cluster=st.lists(st.integers(1, 5), min_size=1, max_size=5),
    capacity=st.lists(st.sampled_from([4, 8, 8, 16]), min_size=25, max_size=25),
    rates=st.lists(st.sampled_from([8, 10, 10, 12]), min_size=5, max_size=5),
    holds=st.lists(
        st.tuples(
            st.integers(0, 24), st.integers(-3600, 24 * 3600), st.integers(60, 12 * 3600), st.integers(1, 8)
        ),
        max_size=30,
    ),
    cards=st.integers(1, 8),
    duration=st.integers(600, 6 * 3600),
    preference=st.sampled_from(["price", "latency", "adjusted"]),
    limit=st.integers(1, 6),
    reliability=reliability_strategy,
    credit=credit_strategy,
    minimum=minimum_strategy,
)
def test_offers_are_the_island_ranking_grouped_by_cluster_and_start(
    islands_per_cluster: list[int],
    capacity: list[int],
    rates: list[int],
    holds: list[tuple[int, int, int, int]],
    cards: int,
    duration: int,
    preference: str,
    limit: int,
    reliability: list[int],
    credit: list[str],
    minimum: Decimal | None,
) -> None:
    """With ``distinct``, each placement is an offer: every island of one cluster whose exact cheapest
    feasible start is the same, the lowest first; offers rank as their best island does, and ``limit``
    counts offers. The offer's earliest start is the earliest any of its islands could take."""
    cat = clustered_catalogue(islands_per_cluster, capacity, rates, None, reliability, credit)
    n = cat.size
    t0 = int(NOW.timestamp())
    spec = _spec(cards=cards, duration=duration, preference=preference, min_reliability=minimum)
    holds = [(h[0] % n, *h[1:]) for h in holds]
    arrays = _hold_arrays(holds, t0)
    result = _match_alike_bounded(
        arrays,
        spec=spec,
        catalogue=cat,
        now=NOW,
        step=STEP,
        limit=limit,
        tariff_of=TARIFFS.__getitem__,
        distinct=True,
    )
    window = window_of(spec, now=NOW, step=STEP)
    candidates = np.array(
        [i for i in range(n) if capacity[i] >= cards and _reliable(cat, int(cat.island_cluster[i]), minimum)],
        dtype=np.int64,
    )
    blocked = _blocked_starts(cat, arrays, window, candidates, np.full(n, cards, dtype=np.int64))
    offers: dict[tuple[int, int], list[tuple[float, float, int, int]]] = {}
    for island in candidates:
        cluster = int(cat.island_cluster[island])
        values = integrated_multiplier(TARIFFS[int(cat.cluster_tariff[cluster])], window)
        ok = blocked.feasible(island) if blocked.has(island) else np.ones(window.starts, dtype=bool)
        if not ok.any():
            continue
        k = int(np.argmin(np.where(ok, values, np.iinfo(np.int64).max)))
        cost = _rank_cost(cat, cluster, cards, float(values[k]), preference)
        latency = float(cat.latency_ms[1][cat.cluster_hub[cluster]])
        offers.setdefault((cluster, k), []).append((latency, cost, int(island), int(np.argmax(ok))))
    rows = [(*sorted(group, key=lambda r: r[2])[0][:3], k, group) for (_cl, k), group in offers.items()]
    primary = (lambda r: (r[0], r[1], r[2])) if preference == "latency" else (lambda r: (r[1], r[0], r[2]))
    expected = [
        (
            cat.island_cpi[r[2]],
            datetime.fromtimestamp(window.t0 + r[3] * STEP, tz=UTC),
            tuple(cat.island_cpi[g[2]] for g in sorted(r[4], key=lambda g: g[2])[1:]),
            datetime.fromtimestamp(window.t0 + min(g[3] for g in r[4]) * STEP, tz=UTC),
        )
        for r in sorted(rows, key=primary)[:limit]
    ]
    assert [
        (p.island_cpis[0], p.start_at, p.alternative_cpis, p.earliest_feasible_start_at)
        for p in result.placements
    ] == expected
    assert all(p.islands_available == 1 + len(p.alternatives) for p in result.placements)
    assert result.feasible == sum(len(group) for group in offers.values())


@settings(max_examples=250, deadline=None)
@given(
    islands_per_cluster=st.lists(st.integers(1, 5), min_size=1, max_size=6),
    capacity=st.lists(st.sampled_from([2, 4, 8, 8, 16]), min_size=30, max_size=30),
    fabric=st.lists(st.integers(0, 2), min_size=30, max_size=30),
    status=st.lists(st.sampled_from(["active", "active", "active", "offline"]), min_size=6, max_size=6),
    chip=st.lists(st.integers(0, 1), min_size=6, max_size=6),
    hub=st.lists(st.integers(0, 1), min_size=6, max_size=6),
    priced=st.lists(st.sampled_from([True, True, True, False]), min_size=6, max_size=6),
    holds=st.lists(
        st.tuples(
            st.integers(0, 29), st.integers(-3600, 24 * 3600), st.integers(60, 12 * 3600), st.integers(1, 8)
        ),
        max_size=30,
    ),
    cards=st.one_of(
        st.integers(1, 9).map(lambda n: (n, None)), st.sampled_from(["2", "5.5"]).map(lambda s: (None, s))
    ),
    fabrics=st.sampled_from([(), ("nvlink",), ("nvlink", "roce"), ("hccs", "infiniband")]),
    accelerators=st.sampled_from([(), ("a800",), ("h800",)]),
    budget=st.sampled_from([10, 50]),
    excluded=st.sets(st.integers(1, 6), max_size=2),
    distinct=st.booleans(),
)
def test_rejection_counts_per_cluster_match_a_count_per_island(
    islands_per_cluster: list[int],
    capacity: list[int],
    fabric: list[int],
    status: list[str],
    chip: list[int],
    hub: list[int],
    priced: list[bool],
    holds: list[tuple[int, int, int, int]],
    cards: tuple[int | None, str | None],
    fabrics: tuple[str, ...],
    accelerators: tuple[str, ...],
    budget: int,
    excluded: set[int],
    distinct: bool,
) -> None:
    """An island-gang quote counts its rejections per cluster (islands per fabric, sorted capacities) and
    looks only at the islands that holds name: every count must be what a pass over every island, each
    under the first reason it fails, gives; and the placements those of the islands that pass."""
    from broker.catalog import FABRICS

    m = len(islands_per_cluster)
    island_cluster = np.repeat(np.arange(m), islands_per_cluster)
    n = len(island_cluster)
    factors = [7800, 24700]  # a800, h800: standard-card factor × 10⁴
    cat = Catalogue(
        loaded_at=time.monotonic(),
        island_id=np.arange(1, n + 1) * 3,  # ids are not positions
        island_cpi=[f"isl-{i}" for i in range(n)],
        island_cluster=island_cluster,
        island_capacity=np.array(capacity[:n], dtype=np.int64),
        island_fabric=np.array(fabric[:n], dtype=np.int64),  # nvlink, hccs, infiniband
        cluster_id=np.arange(1, m + 1),
        cluster_cpi=[f"c{i}" for i in range(m)],
        cluster_operator=np.ones(m, dtype=np.int64),
        cluster_hub=np.array(hub[:m], dtype=np.int64),
        cluster_status=status[:m],
        cluster_active=np.array([s == "active" for s in status[:m]]),
        cluster_chip=np.array(chip[:m], dtype=np.int64),
        cluster_price=[
            PriceCardRow(i + 1, 1, Decimal(10), 1 + i % 2, "t") if priced[i] else None for i in range(m)
        ],
        cluster_rate=np.array([10.0 if priced[i] else np.nan for i in range(m)]),
        cluster_tariff=np.array([1 + i % 2 if priced[i] else 0 for i in range(m)], dtype=np.int64),
        chip_slugs=["a800", "h800"],
        chip_tflops=[Decimal(312), Decimal(989)],
        chip_tflops_f=np.array([312.0, 989.0]),
        chip_memory_f=np.array([80.0, 80.0]),
        chip_factor_e4=np.array(factors),
        hub_codes=["nx", "yrd"],
        latency_ms=np.array([[5.0, 20.0], [20.0, 5.0]]),
        latency_dec={(i, j): Decimal("5" if i == j else "20") for i in range(2) for j in range(2)},
    )
    whole, standard = cards
    spec = JobSpec(
        **{
            **_spec(cards=1, duration=3 * 3600).__dict__,
            "cards": whole,
            "standard_cards": Decimal(standard) if standard else None,
            "fabrics": fabrics,
            "accelerators": accelerators,
            "latency_budget_ms": budget,
            "exclude_clusters": frozenset(excluded),
        }
    )
    t0 = int(NOW.timestamp())
    holds = [(h[0] % n, *h[1:]) for h in holds]
    arrays = (np.array([3 * (h[0] + 1) for h in holds], dtype=np.int64), *_hold_arrays(holds, t0)[1:])
    result = _match_alike_bounded(
        arrays,
        spec=spec,
        catalogue=cat,
        now=NOW,
        step=STEP,
        limit=30,
        tariff_of=TARIFFS.__getitem__,
        distinct=distinct,
    )
    window = window_of(spec, now=NOW, step=STEP)
    run = -(-spec.duration_seconds // STEP)
    expected = dict.fromkeys(("offline", "chip", "fabric", "latency", "unpriced", "capacity"), 0)
    considered, feasible = 0, []
    for island in range(n):
        cl = int(island_cluster[island])
        if cl + 1 in excluded:
            continue
        considered += 1
        need = whole if whole is not None else -(-int(Decimal(standard) * 10**4) // factors[chip[cl]])
        if status[cl] != "active":
            reason = "offline"
        elif accelerators and cat.chip_slugs[chip[cl]] not in accelerators:
            reason = "chip"
        elif fabrics and FABRICS[fabric[island]] not in fabrics:
            reason = "fabric"
        elif cat.latency_ms[1][hub[cl]] > budget:
            reason = "latency"
        elif not priced[cl]:
            reason = "unpriced"
        elif capacity[island] < need or not any(
            all(
                sum(
                    c
                    for i, s, length, c in holds
                    if i == island
                    and _slot_floor(t0 + s, window.t0) < window.t0 + (slot + 1) * STEP
                    and _slot_ceil(t0 + s + length, window.t0) > window.t0 + slot * STEP
                )
                <= capacity[island] - need
                for slot in range(k, k + run)
            )
            for k in range(window.starts)
        ):
            reason = "capacity"
        else:
            feasible.append(island)
            continue
        expected[reason] += 1
    assert {name: result.rejections[name] for name in expected} == expected
    assert sum(result.rejections.values()) == considered - len(feasible)
    assert result.considered == considered
    assert result.feasible == len(feasible)
    placed = {cpi for p in result.placements for cpi in (*p.island_cpis, *p.alternative_cpis)}
    assert placed == {cat.island_cpi[i] for i in feasible}


@settings(max_examples=100, deadline=None)
@given(
    islands_per_cluster=st.lists(st.integers(1, 5), min_size=1, max_size=6),
    capacity=st.lists(st.sampled_from([0, 2, 4, 8, 8, 16]), min_size=30, max_size=30),
    fabric=st.lists(st.integers(0, 4), min_size=30, max_size=30),
    asks=st.lists(
        st.tuples(
            st.lists(st.integers(0, 20), min_size=6, max_size=6),  # need per cluster
            st.sampled_from([None, (0,), (1, 3), (0, 2, 4)]),
        ),
        min_size=1,
        max_size=6,
    ),
)
def test_islands_below_is_a_count_per_island(
    islands_per_cluster: list[int],
    capacity: list[int],
    fabric: list[int],
    asks: list[tuple[list[int], tuple[int, ...] | None]],
) -> None:
    """The catalogue's per-cluster counts of islands with fewer cards than a need (kept per need once
    asked) are a count over the islands, whatever needs were asked before."""
    cat = clustered_catalogue(islands_per_cluster, capacity, [10] * 6)
    cat.island_fabric = np.array(fabric[: cat.size], dtype=np.int64)
    m = len(islands_per_cluster)
    for needs, fabrics in asks:
        clusters = np.arange(m, dtype=np.int64)[::-1]
        need = np.array(needs[:m], dtype=np.int64)[::-1]
        allowed = None if fabrics is None else np.array(fabrics, dtype=np.int64)
        got = cat.islands_below(clusters, need, allowed).tolist()
        expected = [
            sum(
                1
                for i in range(cat.size)
                if cat.island_cluster[i] == cl
                and cat.island_capacity[i] < q
                and (fabrics is None or int(cat.island_fabric[i]) in fabrics)
            )
            for cl, q in zip(clusters.tolist(), need.tolist(), strict=True)
        ]
        assert got == expected
