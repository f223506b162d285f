"""The matcher's batched helpers against the one-at-a-time forms they replace: the same answer for any
holds, islands and starts (the whole matcher is held to a brute force in test_matching_property.py)."""

from __future__ import annotations

import dataclasses
import functools
from datetime import timedelta
from decimal import Decimal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.catalog import Catalogue
from broker.matching import (
    BlockedStarts,
    Window,
    _blocked_starts,
    _first_feasible_each,
    _integrated_multiplier_of,
    _live_members,
    _live_members_of,
    integrated_multiplier,
    match,
    window_of,
)
from metering.tariffs import PRESETS, tariff_compile
from tests.broker.test_matching_property import NOW, STEP, TARIFFS, _hold_arrays, _spec, catalogue

ranges_strategy = st.lists(
    st.tuples(st.integers(0, 7), st.integers(0, 20), st.integers(1, 8)),  # island, a, length
    max_size=30,
)


def _blocked_of(ranges: list[tuple[int, int, int]], starts: int = 24) -> BlockedStarts:
    """BlockedStarts of (island, a, length) ranges, sorted by island, then a, clipped to the window."""
    rows = sorted((island, a, min(a + length, starts)) for island, a, length in ranges if a < starts)
    island, a, b = (np.array([r[i] for r in rows], dtype=np.int64) for i in range(3))
    return BlockedStarts(island, a, b, np.zeros(0, dtype=np.int64), starts)


@settings(max_examples=200, deadline=None)
@given(ranges=ranges_strategy, ks=st.lists(st.integers(0, 23), min_size=8, max_size=8))
def test_blocks_is_a_start_inside_one_of_the_islands_ranges(
    ranges: list[tuple[int, int, int]], ks: list[int]
) -> None:
    blocked = _blocked_of(ranges)
    islands = np.array([5, 0, 7, 3, 1, 6, 2, 4], dtype=np.int64)  # any order
    k = np.array(ks, dtype=np.int64)
    got = blocked.blocks(islands, k).tolist()
    expected = [not bool(blocked.feasible(int(i))[kk]) for i, kk in zip(islands, k, strict=True)]
    assert got == expected


@settings(max_examples=200, deadline=None)
@given(
    ranges=ranges_strategy,
    groups=st.lists(st.integers(0, 3), min_size=8, max_size=8),  # each island's group
)
def test_first_feasible_each_is_the_earliest_start_of_any_island_of_the_group(
    ranges: list[tuple[int, int, int]], groups: list[int]
) -> None:
    blocked = _blocked_of(ranges)
    members = [np.array([i for i in range(8) if groups[i] == g], dtype=np.int64) for g in range(4)]
    members = [m for m in members if len(m)]
    # The matcher asks only of islands feasible somewhere: keep the groups with such an island.
    members = [m for m in members if any(blocked.feasible(int(i)).any() for i in m)]
    expected = [
        int(np.argmax(np.any([blocked.feasible(int(i)) for i in m], axis=0))) if len(m) else 0
        for m in members
    ]
    assert _first_feasible_each(blocked, members) == expected


@settings(max_examples=100, deadline=None)
@given(
    live=st.lists(st.booleans(), min_size=12, max_size=12),
    own=st.sets(st.integers(0, 11), max_size=6),
    clusters=st.lists(st.integers(0, 3), min_size=1, max_size=4, unique=True),
)
def test_live_members_of_many_clusters_is_each_clusters_own(
    live: list[bool], own: set[int], clusters: list[int]
) -> None:
    cat = catalogue([8] * 12)
    # Four clusters of three islands, interleaved: islands i, i + 4, i + 8 are cluster i's.
    cat.island_cluster = np.arange(12) % 4
    cat.cluster_id = cat.cluster_id[:4]
    is_live = np.array(live)
    own_sorted = np.array(sorted(own), dtype=np.int64)
    islands, bounds = _live_members_of(
        cat, np.array(clusters, dtype=np.int64), lambda positions: is_live[positions], own_sorted
    )
    for j, cl in enumerate(clusters):
        expected = _live_members(cat, cl, lambda positions: is_live[positions], own_sorted)
        assert islands[bounds[j] : bounds[j + 1]].tolist() == expected.tolist()


def test_blocked_starts_with_no_holds_in_the_window_blocks_nothing() -> None:
    cat = catalogue([8, 8, 8, 8])
    window = window_of(_spec(cards=4, duration=3600), now=NOW, step=STEP)
    later = NOW + timedelta(days=3)
    arrays = _hold_arrays([(0, int((later - NOW).total_seconds()), 3600, 8)], int(NOW.timestamp()))
    blocked = _blocked_starts(cat, arrays, window, np.arange(4), np.full(4, 4, dtype=np.int64))
    assert not blocked.has(0)
    assert len(blocked.full) == 0


@settings(max_examples=200, deadline=None)
@given(
    known=st.lists(st.integers(1, 60), min_size=1, max_size=12, unique=True),
    asked=st.lists(st.integers(0, 80), max_size=20),
)
def test_island_index_is_each_ids_position_or_minus_one(known: list[int], asked: list[int]) -> None:
    """The one-gather path (every id within the lookup) and the masked path (some id past it) both give
    each id's catalogue position, -1 for an id the catalogue does not know."""
    cat = catalogue([8] * len(known))
    cat.island_id = np.array(sorted(known), dtype=np.int64)
    positions = {island_id: i for i, island_id in enumerate(sorted(known))}
    ids = np.array(asked, dtype=np.int64)
    assert cat.island_index(ids).tolist() == [positions.get(i, -1) for i in asked]
    assert cat.island_index(ids).dtype == np.int64


def test_a_remembered_integration_is_the_tariffs_own_and_read_only() -> None:
    """The integrated multiplier kept per tariff and window is what integrating gives; another tariff
    object (even an equal one, as a reused id would bring) is integrated afresh; the kept array cannot be
    changed by a caller."""
    window = Window(t0=1_800_000_000, step=STEP, duration=8 * 3600, starts=40)
    gd, nx = tariff_compile(PRESETS["cn-gd"].spec), tariff_compile(PRESETS["cn-nx"].spec)
    first = _integrated_multiplier_of(gd, window)
    assert np.array_equal(first, integrated_multiplier(gd, window))
    assert _integrated_multiplier_of(gd, window) is first
    assert np.array_equal(_integrated_multiplier_of(nx, window), integrated_multiplier(nx, window))
    assert not np.array_equal(first, integrated_multiplier(nx, window))
    twin = tariff_compile(PRESETS["cn-gd"].spec)
    assert _integrated_multiplier_of(twin, window) is not first
    later = Window(t0=window.t0 + STEP, step=STEP, duration=window.duration, starts=window.starts)
    assert np.array_equal(_integrated_multiplier_of(gd, later), integrated_multiplier(gd, later))
    with pytest.raises(ValueError, match="read-only"):
        first[0] = 0


_REQUIREMENT_CHANGES = st.one_of(
    st.tuples(st.just("cards"), st.integers(1, 12)),
    st.tuples(st.just("duration_seconds"), st.sampled_from([3600, 4 * 3600])),
    st.tuples(st.just("origin_hub"), st.sampled_from(["yrd", "nx", "nowhere"])),
    st.tuples(st.just("latency_budget_ms"), st.sampled_from([10, 50])),
    st.tuples(
        st.just("max_price_per_card_hour"),
        st.none() | st.sampled_from([Decimal("3"), Decimal("3.85"), Decimal("5"), Decimal("30")]),
    ),
    st.tuples(st.just("preference"), st.sampled_from(["price", "latency", "adjusted"])),
    st.tuples(st.just("min_reliability"), st.none() | st.sampled_from([Decimal("90"), Decimal("99.5")])),
    st.tuples(st.just("exclude_clusters"), st.sampled_from([frozenset(), frozenset({1}), frozenset({2, 3})])),
    st.tuples(st.just("offset"), st.sampled_from([0, 3 * 3600, 30 * 3600])),
)


@settings(max_examples=80, deadline=None)
@given(
    capacities=st.lists(st.integers(0, 16), min_size=4, max_size=8),
    holds=st.lists(
        st.tuples(
            st.integers(0, 7), st.integers(-3600, 30 * 3600), st.integers(60, 10 * 3600), st.integers(1, 8)
        ),
        max_size=12,
    ),
    cards=st.integers(1, 12),
    hub=st.sampled_from(["yrd", "nx"]),  # the clusters are in yrd: 5 ms from it, 20 ms from nx
    changes=st.lists(_REQUIREMENT_CHANGES, min_size=1, max_size=6),
)
def test_requirements_kept_on_a_catalogue_answer_as_computed_afresh(
    capacities: list[int],
    holds: list[tuple[int, int, int, int]],
    cards: int,
    hub: str,
    changes: list[tuple[str, object]],
) -> None:
    """Quotes of a job and of the job with one requirement, its window or its price cap changed at a time,
    one after another on one catalogue, which keeps each job's requirements for the next quote alike,
    give exactly what each gives on a catalogue of its own; and what is kept cannot be changed by a
    caller."""

    def make() -> Catalogue:
        cat = catalogue(capacities)
        # Expected SLA credits and reliability scores that differ by cluster, so that the ``adjusted``
        # preference and a minimum reliability tell clusters apart.
        cat.cluster_credit = [Decimal(i % 3) / 10 for i in range(len(capacities))]
        cat.cluster_credit_fraction = np.array([float(x) for x in cat.cluster_credit])
        cat.cluster_reliability_e3 = np.array([(95 + i % 5) * 1000 for i in range(len(capacities))])
        cat.cluster_reliability = [None] * len(capacities)
        return cat

    shared = make()
    holds = [h for h in holds if h[0] < len(capacities)]
    arrays = _hold_arrays(holds, int(NOW.timestamp()))
    base = dataclasses.replace(_spec(cards=cards, duration=3600), origin_hub=hub)
    for field, value in [("cards", cards), *changes]:
        if field == "offset":
            offset = int(value)  # type: ignore[call-overload]
            spec = dataclasses.replace(
                base,
                earliest_start_at=NOW + timedelta(seconds=offset),
                deadline_at=NOW + timedelta(seconds=offset + 24 * 3600),
            )
        else:
            spec = dataclasses.replace(base, **{field: value})
        for distinct in (False, True):
            quoted = functools.partial(
                match, spec=spec, holds=arrays, now=NOW, step=STEP, limit=3, tariff_of=TARIFFS.__getitem__
            )
            assert quoted(catalogue=shared, distinct=distinct) == quoted(catalogue=make(), distinct=distinct)
    for req in shared.__dict__["_requirements"].values():
        with pytest.raises(ValueError, match="read-only"):
            req.before[0] = 1
        with pytest.raises(ValueError, match="read-only"):
            req.cluster_need[0] = 1
        if req._gang is not None:  # made for a job with no price cap
            with pytest.raises(ValueError, match="read-only"):
                req._gang.counts[0] = 1
