"""The matcher's loops over a quote's holds, compiled (numba): the holds in its window
(``overlapping_rows``), the live ones in the window on candidate islands (``candidate_rows``, which an
island-gang quote runs on the hold book's own rows, no copy first, reading each island's room that
``island_room`` made once for the job's requirements) and, per island, the starts they block
(``blocked_ranges``); and the ranking's first cut over every cluster with candidates
(``smallest_entries``).

Every quote looks at every hold in its window (tens of thousands at design load) to find, per island, the
start ranges where too few cards are free, and the islands left with no start at all (the count of
capacity rejections and the feasible total depend on them). As numpy operations over those rows the work
took ~25 passes, each allocating a temporary as large as the holds: about 1.7 ms of CPU per quote, the
largest single part of a quote. Here it is two passes in compiled code over the holds (the selection,
then the holds grouped by island), with nothing allocated per row. broker.matching._blocked calls them
(and adds the heartbeat reports); tests/broker/test_matching_property.py holds the whole matcher to a
brute force over every slot, and tests/broker/test_matching_kernel.py these loops to plain Python (or
numpy) ones.

Each function is compiled at its first call (about 1 s of CPU) and cached on disk: next to this file when
it is writable, else in the user's cache directory (``NUMBA_CACHE_DIR`` picks another), where a process
loads it in ~0.1 s. Each has one signature: its arrays reach it read-only, whatever the caller passed.
With no writable place at all it is compiled in each process instead of failing. A server compiles or
loads it while warming up (broker.catalog.Market.warm), not in its first quote.
``nogil``: a request thread runs it without holding the interpreter lock, so the server's other threads
go on meanwhile.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit


def _compiled(function: Callable[..., Any]) -> Any:
    """``function`` compiled, called with every array argument read-only.

    numba compiles a function once per tuple of argument types, and a read-only array is another type
    than a writable one of the same dtype: the matcher passes some arrays read-only (the cached
    requirements, shared between quotes) and others not, so a quote could meet a combination ``warm``
    did not compile and compile it itself, ~1 s of CPU in a new server's first quote. Passed through
    here, every array reaches the compiled function read-only (a writable one as a read-only view, no
    copy; the functions write only to arrays they allocate), so each has one signature per dtype, the
    one ``warm`` compiles. The compiled dispatcher is the wrapper's ``dispatcher``."""
    try:
        dispatcher = njit(cache=True, nogil=True)(function)
    except RuntimeError:  # numba found no writable cache directory ("no locator available")
        dispatcher = njit(nogil=True)(function)

    @functools.wraps(function)
    def call(*args: Any) -> Any:
        return call.dispatcher(*[_read_only(arg) for arg in args])  # type: ignore[attr-defined]

    call.dispatcher = dispatcher  # type: ignore[attr-defined]
    return call


def _read_only(value: Any) -> Any:
    if type(value) is np.ndarray and value.flags.writeable:
        value = value.view()
        value.flags.writeable = False
    return value


@njit(inline="always")
def _floor_div(x: Any, d: Any, inverse: float) -> Any:  # pragma: no cover - compiled
    """``x // d`` for ``d > 0`` (``inverse`` = ``1 / d``) without an integer division: the float quotient
    truncated is off by at most one either way (|x| far below 2⁵³), and the remainder says which way."""
    q = np.int64(x * inverse)
    rest = x - q * d
    if rest < 0:
        q -= 1
    elif rest >= d:
        q += 1
    return q


@_compiled
def blocked_ranges(
    index: np.ndarray,
    cards: np.ndarray,
    rows: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    reported: np.ndarray,
    first_only: np.ndarray,
    cluster_need: np.ndarray,
    island_cluster: np.ndarray,
    capacity: np.ndarray,
    t0: int,
    step: int,
    duration: int,
    n_starts: int,
    slots: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover - compiled
    """(island, a, b, full): the start ranges ``[a, b)`` that holds block, sorted by island, then ``a``,
    and the islands (ascending) whose ranges cover every start ``[0, n_starts)``.

    The rows: ``index[i]`` (catalogue positions, grouped by island in ascending order) holds ``cards[i]``
    cards over ``[starts[rows[i]], ends[rows[i]])``, epoch seconds. ``reported`` (ascending) are islands
    some of whose rows are heartbeat reports; ``first_only`` (ascending) islands whose first start a report
    blocks, whether or not they have rows. An island's need is ``cluster_need[island_cluster[island]]``.

    Per island: its rows together leave too few cards (held + need > capacity) or nothing is blocked.
    Then a single hold (not a report, nor a ``first_only`` island) blocks the starts whose run touches its
    slots, rounded outward, ``[first − run + 1, last)``; several rows are swept as edges sorted by slot
    (releases before takes at one slot edge), each stretch between two slot edges where the running level
    leaves too few cards blocking ``[slot − run + 1, next slot)``; every range clipped to the window and
    empty ones dropped. A ``first_only`` island also gets ``[0, 1)``, placed after its ranges that start
    at 0. An island is full when its ranges, walked in order with the furthest end so far, leave no gap
    from 0 to ``n_starts``."""
    n = len(index)
    n_first = len(first_only)
    n_reported = len(reported)
    run = -(-duration // step)
    # Room for the most there can be (two ranges per row, one per first_only island), allocated once:
    # arrays never replaced inside the loop compile to plain loads and stores, and the pages of what is
    # not written are never touched.
    out_island = np.empty(2 * n + n_first, dtype=np.int64)
    out_a = np.empty(2 * n + n_first, dtype=np.int64)
    out_b = np.empty(2 * n + n_first, dtype=np.int64)
    full = np.empty(n + n_first, dtype=np.int64)
    edge_key = np.empty(2 * n, dtype=np.int64)  # slot * 2 + (1 for a take, 0 for a release)
    edge_cards = np.empty(2 * n, dtype=np.int64)
    m = 0  # ranges written
    n_full = 0
    i = 0  # the next row
    f = 0  # the next first_only island
    r = 0  # the next reported island
    last_island = np.iinfo(np.int64).max
    inv = 1.0 / step
    lone_full = n_starts <= 0  # with no start at all, every island is full (the walk below says so too)
    while i < n or f < n_first:
        island = index[i] if i < n else last_island
        # An island with one row, not a first_only island, and (below) no report: most of them.
        lone = i < n and (i + 1 >= n or index[i + 1] != island) and (f >= n_first or first_only[f] > island)
        if lone:
            while r < n_reported and reported[r] < island:
                r += 1
            lone = r >= n_reported or reported[r] != island
        if lone:
            # The single-hold rule below without a branch on the data:
            # the range is written whether or not it is kept (kept: the output moves on), as is the island
            # as full, so the loop does not mispredict when blocked and free islands alternate.
            row = rows[i]
            room = capacity[island] - cluster_need[island_cluster[island]]
            first = min(max(_floor_div(starts[row] - t0, step, inv), 0), slots)
            last = min(max(-_floor_div(t0 - ends[row], step, inv), 0), slots)
            a = max(first - run + 1, 0)
            b = min(last, n_starts)
            out_island[m] = island
            out_a[m] = a
            out_b[m] = b
            kept = (cards[i] > room) & (first < last) & (a < b)
            m += kept
            full[n_full] = island
            n_full += lone_full | (kept & (a == 0) & (b >= n_starts))
            i += 1
            continue
        if f < n_first and first_only[f] < island:
            island = first_only[f]
            j = i  # an island with no rows
        else:
            j = i + 1
            while j < n and index[j] == island:
                j += 1
        has_first = f < n_first and first_only[f] == island
        if has_first:
            f += 1
        begin = m
        if j > i:
            held = 0
            for k in range(i, j):
                held += cards[k]
            room = capacity[island] - cluster_need[island_cluster[island]]
            if held > room:
                edges = 2 * (j - i)
                e = 0
                for k in range(i, j):
                    row = rows[k]
                    edge_key[e] = min(max((starts[row] - t0) // step, 0), slots) * 2 + 1
                    edge_cards[e] = cards[k]
                    edge_key[e + 1] = min(max(-((t0 - ends[row]) // step), 0), slots) * 2
                    edge_cards[e + 1] = -cards[k]
                    e += 2
                for x in range(1, edges):  # insertion sort: an island has a handful of rows
                    key = edge_key[x]
                    value = edge_cards[x]
                    y = x - 1
                    while y >= 0 and edge_key[y] > key:
                        edge_key[y + 1] = edge_key[y]
                        edge_cards[y + 1] = edge_cards[y]
                        y -= 1
                    edge_key[y + 1] = key
                    edge_cards[y + 1] = value
                level = 0
                for e in range(edges - 1):
                    level += edge_cards[e]
                    slot = edge_key[e] >> 1
                    next_slot = edge_key[e + 1] >> 1
                    if next_slot > slot and level > room:
                        a = max(slot - run + 1, 0)
                        b = min(next_slot, n_starts)
                        if a < b:
                            out_island[m] = island
                            out_a[m] = a
                            out_b[m] = b
                            m += 1
        if has_first:
            at = begin
            while at < m and out_a[at] == 0:
                at += 1
            for z in range(m, at, -1):
                out_island[z] = out_island[z - 1]
                out_a[z] = out_a[z - 1]
                out_b[z] = out_b[z - 1]
            out_island[at] = island
            out_a[at] = 0
            out_b[at] = 1
            m += 1
        # Full when the ranges, in order of a, reach n_starts with no gap: a gap stops the walk short
        # of it (the gap's range starts before n_starts).
        reach = 0
        for z in range(begin, m):
            if out_a[z] > reach:
                break
            reach = max(reach, out_b[z])
        if reach >= n_starts:
            full[n_full] = island
            n_full += 1
        i = j
    return out_island[:m], out_a[:m], out_b[:m], full[:n_full]


ROOM_MAX = 32_767  # island_room's largest room (int16)


@_compiled
def island_room(
    lookup: np.ndarray,
    island_cluster: np.ndarray,
    island_fabric: np.ndarray,
    capacity: np.ndarray,
    cluster_ok: np.ndarray,
    cluster_need: np.ndarray,
    fabric_ok: np.ndarray,
    island_ok: np.ndarray,
) -> np.ndarray:  # pragma: no cover - compiled
    """By island id, the cards a candidate island has beyond its cluster's need (``capacity − need``,
    ≥ 0, at most ROOM_MAX), and -1 for an island that is not a candidate or that the catalogue does not know
    (``lookup[id]`` is its catalogue position, -1 for none); one element more than ``lookup``, -1, which
    stands for every id past it. A candidate is on a cluster ``cluster_ok`` accepts, on a fabric
    ``fabric_ok`` accepts and among ``island_ok`` (each when not empty), with at least its cluster's need in
    cards: broker.matching.Candidates' test, made once per requirements for candidate_rows to read one
    number per hold.

    Two bytes per island id (a catalogue keeps up to 256 requirements, so at most ~50 MB at 100,000
    islands): a room above ROOM_MAX is written as ROOM_MAX, which only keeps the rows of an island that big
    when its holds leave its need free, and blocked_ranges, which counts the island's exact cards, finds
    nothing blocked there."""
    n = len(lookup)
    check_fabric = len(fabric_ok) > 0
    check_island = len(island_ok) > 0
    room = np.full(n + 1, -1, dtype=np.int16)
    for island_id in range(n):
        position = lookup[island_id]
        if position < 0:
            continue
        cluster = island_cluster[position]
        if not cluster_ok[cluster]:
            continue
        if check_fabric and not fabric_ok[island_fabric[position]]:
            continue
        if check_island and not island_ok[position]:
            continue
        spare = capacity[position] - cluster_need[cluster]
        if spare >= 0:
            room[island_id] = min(spare, ROOM_MAX)
    return room


@_compiled
def candidate_rows(
    hold_island: np.ndarray,
    hold_start: np.ndarray,
    hold_end: np.ndarray,
    hold_cards: np.ndarray,
    alive: np.ndarray,
    lo: int,
    hi: int,
    lookup: np.ndarray,
    room: np.ndarray,
    held: np.ndarray,
    reported: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:  # pragma: no cover - compiled
    """(index, cards, rows, ordered): the holds (``hold_island`` ids, ``hold_start``, ``hold_end``,
    ``hold_cards``) that are ``alive`` (aligned with them; empty: all), overlap ``[lo, hi)`` and are on
    candidate islands, in the holds' order: each one's catalogue position (``lookup[id]``), its cards, its
    row in the hold arrays, and whether the positions come out ascending (the hold book keeps its rows in
    island order but for the ones added since its last sort). The arrays may be the hold book's own
    (broker.catalog.HoldBook.rows): the quote's holds are selected here, in the same pass, without a copy
    of the rows in its window first (``overlapping_rows``, which the other paths still use).

    ``room`` (island_room: by island id, -1 past ``lookup``'s ids) says which islands are candidates (≥ 0)
    and the cards each has beyond its need. ``held`` (by island id; empty: none) bounds the cards an
    island's holds occupy at once (broker.catalog.HoldBook.held): an island whose ``held`` is within its
    room, not ``reported`` (by position; empty: none — a heartbeat report adds to the holds), cannot be
    blocked, and its rows are left out. blocked_ranges writes nothing for such an island when the window
    has a start (its rows' cards never pass the room): the same answer, from fewer rows.

    Three passes: the live rows in the window, then those on candidate islands their holds could block
    (one look-up of ``room`` and ``held`` per row, by id: the rows come in island order, so both are read
    almost in order), then the kept rows' positions. The first two write every row they read and move
    their output on only for the rows they keep: kept and dropped rows alternate in no order, and a
    mispredicted branch per row cost more than a pass."""
    n = len(hold_island)
    last = len(room) - 1  # room[last] is -1: the room of any id past the catalogue's
    n_held = len(held)
    check_alive = len(alive) > 0
    check_reported = len(reported) > 0
    window_rows = np.empty(n, dtype=np.int64)
    w = 0
    if check_alive:
        for i in range(n):
            window_rows[w] = i
            w += alive[i] & (hold_start[i] < hi) & (hold_end[i] > lo)
    else:
        for i in range(n):
            window_rows[w] = i
            w += (hold_start[i] < hi) & (hold_end[i] > lo)
    k = 0
    for x in range(w):
        i = window_rows[x]
        island_id = hold_island[i]
        j = island_id if (island_id >= 0) & (island_id < last) else last
        spare = room[j]
        # An island past ``held`` has no bound: its rows are kept, as a tight island's.
        occupied = held[j] if j < n_held else spare + 1
        tight = occupied > spare
        if check_reported and not tight and spare >= 0:  # a candidate: the catalogue knows it
            tight = reported[lookup[j]]
        window_rows[k] = i
        k += (spare >= 0) & tight
    index = np.empty(k, dtype=np.int64)
    cards = np.empty(k, dtype=np.int64)
    rows = np.empty(k, dtype=np.int64)
    ordered = True
    previous = -1
    for m in range(k):
        i = window_rows[m]
        position = lookup[hold_island[i]]
        index[m] = position
        cards[m] = hold_cards[i]
        rows[m] = i
        if position < previous:
            ordered = False
        previous = position
    return index, cards, rows, ordered


@_compiled
def overlapping_rows(
    island: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    cards: np.ndarray,
    alive: np.ndarray,
    n: int,
    lo: int,
    hi: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover - compiled
    """(island, start, end, cards) of the rows ``[0, n)`` that are ``alive`` and overlap ``[lo, hi)``, in
    row order: broker.catalog.HoldBook.overlapping, in one pass over the book.

    Every quote reads the whole book here. As numpy it was three passes for the mask, one for its indices
    and four gathers (~0.3 ms at 100,000 holds); here each row is read once and copied to the next free
    output row whether or not it is kept (kept: the output position moves on), so the loop has no branch
    to mispredict when kept and dropped rows alternate."""
    out_island = np.empty(n, dtype=np.int64)
    out_start = np.empty(n, dtype=np.int64)
    out_end = np.empty(n, dtype=np.int64)
    out_cards = np.empty(n, dtype=np.int64)
    m = 0
    for i in range(n):
        s = start[i]
        e = end[i]
        out_island[m] = island[i]
        out_start[m] = s
        out_end[m] = e
        out_cards[m] = cards[i]
        m += alive[i] & (s < hi) & (e > lo)
    return out_island[:m], out_start[:m], out_end[:m], out_cards[:m]


@_compiled
def smallest_entries(primary: np.ndarray, limit: int) -> np.ndarray:  # pragma: no cover - compiled
    """The positions (ascending) of the entries of ``primary`` not above its ``limit``-th smallest value
    (duplicates counted): ``np.nonzero(primary <= np.partition(primary, limit - 1)[limit - 1])[0]`` for
    ``1 <= limit <= len(primary)``, in two passes and without a copy of ``primary``.

    The first pass keeps the ``limit`` smallest values seen so far in a small sorted buffer (a value
    enters only when it is below the buffer's largest, which, over values in no particular order, is a
    few dozen times per quote); the second writes the positions. NaN is never kept, as np.partition sorts
    it last: with fewer than ``limit`` numbers the cut is NaN and no position is returned, as numpy's
    comparison with NaN returns none. The ranking of a quote's offers calls it over every cluster with
    candidates (thousands), where np.partition's copy and introselect took ~0.1 ms."""
    best = np.empty(limit, dtype=np.float64)
    filled = 0
    for i in range(len(primary)):
        value = primary[i]
        if value != value:  # NaN
            continue
        if filled < limit:
            at = filled
            filled += 1
        elif value < best[limit - 1]:
            at = limit - 1
        else:
            continue
        while at > 0 and best[at - 1] > value:
            best[at] = best[at - 1]
            at -= 1
        best[at] = value
    out = np.empty(len(primary), dtype=np.int64)
    m = 0
    if filled < limit:
        return out[:0]
    cut = best[limit - 1]
    for i in range(len(primary)):
        out[m] = i
        m += primary[i] <= cut
    return out[:m]


def warm() -> None:
    """Compile (or load from the cache) the kernel now, with the argument types the matcher passes (every
    array read-only, see ``_compiled``): tests/broker/test_catalog.py holds a quote's calls to these."""
    empty = np.zeros(0, dtype=np.int64)
    none = np.zeros(0, dtype=bool)
    blocked_ranges(empty, empty, empty, empty, empty, empty, empty, empty, empty, empty, 0, 1, 1, 1, 1)
    island_room(empty, empty, empty, empty, none, empty, none, none)
    candidate_rows(empty, empty, empty, empty, none, 0, 1, empty, np.full(1, -1, dtype=np.int16), empty, none)
    overlapping_rows(empty, empty, empty, empty, none, 0, 0, 1)
    smallest_entries(np.ones(1, dtype=np.float64), 1)
