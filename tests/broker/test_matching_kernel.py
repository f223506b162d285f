"""broker.matching_kernel.blocked_ranges against a plain Python count of every slot: the same blocked
starts per island and the same full islands, for any rows, needs, reports and windows; and the shape its
callers read (ranges sorted by island, then start; full islands ascending). And the other compiled loops
against plain Python or numpy."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.matching import Candidates
from broker.matching_kernel import blocked_ranges, overlapping_rows, smallest_entries, warm
from tests.broker.test_matching_property import catalogue

T0 = 1_800_000_000
STEP = 900


def _slots(start: int, end: int, slots: int) -> tuple[int, int]:
    first = min(max((start - T0) // STEP, 0), slots)
    last = min(max(-(-(end - T0) // STEP), 0), slots)
    return first, last


def _reference(
    rows: list[tuple[int, int, int, int]],
    capacity: list[int],
    need: list[int],
    first_only: set[int],
    duration: int,
    n_starts: int,
) -> tuple[dict[int, set[int]], list[int]]:
    """Per island, its blocked starts, slot by slot: a start is blocked when a slot its run touches holds
    more than the island's cards less its need (every row occupying its slots rounded outward), or it is
    the first start of an island a short report blocks; and the islands with every start blocked."""
    run = -(-duration // STEP)
    slots = n_starts - 1 + run
    blocked: dict[int, set[int]] = {}
    for island in {row[0] for row in rows} | first_only:
        occupied = [0] * slots
        for row_island, start, end, cards in rows:
            if row_island == island:
                first, last = _slots(start, end, slots)
                for slot in range(first, last):
                    occupied[slot] += cards
        short = {slot for slot in range(slots) if occupied[slot] > capacity[island] - need[island]}
        starts = {k for k in range(n_starts) if any(slot in short for slot in range(k, k + run))}
        if island in first_only:
            starts.add(0)
        if starts:
            blocked[island] = starts
    full = sorted(island for island, starts in blocked.items() if len(starts) == n_starts)
    return blocked, full


@settings(max_examples=400, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.integers(0, 7),  # island
            st.integers(-3 * 3600, 40 * 3600),  # start, from T0
            st.integers(0, 12 * 3600),  # length
            st.integers(0, 9),  # cards
        ),
        max_size=40,
    ),
    capacity=st.lists(st.integers(0, 16), min_size=8, max_size=8),
    need=st.lists(st.integers(0, 12), min_size=8, max_size=8),
    first_only=st.sets(st.integers(0, 7), max_size=4),
    reported=st.sets(st.integers(0, 7), max_size=4),
    duration=st.integers(1, 10 * 3600),
    n_starts=st.integers(1, 40),
)
def test_blocked_ranges_are_the_slot_by_slot_count(
    rows: list[tuple[int, int, int, int]],
    capacity: list[int],
    need: list[int],
    first_only: set[int],
    reported: set[int],
    duration: int,
    n_starts: int,
) -> None:
    """``reported`` only chooses the path (an island with one row is swept, not taken directly): the
    answer must be the same either way. Needs are at most the island's cards, as for the matcher's
    candidates."""
    need = [min(n, c) for n, c in zip(need, capacity, strict=True)]
    rows = sorted(((island, T0 + start, T0 + start + length, cards) for island, start, length, cards in rows))
    run = -(-duration // STEP)
    slots = n_starts - 1 + run
    island, start, end, cards = (np.array([row[k] for row in rows], dtype=np.int64) for k in range(4))
    # One cluster per island, its need; the rows read through ``rows`` (here the identity, reversed
    # arrays to show that the kernel reads starts and ends through it).
    positions = np.arange(len(rows), dtype=np.int64)[::-1].copy()
    starts, ends = np.zeros(len(rows), dtype=np.int64), np.zeros(len(rows), dtype=np.int64)
    starts[positions], ends[positions] = start, end
    got_island, a, b, full = blocked_ranges(
        island,
        cards,
        positions,
        starts,
        ends,
        np.array(sorted(reported), dtype=np.int64),
        np.array(sorted(first_only), dtype=np.int64),
        np.array(need, dtype=np.int64),
        np.arange(8, dtype=np.int64),
        np.array(capacity, dtype=np.int64),
        T0,
        STEP,
        duration,
        n_starts,
        slots,
    )
    expected, expected_full = _reference(rows, capacity, need, first_only, duration, n_starts)
    got: dict[int, set[int]] = {}
    for i, lo, hi in zip(got_island.tolist(), a.tolist(), b.tolist(), strict=True):
        assert 0 <= lo < hi <= n_starts
        got.setdefault(i, set()).update(range(lo, hi))
    assert got == expected
    assert full.tolist() == expected_full
    order = list(zip(got_island.tolist(), a.tolist(), strict=True))
    assert order == sorted(order)


def test_a_report_islands_first_start_goes_after_its_ranges_from_zero() -> None:
    """``[0, 1)`` of an island a short report blocks sits after the island's other ranges that start at
    0, where a stable sort by (island, start) of the holds' ranges, then the reports', puts it."""
    # Island 0 (4 cards) holds 4 over the first two slots and 4 over slots 10–11: two ranges, one from 0.
    rows = [(0, T0, T0 + 2 * STEP, 4), (0, T0 + 10 * STEP, T0 + 12 * STEP, 4)]
    island, start, end, cards = (np.array([row[k] for row in rows], dtype=np.int64) for k in range(4))
    got_island, a, b, full = blocked_ranges(
        island,
        cards,
        np.arange(2, dtype=np.int64),
        start,
        end,
        np.zeros(0, dtype=np.int64),
        np.array([0, 3], dtype=np.int64),  # island 3 has no rows
        np.ones(4, dtype=np.int64),
        np.arange(4, dtype=np.int64),
        np.full(4, 4, dtype=np.int64),
        T0,
        STEP,
        3 * STEP,
        20,
        22,
    )
    assert list(zip(got_island.tolist(), a.tolist(), b.tolist(), strict=True)) == [
        (0, 0, 2),
        (0, 0, 1),
        (0, 8, 12),
        (3, 0, 1),
    ]
    assert full.tolist() == []


def test_no_rows_block_nothing_and_warming_compiles() -> None:
    warm()
    empty = np.zeros(0, dtype=np.int64)
    result = blocked_ranges(
        empty, empty, empty, empty, empty, empty, empty, empty, empty, empty, T0, STEP, 60, 5, 5
    )
    assert [len(part) for part in result] == [0, 0, 0, 0]


def book_rows(
    *, islands: tuple[int, int], cards: tuple[int, int]
) -> st.SearchStrategy[list[tuple[int, int, int, int, bool]]]:
    """Rows of a hold book: (island id, start, length, cards, alive)."""
    return st.lists(
        st.tuples(
            st.integers(*islands),
            st.integers(0, 40),
            st.integers(1, 20),
            st.integers(*cards),
            st.booleans(),
        ),
        max_size=40,
    )


@settings(max_examples=300, deadline=None)
@given(
    holds=book_rows(islands=(0, 14), cards=(0, 9)),
    window=st.none() | st.tuples(st.integers(-5, 45), st.integers(0, 30)),  # lo, length
    with_alive=st.booleans(),
    known=st.lists(st.integers(1, 12), min_size=1, max_size=10, unique=True),
    clusters=st.lists(st.integers(0, 3), min_size=10, max_size=10),
    capacity=st.lists(st.integers(0, 16), min_size=10, max_size=10),
    fabric=st.lists(st.integers(0, 2), min_size=10, max_size=10),
    cluster_ok=st.lists(st.booleans(), min_size=4, max_size=4),
    need=st.lists(st.integers(0, 12), min_size=4, max_size=4),
    fabric_ok=st.none() | st.lists(st.booleans(), min_size=3, max_size=3),
    island_ok=st.none() | st.lists(st.booleans(), min_size=10, max_size=10),
    # Most ids within the bound, some past it (up to 15 of the 0–14 ids); bounds near the islands' room.
    held=st.none() | st.lists(st.integers(0, 12), min_size=8, max_size=16),
    reported=st.none() | st.lists(st.booleans(), min_size=10, max_size=10),
)
def test_candidate_rows_are_the_candidate_test_on_known_islands(
    holds: list[tuple[int, int, int, int, bool]],
    window: tuple[int, int] | None,
    with_alive: bool,
    known: list[int],
    clusters: list[int],
    capacity: list[int],
    fabric: list[int],
    cluster_ok: list[bool],
    need: list[int],
    fabric_ok: list[bool] | None,
    island_ok: list[bool] | None,
    held: list[int] | None,
    reported: list[bool] | None,
) -> None:
    """The compiled selection of a quote's holds keeps, in order, the holds that are alive (when it is
    told which are), overlap the window (when given one) and whose island the catalogue knows and
    broker.matching.Candidates accepts (ids the catalogue does not know, past its lookup or inside it, are
    left out), and says whether their positions ascend. With ``held`` (by island id, possibly shorter than
    the ids), an island whose bound leaves its need free is left out too, unless ``reported`` (by
    position) says a heartbeat report adds to its holds."""
    n = len(known)
    cat = catalogue(capacity[:n])
    cat.island_id = np.array(sorted(known), dtype=np.int64)
    cat.island_cluster = np.array(clusters[:n], dtype=np.int64)
    cat.island_fabric = np.array(fabric[:n], dtype=np.int64)
    test = Candidates(
        cat,
        cluster_ok=np.array(cluster_ok),
        cluster_need=np.array(need, dtype=np.int64),
        fabric_ok=None if fabric_ok is None else np.array(fabric_ok),
        island_ok=None if island_ok is None else np.array(island_ok[:n]),
    )
    hold_island = np.array([h[0] for h in holds], dtype=np.int64)
    hold_start = np.array([h[1] for h in holds], dtype=np.int64)
    hold_end = np.array([h[1] + h[2] for h in holds], dtype=np.int64)
    hold_cards = np.array([h[3] for h in holds], dtype=np.int64)
    alive = np.array([h[4] for h in holds], dtype=bool) if with_alive else None
    span = {} if window is None else {"lo": window[0], "hi": window[0] + window[1]}
    bound = None if held is None else np.array(held, dtype=np.int64)
    by_position = None if reported is None else np.array(reported[:n])
    index, cards, rows, ordered = test.rows_of(
        (hold_island, hold_start, hold_end, hold_cards), alive=alive, held=bound, reported=by_position, **span
    )
    positions = cat.island_index(hold_island)

    def free(i: int, position: int) -> bool:
        """The bound leaves the island's need free and no report adds to its holds."""
        island_id = int(hold_island[i])
        if held is None or island_id >= len(held) or (reported is not None and reported[position]):
            return False
        return held[island_id] <= capacity[position] - need[clusters[position]]

    expected_rows = [
        i
        for i, position in enumerate(positions.tolist())
        if position >= 0
        and bool(test(np.array([position]))[0])
        and (alive is None or holds[i][4])
        and (window is None or (hold_start[i] < span["hi"] and hold_end[i] > span["lo"]))
        and not free(i, position)
    ]
    assert rows.tolist() == expected_rows
    assert index.tolist() == positions[expected_rows].tolist()
    assert cards.tolist() == hold_cards[expected_rows].tolist()
    assert ordered == (index.tolist() == sorted(index.tolist()))


@settings(max_examples=300, deadline=None)
@given(
    capacity=st.lists(st.integers(0, 8), min_size=6, max_size=6),
    need=st.integers(0, 6),
    hold_islands=st.lists(st.integers(1, 8), max_size=30),  # ids 1–6 are known; 7 and 8 are not
    held=st.lists(st.integers(0, 8), max_size=8),
    reported=st.none() | st.lists(st.booleans(), min_size=6, max_size=6),
)
def test_candidate_rows_skip_the_islands_their_bound_leaves_free(
    capacity: list[int], need: int, hold_islands: list[int], held: list[int], reported: list[bool] | None
) -> None:
    """The hold book's bound per island (``held``, by id, maybe shorter than the ids): the rows of an island
    whose bound is within its room (its cards less its need, equal included) are left out, unless a
    heartbeat report adds to its holds; an island past the bound keeps its rows, as does an island whose
    bound exceeds its room; an island with fewer cards than the need, or unknown, has none."""
    cat = catalogue(capacity)
    cat.island_id = np.arange(1, 7, dtype=np.int64)
    cat.island_cluster = np.zeros(6, dtype=np.int64)
    cat.island_fabric = np.zeros(6, dtype=np.int64)
    test = Candidates(cat, cluster_ok=np.array([True]), cluster_need=np.array([need], dtype=np.int64))
    n = len(hold_islands)
    ids = np.array(hold_islands, dtype=np.int64)
    zeros = np.zeros(n, dtype=np.int64)
    _, _, rows, _ = test.rows_of(
        (ids, zeros, zeros + 1, zeros + 1),
        held=np.array(held, dtype=np.int64),
        reported=None if reported is None else np.array(reported),
    )

    def kept(island_id: int) -> bool:
        if island_id > 6 or capacity[island_id - 1] < need:
            return False
        room = capacity[island_id - 1] - need
        bound_free = island_id < len(held) and held[island_id] <= room
        return not bound_free or (reported is not None and reported[island_id - 1])

    assert rows.tolist() == [i for i, island_id in enumerate(hold_islands) if kept(island_id)]


@settings(max_examples=300, deadline=None)
@given(
    rows=book_rows(islands=(1, 50), cards=(1, 8)),
    spare=st.integers(0, 5),
    lo=st.integers(-5, 60),
    length=st.integers(0, 30),
)
def test_the_book_rows_in_a_window_are_the_live_ones_that_overlap_it_in_order(
    rows: list[tuple[int, int, int, int, bool]], spare: int, lo: int, length: int
) -> None:
    """The compiled selection of the hold book's rows keeps, in row order, exactly the live rows among the
    first ``n`` (the book's arrays have spare room after them, which is never read) that overlap
    ``[lo, hi)``: a row ending at ``lo`` or starting at ``hi`` does not."""
    hi = lo + length
    padded = rows + [(99, 0, 100, 9, True)] * spare  # past n: must be ignored

    def column(i: int) -> np.ndarray:  # the end is start + length
        return np.array([row[i] if i != 2 else row[1] + row[2] for row in padded], dtype=np.int64)

    island, start, end, cards = (column(i) for i in range(4))
    alive = np.array([row[4] for row in padded], dtype=bool)
    got = overlapping_rows(island, start, end, cards, alive, len(rows), lo, hi)
    expected = [(i, s, s + d, c) for i, s, d, c, live in rows if live and s < hi and s + d > lo]
    assert list(zip(*(a.tolist() for a in got), strict=True)) == expected
    assert all(a.dtype == np.int64 for a in got)


@settings(max_examples=400, deadline=None)
@given(
    values=st.lists(
        st.one_of(
            st.sampled_from([0.0, 1.5, 2.0, 2.0, 7.25]),  # ties, as clusters at one price have
            st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
            st.just(float("nan")),
            st.just(float("inf")),
        ),
        min_size=1,
        max_size=60,
    ),
    data=st.data(),
)
def test_the_smallest_entries_are_numpys_partition_cut(values: list[float], data: st.DataObject) -> None:
    """The compiled selection of the ranking's entries keeps exactly what numpy's partition keeps: every
    position whose value is not above the ``limit``-th smallest (ties all kept), ascending; none when
    NaN is the cut (fewer numbers than ``limit``)."""
    limit = data.draw(st.integers(1, len(values)))
    primary = np.array(values, dtype=np.float64)
    expected = np.nonzero(primary <= np.partition(primary, limit - 1)[limit - 1])[0]
    got = smallest_entries(primary, limit)
    assert got.dtype == np.int64
    assert got.tolist() == expected.tolist()


# Single-island clusters with these cards (tests.broker.test_matching_property.catalogue).
ISLAND_CARDS = st.lists(st.integers(0, 12), min_size=1, max_size=10)


def _made_from_scratch(candidate: Candidates) -> np.ndarray:
    """``candidate``'s room as island_room makes it from every island."""
    return Candidates(
        candidate.c,
        cluster_ok=candidate.cluster_ok,
        cluster_need=candidate.cluster_need,
        fabric_ok=candidate.fabric_ok,
        island_ok=candidate.island_ok,
    ).room()


@settings(max_examples=200, deadline=None)
@given(capacity=ISLAND_CARDS, cards=st.integers(1, 9), capped=st.data())
def test_a_price_caps_room_is_the_requirements_room_without_the_clusters_it_rejects(
    capacity: list[int], cards: int, capped: st.DataObject
) -> None:
    """Under a price cap the island gang's room is made from the requirements' own (kept on the catalogue),
    with the islands of the clusters the cap rejects taken out: the room island_room makes from scratch."""
    from broker.matching import _IslandGang, _reject, _requirements_of
    from tests.broker.test_matching_property import _spec

    cat = catalogue(capacity)
    spec = _spec(cards=cards, duration=3600)
    req = _requirements_of(spec, cat)
    after = req.after.copy()
    _reject(
        after,
        np.array(capped.draw(st.lists(st.booleans(), min_size=len(capacity), max_size=len(capacity)))),
        "price",
    )
    gang = _IslandGang.of(spec, cat, req, after)
    assert gang.candidate._room is not None  # made by the gang, not left to room()
    assert gang.candidate.room().tolist() == _made_from_scratch(gang.candidate).tolist()
    assert (
        req.island_gang(spec, cat).candidate.room().tolist()
        == _made_from_scratch(req.island_gang(spec, cat).candidate).tolist()
    )


@settings(max_examples=200, deadline=None)
@given(capacity=ISLAND_CARDS, cards=st.integers(0, 9), chosen_from=st.data())
def test_listed_candidates_room_is_island_rooms(
    capacity: list[int], cards: int, chosen_from: st.DataObject
) -> None:
    """The cost-against-start chart's candidates (the islands it lists, each with the cards): their room
    written from them alone is the room island_room makes from every island."""
    from broker.matching import _listed_candidates

    cat = catalogue(capacity)
    roomy = [position for position, cards_here in enumerate(capacity) if cards_here >= cards]
    chosen = np.array(
        sorted(chosen_from.draw(st.sets(st.sampled_from(roomy)) if roomy else st.just(set()))), dtype=np.int64
    )
    is_candidate = np.zeros(len(capacity), dtype=bool)
    is_candidate[chosen] = True
    need = np.full(len(capacity), cards, dtype=np.int64)
    candidate = _listed_candidates(cat, chosen, need, is_candidate)
    assert candidate.room().tolist() == _made_from_scratch(candidate).tolist()
